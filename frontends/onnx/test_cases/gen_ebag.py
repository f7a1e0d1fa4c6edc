"""EmbeddingBag-with-offsets test cases (imported by generate.py; see its docstring).

The two Loop structures follow what PyTorch's exporters write for `nn.EmbeddingBag`
with offsets: the TorchScript exporter (opset 11 here) and the dynamo exporter
(opset 18 here). Offsets include empty bags. `dlrm_weighted` puts a Gemm + Sigmoid
on the TorchScript weighted bag (a model that trains).
"""
import numpy as np
from onnx import TensorProto, helper, numpy_helper

F, I64, B = TensorProto.FLOAT, TensorProto.INT64, TensorProto.BOOL
ROWS, DIM = 12, 3


def const(name, arr):
    return helper.make_node("Constant", [], [name], value=numpy_helper.from_array(np.asarray(arr), name + "_v"))


def io(weighted):
    ins = [helper.make_tensor_value_info("indices", I64, ["num_indices"]),
           helper.make_tensor_value_info("offsets", I64, ["batch"])]
    if weighted:
        ins.append(helper.make_tensor_value_info("per_sample_weights", F, ["num_indices"]))
    outs = [helper.make_tensor_value_info("bags", F, ["batch", DIM])]
    return ins, outs


def table(seed):
    rng = np.random.default_rng(seed)
    return numpy_helper.from_array(rng.uniform(-1, 1, (ROWS, DIM)).astype(np.float32), "embedding.weight")


def torchscript(weighted, mode="ReduceSum"):
    """Loop over bags: Gather(offsets) -> Slice(indices) -> Gather(table) -> [Mul] -> Reduce."""
    ins, outs = io(weighted)
    nodes = [
        helper.make_node("Shape", ["indices"], ["ind_shape"], name="/Shape"),
        const("zero", np.array(0, dtype=np.int64)),
        helper.make_node("Gather", ["ind_shape", "zero"], ["ind_len"], name="/Gather", axis=0),
        helper.make_node("Unsqueeze", ["ind_len"], ["ind_len1"], name="/Unsqueeze", axes=[0]),
        helper.make_node("Concat", ["offsets", "ind_len1"], ["offsets_ext"], name="/Concat", axis=0),
        const("s0", np.array([0], dtype=np.int64)), const("em1", np.array([-1], dtype=np.int64)),
        const("s1", np.array([1], dtype=np.int64)), const("big", np.array([2**62], dtype=np.int64)),
        const("ax0", np.array([0], dtype=np.int64)),
        helper.make_node("Slice", ["offsets_ext", "s0", "em1", "ax0"], ["offsets_starts"], name="/Slice"),
        helper.make_node("Slice", ["offsets_ext", "s1", "big", "ax0"], ["offsets_ends"], name="/Slice_1"),
        helper.make_node("Shape", ["offsets_ends"], ["oe_shape"], name="/Shape_1"),
        helper.make_node("Gather", ["oe_shape", "zero"], ["loop_len"], name="/Gather_1", axis=0),
        const("cond", np.array(True)),
    ]
    body = [
        helper.make_node("Gather", ["offsets_starts", "i"], ["start"], name="/loop/Gather", axis=0),
        helper.make_node("Gather", ["offsets_ends", "i"], ["end"], name="/loop/Gather_1", axis=0),
        helper.make_node("Unsqueeze", ["start"], ["start1"], name="/loop/Unsqueeze", axes=[0]),
        helper.make_node("Unsqueeze", ["end"], ["end1"], name="/loop/Unsqueeze_1", axes=[0]),
        helper.make_node("Slice", ["indices", "start1", "end1", "ax0"], ["indices_row"], name="/loop/Slice"),
        helper.make_node("Gather", ["embedding.weight", "indices_row"], ["emb"], name="/loop/Gather_2", axis=0),
    ]
    last = "emb"
    if weighted:
        body += [
            helper.make_node("Slice", ["per_sample_weights", "start1", "end1", "ax0"], ["psw_row"], name="/loop/Slice_1"),
            helper.make_node("Unsqueeze", ["psw_row"], ["psw_row1"], name="/loop/Unsqueeze_2", axes=[1]),
            helper.make_node("Mul", ["emb", "psw_row1"], ["emb_w"], name="/loop/Mul"),
        ]
        last = "emb_w"
    body += [
        helper.make_node(mode, [last], ["pooled"], name=f"/loop/{mode}", axes=[0], keepdims=0),
        helper.make_node("Identity", ["cond_in"], ["cond_out"], name="/loop/Identity"),
    ]
    bg = helper.make_graph(body, "loop_body",
                           [helper.make_tensor_value_info("i", I64, []), helper.make_tensor_value_info("cond_in", B, [])],
                           [helper.make_tensor_value_info("cond_out", B, []),
                            helper.make_tensor_value_info("pooled", F, [DIM])])
    nodes.append(helper.make_node("Loop", ["loop_len", "cond"], ["bags"], name="/EmbeddingBag/Loop", body=bg))
    g = helper.make_graph(nodes, "ebag_ts", ins, outs, [table(1)])
    m = helper.make_model(g, opset_imports=[helper.make_opsetid("", 11)], producer_name="pytorch-like")
    m.ir_version = 7
    return m


