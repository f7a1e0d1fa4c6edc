#!/usr/bin/env python3
"""Writes a DLRM of a dlrmc JSON description's shape as ONNX, in the form PyTorch's
TorchScript exporter writes the reference DLRM (`dlrm_s_pytorch.py`) with fixed
pooling (needs `onnx` and `numpy`; `onnxruntime` for the expected outputs).

usage: gen_dlrm.py MODEL.json OUT_DIR [--max-rows N] [--batch N] [--seed S]
                   [--top gemm|matmul] [--tril index|flat] [--label-input NAME]
                   [--no-ort]

- embeddings: `Gather(table, idx_t[B,L])` + `ReduceSum(axes=[1] as input, keepdims=0)`
  (opset 13), `idx_t` int64;
- bottom MLP: `Gemm(transB=1)` + `Relu` per layer; top MLP: `Gemm(transB=1)`
  (`--top gemm`) or `MatMul` by a pre-transposed initializer + `Add` of the bias
  (`--top matmul`, what the exporters write for `nn.Linear` outside the 2-D `addmm`
  path), `Relu`, the last layer `Sigmoid`;
- interaction (`dot` only): `T = Concat(x, bags).view(B, -1, d)` through the
  `Shape -> Gather -> Unsqueeze -> Concat -> Reshape` chain, `Z = MatMul(T,
  Transpose(T))`, then the lower triangle as `Z[:, li, lj]` (`--tril index`: the
  exporter's advanced indexing: Transpose, Flatten, Gather of the folded constant
  `li*F + lj`, Reshape, Transpose, Reshape) or `Flatten(Z)` + `Gather(axis=1)`
  (`--tril flat`), then `Concat(x, Zflat)`.

`--label-input NAME` adds a graph input `NAME` `[batch, 1]` that the prediction does
not use (the click label a model exported with its training inputs carries; `dlrmc
compile --label NAME` makes it the training graph's label).

Weights are random (uniform tables, scaled normal MLPs), tables capped at
`--max-rows` rows (default: the description's rows). Initializers go to
`weights.bin` beside the model when they exceed 1 GB. With onnxruntime and unless
`--no-ort`, OUT_DIR also gets `inputs.npz` (batch `--batch`) and ORT's `outputs.npz`.
"""
import argparse
import json
import os

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

F, I64 = TensorProto.FLOAT, TensorProto.INT64


def widths(v):
    return [int(x) for x in (v.split("-") if isinstance(v, str) else v)]


