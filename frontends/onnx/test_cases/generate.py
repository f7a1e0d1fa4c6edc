#!/usr/bin/env python3
"""Generates the ONNX test cases of dlrm-onnx (run from anywhere; needs `onnx`,
`onnxruntime`, `numpy`; deterministic seeds).

Each case is a folder `<name>/` with `model.onnx` (and side files), `inputs.npz`
(arrays named after the graph inputs) and `outputs.npz` (named after the graph
outputs, computed by ONNX Runtime here). The models are small DLRMs written with
`onnx.helper` in the structure PyTorch's exporters produce (PyTorch is not needed):

- dlrm_dot: opset 13, fixed pooling (Gather + ReduceSum with axes as input), dot
  interaction through the Shape -> Gather -> Unsqueeze -> Concat -> Reshape chain,
  Gemm(transB=1) MLPs, int64 indices, raw_data initializers, batch `batch_size`;
- dlrm_cat: opset 11, cat interaction, ReduceMean with the axes attribute, int32
  indices, initializers in typed fields (float_data);
- dynamic_batch: the dot model with an unnamed dynamic batch dimension, batch 7;
- external_data: the dot model with every initializer in `weights.bin`;
- ebag_torchscript[_weighted]: EmbeddingBag with offsets as the TorchScript
  exporter writes it (Loop over bags: Gather(offsets) -> Slice(indices) ->
  Gather(table) -> [Mul by per-sample weights] -> ReduceSum), with empty bags;
- ebag_dynamo[_weighted]: the dynamo exporter's form (rows gathered first, a Loop
  carrying a sequence, If yielding zeros for an empty bag, SequenceInsert,
  ConcatFromSequence), loop-carried values in a shuffled order, with empty bags;
- dlrm_slice, dlrm_slice_self, dlrm_gather_nd, dlrm_gather_nd_self,
  dlrm_tril_order: the dot model with the lower triangle of Z taken by Slice or
  GatherND, with and without the diagonal, and (dlrm_tril_order) in an order
  that is not the interaction's (see `gen_tril.py`);
- dlrm_weighted: Gemm + Sigmoid on the TorchScript weighted bag (trains);
- unsupported_op: a model using `Erf` (the importer must name the node);
- dlrm_pytorch: `gen_dlrm.py` on the JSON twin `dlrm_pytorch/model.json`: the
  reference DLRM as the TorchScript exporter writes it (Gemm bottom MLP, MatMul +
  Add top MLP, Gather + ReduceSum bags with pooling 2, `Z[:, li, lj]` advanced
  indexing), with an unused `click` label input.
"""
import os
import shutil
import numpy as np
import onnx
import onnxruntime as ort
from onnx import TensorProto, helper, numpy_helper

HERE = os.path.dirname(os.path.abspath(__file__))
F, I64, I32 = TensorProto.FLOAT, TensorProto.INT64, TensorProto.INT32


def init(name, arr, typed=False):
    if typed:
        t = helper.make_tensor(name, helper.np_dtype_to_tensor_dtype(arr.dtype), arr.shape, arr.flatten().tolist())
        return t
    return numpy_helper.from_array(arr, name)


def save(name, model, inputs, external=False, run=True):
    d = os.path.join(HERE, name)
    shutil.rmtree(d, ignore_errors=True)
    os.makedirs(d)
    onnx.checker.check_model(model)
    path = os.path.join(d, "model.onnx")
    if external:
        onnx.save_model(model, path, save_as_external_data=True, all_tensors_to_one_file=True,
                        location="weights.bin", size_threshold=64)
    else:
        onnx.save_model(model, path)
    np.savez(os.path.join(d, "inputs.npz"), **inputs)
    if run:
        sess = ort.InferenceSession(path, providers=["CPUExecutionProvider"])
        outs = sess.run(None, inputs)
        names = [o.name for o in sess.get_outputs()]
        np.savez(os.path.join(d, "outputs.npz"), **dict(zip(names, outs)))


def mlp(nodes, inits, x, widths, prefix, rng, last_sigmoid=False, typed=False):
    for i in range(len(widths) - 1):
        w = (rng.standard_normal((widths[i + 1], widths[i])) * np.sqrt(2 / (widths[i] + widths[i + 1]))).astype(np.float32)
        b = (rng.standard_normal(widths[i + 1]) * 0.1).astype(np.float32)
        inits += [init(f"{prefix}.{i}.weight", w, typed), init(f"{prefix}.{i}.bias", b, typed)]
        y = f"{prefix}_gemm_{i}"
        nodes.append(helper.make_node("Gemm", [x, f"{prefix}.{i}.weight", f"{prefix}.{i}.bias"], [y],
                                      name=f"/{prefix}/Gemm_{i}", alpha=1.0, beta=1.0, transB=1))
        act = "Sigmoid" if (last_sigmoid and i == len(widths) - 2) else "Relu"
        z = f"{prefix}_act_{i}"
        nodes.append(helper.make_node(act, [y], [z], name=f"/{prefix}/{act}_{i}"))
        x = z
    return x