def dynamo(weighted, mode="ReduceSum", order=(1, 0, 2)):
    """Rows gathered first, then a Loop carrying a sequence, If for empty bags."""
    ins, outs = io(weighted)
    nodes = [
        helper.make_node("Gather", ["embedding.weight", "indices"], ["rows0"], name="/emb/Gather", axis=0),
    ]
    rows = "rows0"
    if weighted:
        nodes += [const("ax1", np.array([1], dtype=np.int64)),
                  helper.make_node("Unsqueeze", ["per_sample_weights", "ax1"], ["psw1"], name="/emb/Unsqueeze"),
                  helper.make_node("Mul", ["psw1", "rows0"], ["rows_w"], name="/emb/Mul")]
        rows = "rows_w"
    nodes += [
        helper.make_node("Shape", ["indices"], ["ind_len1"], name="/emb/Shape"),
        helper.make_node("Concat", ["offsets", "ind_len1"], ["offsets_ext"], name="/emb/Concat", axis=0),
        helper.make_node("Shape", ["offsets"], ["nb1"], name="/emb/Shape_1"),
        helper.make_node("Squeeze", ["nb1"], ["num_bags"], name="/emb/Squeeze"),
        const("cond", np.array(True)),
        helper.make_node("SequenceEmpty", [], ["seq0"], name="/emb/SequenceEmpty", dtype=F),
    ]
    # Loop-carried values: (sequence, rows, offsets_ext) permuted by `order`.
    carried = ["seq", "rows", "offx"]
    outer = {"seq": "seq0", "rows": rows, "offx": "offsets_ext"}
    carried = [carried[k] for k in order]
    body = [
        const("one", np.array(1, dtype=np.int64)),
        const("ax0", np.array([0], dtype=np.int64)),
        helper.make_node("Add", ["i", "one"], ["i1"], name="/loop/Add"),
        helper.make_node("Gather", ["offx_in", "i"], ["start"], name="/loop/Gather", axis=0),
        helper.make_node("Gather", ["offx_in", "i1"], ["end"], name="/loop/Gather_1", axis=0),
        helper.make_node("Sub", ["end", "start"], ["size"], name="/loop/Sub"),
        const("zero", np.array(0, dtype=np.int64)),
        helper.make_node("Equal", ["size", "zero"], ["is_empty"], name="/loop/Equal"),
    ]
    then_g = helper.make_graph(
        [const("zeros", np.zeros((1, DIM), dtype=np.float32))], "then",
        [], [helper.make_tensor_value_info("zeros", F, [1, DIM])])
    else_g = helper.make_graph([
        helper.make_node("Unsqueeze", ["start", "ax0"], ["start1"], name="/loop/else/Unsqueeze"),
        helper.make_node("Unsqueeze", ["end", "ax0"], ["end1"], name="/loop/else/Unsqueeze_1"),
        helper.make_node("Slice", ["rows_in", "start1", "end1", "ax0"], ["bag_rows"], name="/loop/else/Slice"),
        helper.make_node(mode, ["bag_rows", "ax0"], ["pooled"], name=f"/loop/else/{mode}", keepdims=1),
    ], "else", [], [helper.make_tensor_value_info("pooled", F, [1, DIM])])
    body += [
        helper.make_node("If", ["is_empty"], ["bag"], name="/loop/If", then_branch=then_g, else_branch=else_g),
        helper.make_node("SequenceInsert", ["seq_in", "bag"], ["seq_out"], name="/loop/SequenceInsert"),
        helper.make_node("Identity", ["rows_in"], ["rows_out"], name="/loop/Identity"),
        helper.make_node("Identity", ["offx_in"], ["offx_out"], name="/loop/Identity_1"),
        helper.make_node("Identity", ["cond_in"], ["cond_out"], name="/loop/Identity_2"),
    ]
    tys = {"seq": helper.make_tensor_sequence_value_info, "rows": None, "offx": None}

    def vi(c, suffix):
        n = f"{c}_{suffix}"
        if c == "seq":
            return helper.make_tensor_sequence_value_info(n, F, None)
        if c == "rows":
            return helper.make_tensor_value_info(n, F, ["num_indices", DIM])
        return helper.make_tensor_value_info(n, I64, [None])

    bg = helper.make_graph(
        body, "loop_body",
        [helper.make_tensor_value_info("i", I64, []), helper.make_tensor_value_info("cond_in", B, [])]
        + [vi(c, "in") for c in carried],
        [helper.make_tensor_value_info("cond_out", B, [])] + [vi(c, "out") for c in carried])
    loop_outs = [f"final_{c}" for c in carried]
    nodes.append(helper.make_node("Loop", ["num_bags", "cond"] + [outer[c] for c in carried], loop_outs,
                                  name="/emb/Loop", body=bg))
    nodes.append(helper.make_node("ConcatFromSequence", ["final_seq"], ["bags"], name="/emb/ConcatFromSequence", axis=0))
    g = helper.make_graph(nodes, "ebag_dynamo", ins, outs, [table(2)])
    m = helper.make_model(g, opset_imports=[helper.make_opsetid("", 18)], producer_name="pytorch-dynamo-like")
    m.ir_version = 8
    return m