def build(spec, max_rows, seed, top_form, tril, label=None):
    if spec.get("interaction", "dot") != "dot":
        raise SystemExit("gen_dlrm.py writes the dot interaction only")
    rng = np.random.default_rng(seed)
    dim = spec["embedding_dim"]
    rows = [min(r, max_rows) if max_rows else r for r in spec["table_rows"]]
    pool = spec.get("pooling", 1)
    itself = spec.get("interaction_itself", False)
    bot = widths(spec["bottom_mlp"])
    nodes, inits = [], []
    inputs = [helper.make_tensor_value_info("dense_x", F, ["batch", bot[0]])]

    def init(name, arr):
        inits.append(numpy_helper.from_array(arr, name))
        return name

    def node(op, ins, outs, name, **attrs):
        nodes.append(helper.make_node(op, ins, outs, name=name, **attrs))
        return outs[0]

    def const(name, arr):
        return node("Constant", [], [name], name=f"/{name}/Constant",
                    value=numpy_helper.from_array(np.asarray(arr), name + "_v"))

    def layer(x, n_in, n_out, prefix, i, form, act):
        w = (rng.standard_normal((n_out, n_in)) * np.sqrt(2.0 / (n_in + n_out))).astype(np.float32)
        b = (rng.standard_normal(n_out) * np.sqrt(1.0 / n_out)).astype(np.float32)
        base = f"{prefix}.{i}"
        if form == "gemm":
            y = node("Gemm", [x, init(f"{base}.weight", w), init(f"{base}.bias", b)], [f"/{base}/Gemm_out"],
                     f"/{base}/Gemm", alpha=1.0, beta=1.0, transB=1)
        else:
            m = node("MatMul", [x, init(f"onnx::MatMul_{base}", np.ascontiguousarray(w.T))],
                     [f"/{base}/MatMul_out"], f"/{base}/MatMul")
            y = node("Add", [init(f"{base}.bias", b), m], [f"/{base}/Add_out"], f"/{base}/Add")
        return node(act, [y], [f"/{base}/{act}_out"], f"/{base}/{act}")

    x = "dense_x"
    for i in range(len(bot) - 1):
        x = layer(x, bot[i], bot[i + 1], "bot_l", i, "gemm", "Relu")
    if bot[-1] != dim:
        raise SystemExit("the bottom MLP must end at the embedding dimension")
    bags = []
    init("pool_axes", np.array([1], dtype=np.int64))
    for t, r in enumerate(rows):
        inputs.append(helper.make_tensor_value_info(f"idx_{t}", I64, ["batch", pool]))
        tbl = init(f"emb_l.{t}.weight", rng.uniform(-np.sqrt(1 / r), np.sqrt(1 / r), (r, dim)).astype(np.float32))
        g = node("Gather", [tbl, f"idx_{t}"], [f"/emb_l.{t}/Gather_out"], f"/emb_l.{t}/Gather", axis=0)
        bags.append(node("ReduceSum", [g, "pool_axes"], [f"/emb_l.{t}/ReduceSum_out"], f"/emb_l.{t}/ReduceSum",
                         keepdims=0))
    f = 1 + len(bags)
    # T = cat([x] + ly, dim=1).view((batch_size, -1, d))
    cat = node("Concat", [x] + bags, ["/Concat_out"], "/Concat", axis=1)
    shape = node("Shape", [x], ["/Shape_out"], "/Shape")
    c0 = const("c0", np.array(0, dtype=np.int64))
    bsz = node("Gather", [shape, c0], ["/Gather_out"], "/Gather", axis=0)
    init("unsq_axes", np.array([0], dtype=np.int64))
    bsz1 = node("Unsqueeze", [bsz, "unsq_axes"], ["/Unsqueeze_out"], "/Unsqueeze")
    rest = const("rest", np.array([-1, dim], dtype=np.int64))
    tshape = node("Concat", [bsz1, rest], ["/Concat_1_out"], "/Concat_1", axis=0)
    T = node("Reshape", [cat, tshape], ["/Reshape_out"], "/Reshape")
    Tt = node("Transpose", [T], ["/Transpose_out"], "/Transpose", perm=[0, 2, 1])
    Z = node("MatMul", [T, Tt], ["/MatMul_out"], "/MatMul")
    off = 1 if itself else 0
    li = [i for i in range(f) for j in range(i + off)]
    lj = [j for i in range(f) for j in range(i + off)]
    flat = np.array([i * f + j for i, j in zip(li, lj)], dtype=np.int64)
    if tril == "flat":
        zf = node("Flatten", [Z], ["/Flatten_out"], "/Flatten", axis=1)
        zflat = node("Gather", [zf, init("tril_idx", flat)], ["/Gather_1_out"], "/Gather_1", axis=1)
    else:
        # torch.onnx's `index` with two advanced indices, constants folded.
        zshape = node("Shape", [Z], ["/Shape_1_out"], "/Shape_1")
        d0 = node("Gather", [zshape, const("c0b", np.array([0], dtype=np.int64))], ["/Gather_2_out"], "/Gather_2",
                  axis=0)
        zp = node("Transpose", [Z], ["/Transpose_1_out"], "/Transpose_1", perm=[1, 2, 0])
        zf = node("Flatten", [zp], ["/Flatten_out"], "/Flatten", axis=2)
        g = node("Gather", [zf, init("onnx::Gather_tril", flat)], ["/Gather_3_out"], "/Gather_3", axis=0)
        s1 = node("Concat", [const("m1", np.array([-1], dtype=np.int64)), d0], ["/Concat_2_out"], "/Concat_2", axis=0)
        g = node("Reshape", [g, s1], ["/Reshape_1_out"], "/Reshape_1")
        g = node("Transpose", [g], ["/Transpose_2_out"], "/Transpose_2", perm=[1, 0])
        s2 = node("Concat", [d0, const("np_", np.array([len(li)], dtype=np.int64))], ["/Concat_3_out"], "/Concat_3",
                  axis=0)
        zflat = node("Reshape", [g, s2], ["/Reshape_2_out"], "/Reshape_2")
    x = node("Concat", [x, zflat], ["/Concat_4_out"], "/Concat_4", axis=1)
    top = [dim + len(li)] + widths(spec["top_mlp"])
    for i in range(len(top) - 1):
        last = i == len(top) - 2
        x = layer(x, top[i], top[i + 1], "top_l", i, top_form, "Sigmoid" if last else "Relu")
    node("Identity", [x], ["prob"], "/Identity")
    if label:
        inputs.append(helper.make_tensor_value_info(label, F, ["batch", 1]))
    outputs = [helper.make_tensor_value_info("prob", F, ["batch", 1])]
    g = helper.make_graph(nodes, spec.get("name", "dlrm").replace("-", "_"), inputs, outputs, inits)
    m = helper.make_model(g, opset_imports=[helper.make_opsetid("", 13)], producer_name="pytorch",
                          producer_version="2.x (dlrmc gen_dlrm.py)")
    m.ir_version = 8
    return m, rows, pool, bot[0]


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("json")
    ap.add_argument("out")
    ap.add_argument("--max-rows", type=int, default=0)
    ap.add_argument("--batch", type=int, default=8)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--top", choices=["gemm", "matmul"], default="gemm")
    ap.add_argument("--tril", choices=["index", "flat"], default="index")
    ap.add_argument("--label-input", default=None)
    ap.add_argument("--no-ort", action="store_true")
    a = ap.parse_args(argv)
    with open(a.json) as fh:
        spec = json.load(fh)
    model, rows, pool, dense = build(spec, a.max_rows, a.seed, a.top, a.tril, a.label_input)
    os.makedirs(a.out, exist_ok=True)
    path = os.path.join(a.out, "model.onnx")
    big = sum(t.ByteSize() for t in model.graph.initializer) > (1 << 30)
    if big:
        onnx.save_model(model, path, save_as_external_data=True, all_tensors_to_one_file=True,
                        location="weights.bin", size_threshold=1024)
        onnx.checker.check_model(path)
    else:
        onnx.checker.check_model(model)
        onnx.save_model(model, path)
    if a.no_ort:
        return
    try:
        import onnxruntime as ort
    except ImportError:
        return
    rng = np.random.default_rng(a.seed + 1)
    inputs = {"dense_x": rng.standard_normal((a.batch, dense)).astype(np.float32)}
    for t, r in enumerate(rows):
        inputs[f"idx_{t}"] = rng.integers(0, r, (a.batch, pool)).astype(np.int64)
    if a.label_input:
        inputs[a.label_input] = (rng.random((a.batch, 1)) < 0.25).astype(np.float32)
    np.savez(os.path.join(a.out, "inputs.npz"), **inputs)
    sess = ort.InferenceSession(path, providers=["CPUExecutionProvider"])
    outs = sess.run(None, inputs)
    names = [o.name for o in sess.get_outputs()]
    np.savez(os.path.join(a.out, "outputs.npz"), **dict(zip(names, outs)))


if __name__ == "__main__":
    main()