def dlrm(kind, opset, idx_type, batch_dim, typed=False, seed=0, pooling=(2, 3, 1), rows=(20, 15, 30),
         dim=4, dense=5, top=(8, 1), mean=False, unsupported=False, tril=None):
    rng = np.random.default_rng(seed)
    nodes, inits = [], []
    inputs = [helper.make_tensor_value_info("dense", F, [batch_dim, dense])]
    ly = []
    for t, (r, l) in enumerate(zip(rows, pooling)):
        inputs.append(helper.make_tensor_value_info(f"idx_{t}", idx_type, [batch_dim, l]))
        inits.append(init(f"emb.{t}.weight", rng.uniform(-0.5, 0.5, (r, dim)).astype(np.float32), typed))
        g = f"emb_{t}_rows"
        nodes.append(helper.make_node("Gather", [f"emb.{t}.weight", f"idx_{t}"], [g], name=f"/emb.{t}/Gather"))
        op = "ReduceMean" if mean else "ReduceSum"
        if opset >= 13 and op == "ReduceSum":
            inits.append(init(f"axes_pool_{t}", np.array([1], dtype=np.int64)))
            nodes.append(helper.make_node(op, [g, f"axes_pool_{t}"], [f"bag_{t}"], name=f"/emb.{t}/{op}", keepdims=0))
        else:
            nodes.append(helper.make_node(op, [g], [f"bag_{t}"], name=f"/emb.{t}/{op}", axes=[1], keepdims=0))
        ly.append(f"bag_{t}")
    x = mlp(nodes, inits, "dense", [dense, 8, dim], "bot", rng, typed=typed)
    if unsupported:
        nodes.append(helper.make_node("Erf", [x], ["x_erf"], name="/bot/Erf"))
        x = "x_erf"
    fcount = 1 + len(ly)
    if kind == "dot":
        nodes.append(helper.make_node("Concat", [x] + ly, ["T_flat"], name="/inter/Concat", axis=1))
        nodes.append(helper.make_node("Shape", [x], ["x_shape"], name="/inter/Shape"))
        nodes.append(helper.make_node("Constant", [], ["c0"], name="/inter/Constant", value=numpy_helper.from_array(np.array(0, dtype=np.int64))))
        nodes.append(helper.make_node("Gather", ["x_shape", "c0"], ["bsz"], name="/inter/Gather", axis=0))
        if opset >= 13:
            inits.append(init("unsq_axes", np.array([0], dtype=np.int64)))
            nodes.append(helper.make_node("Unsqueeze", ["bsz", "unsq_axes"], ["bsz1"], name="/inter/Unsqueeze"))
        else:
            nodes.append(helper.make_node("Unsqueeze", ["bsz"], ["bsz1"], name="/inter/Unsqueeze", axes=[0]))
        inits.append(init("rest_shape", np.array([-1, dim], dtype=np.int64)))
        nodes.append(helper.make_node("Concat", ["bsz1", "rest_shape"], ["T_shape"], name="/inter/Concat_1", axis=0))
        nodes.append(helper.make_node("Reshape", ["T_flat", "T_shape"], ["T"], name="/inter/Reshape"))
        nodes.append(helper.make_node("Transpose", ["T"], ["Tt"], name="/inter/Transpose", perm=[0, 2, 1]))
        nodes.append(helper.make_node("MatMul", ["T", "Tt"], ["Z"], name="/inter/MatMul"))
        if tril is None:
            nodes.append(helper.make_node("Flatten", ["Z"], ["Zf"], name="/inter/Flatten", axis=1))
            li = [i * fcount + j for i in range(fcount) for j in range(i)]
            inits.append(init("tri_idx", np.array(li, dtype=np.int64)))
            nodes.append(helper.make_node("Gather", ["Zf", "tri_idx"], ["Zflat"], name="/inter/Gather_1", axis=1))
            pairs = len(li)
        else:
            pairs = tril(nodes, inits, "Z", "Zflat", fcount)
        nodes.append(helper.make_node("Concat", [x, "Zflat"], ["R"], name="/inter/Concat_2", axis=1))
        width = dim + pairs
    else:
        nodes.append(helper.make_node("Concat", [x] + ly, ["R"], name="/inter/Concat", axis=1))
        width = dim * fcount
    out = mlp(nodes, inits, "R", [width] + list(top), "top", rng, last_sigmoid=True, typed=typed)
    nodes.append(helper.make_node("Identity", [out], ["prob"], name="/Identity"))
    outputs = [helper.make_tensor_value_info("prob", F, [batch_dim, 1])]
    g = helper.make_graph(nodes, f"dlrm_{kind}", inputs, outputs, inits)
    m = helper.make_model(g, opset_imports=[helper.make_opsetid("", opset)], producer_name="dlrmc-testgen")
    m.ir_version = 8
    return m


def dlrm_inputs(batch, idx_dtype, seed=1, pooling=(2, 3, 1), rows=(20, 15, 30), dense=5):
    rng = np.random.default_rng(seed)
    d = {"dense": rng.standard_normal((batch, dense)).astype(np.float32)}
    for t, (r, l) in enumerate(zip(rows, pooling)):
        d[f"idx_{t}"] = rng.integers(0, r, (batch, l)).astype(idx_dtype)
    return d


def main():
    save("dlrm_dot", dlrm("dot", 13, I64, "batch_size"), dlrm_inputs(5, np.int64))
    save("dlrm_cat", dlrm("cat", 11, I32, "N", typed=True, mean=True, seed=3), dlrm_inputs(6, np.int32, seed=4))
    save("dynamic_batch", dlrm("dot", 13, I64, None, seed=5), dlrm_inputs(7, np.int64, seed=6))
    save("external_data", dlrm("dot", 13, I64, "batch", seed=7), dlrm_inputs(4, np.int64, seed=8), external=True)
    save("unsupported_op", dlrm("dot", 13, I64, "batch", unsupported=True), dlrm_inputs(2, np.int64), run=False)
    import gen_ebag
    gen_ebag.main(save)
    import gen_tril
    gen_tril.main(save, dlrm, dlrm_inputs)
    import gen_dlrm
    twin = os.path.join(HERE, "dlrm_pytorch")
    gen_dlrm.main([os.path.join(twin, "model.json"), twin, "--top", "matmul", "--tril", "index",
                   "--batch", "6", "--label-input", "click"])


if __name__ == "__main__":
    main()