def weighted_dlrm():
    """A trainable model on the TorchScript weighted bag: `prob = sigmoid(Gemm(bags))`."""
    m = torchscript(True)
    g = m.graph
    rng = np.random.default_rng(15)
    g.initializer.extend([
        numpy_helper.from_array(rng.uniform(-1, 1, (1, DIM)).astype(np.float32), "top.weight"),
        numpy_helper.from_array(np.array([0.1], dtype=np.float32), "top.bias"),
    ])
    g.node.extend([
        helper.make_node("Gemm", ["bags", "top.weight", "top.bias"], ["logit"], name="/top/Gemm", transB=1),
        helper.make_node("Sigmoid", ["logit"], ["prob"], name="/top/Sigmoid"),
    ])
    del g.output[:]
    g.output.append(helper.make_tensor_value_info("prob", F, ["batch", 1]))
    g.name = "dlrm_weighted"
    return m


def inputs(weighted, seed):
    rng = np.random.default_rng(seed)
    offsets = np.array([0, 2, 2, 5, 5, 6], dtype=np.int64)  # bags 1 and 3 are empty
    d = {"indices": rng.integers(0, ROWS, 8).astype(np.int64), "offsets": offsets}
    if weighted:
        d["per_sample_weights"] = rng.uniform(0.1, 2.0, 8).astype(np.float32)
    return d


def main(save):
    save("ebag_torchscript", torchscript(False), inputs(False, 10))
    save("ebag_torchscript_weighted", torchscript(True), inputs(True, 11))
    save("ebag_dynamo", dynamo(False, "ReduceMean", order=(1, 0, 2)), inputs(False, 12))
    save("ebag_dynamo_weighted", dynamo(True, "ReduceSum", order=(2, 1, 0)), inputs(True, 13))
    save("dlrm_weighted", weighted_dlrm(), inputs(True, 14))
    if_const(save)
    bad_models(save)


def if_const(save):
    """An `If` whose condition is a constant: the importer inlines the taken branch."""
    x = helper.make_tensor_value_info("x", F, ["batch", 2])
    y = helper.make_tensor_value_info("y", F, ["batch", 2])
    then_g = helper.make_graph([helper.make_node("Relu", ["x"], ["t"], name="/then/Relu")], "then", [],
                               [helper.make_tensor_value_info("t", F, ["batch", 2])])
    else_g = helper.make_graph([helper.make_node("Sigmoid", ["x"], ["e"], name="/else/Sigmoid")], "else", [],
                               [helper.make_tensor_value_info("e", F, ["batch", 2])])
    nodes = [const("c", np.array(False)),
             helper.make_node("If", ["c"], ["y"], name="/If", then_branch=then_g, else_branch=else_g)]
    g = helper.make_graph(nodes, "if_const", [x], [y])
    m = helper.make_model(g, opset_imports=[helper.make_opsetid("", 13)], producer_name="dlrmc-testgen")
    m.ir_version = 8
    rng = np.random.default_rng(20)
    save("if_const", m, {"x": rng.standard_normal((3, 2)).astype(np.float32)})


def bad_models(save):
    """Models the importer must reject with the node named: float indices (dtype) and
    a MatMul of mismatched shapes."""
    x = helper.make_tensor_value_info("x", F, ["batch", 3])
    y = helper.make_tensor_value_info("y", F, ["batch", 2])
    w = numpy_helper.from_array(np.ones((4, 2), dtype=np.float32), "w")
    g = helper.make_graph([helper.make_node("MatMul", ["x", "w"], ["y"], name="/mm/MatMul")], "bad_shape", [x], [y], [w])
    m = helper.make_model(g, opset_imports=[helper.make_opsetid("", 13)], producer_name="dlrmc-testgen")
    m.ir_version = 8
    save("shape_mismatch", m, {"x": np.zeros((2, 3), dtype=np.float32)}, run=False)
    idx = helper.make_tensor_value_info("idx", F, ["batch", 2])
    out = helper.make_tensor_value_info("rows", F, ["batch", 2, 2])
    t = numpy_helper.from_array(np.ones((5, 2), dtype=np.float32), "table")
    g = helper.make_graph([helper.make_node("Gather", ["table", "idx"], ["rows"], name="/emb/Gather")], "bad_dtype", [idx], [out], [t])
    m = helper.make_model(g, opset_imports=[helper.make_opsetid("", 13)], producer_name="dlrmc-testgen")
    m.ir_version = 8
    save("float_indices", m, {"idx": np.zeros((2, 2), dtype=np.float32)}, run=False)
