#!/usr/bin/env python3
"""The dot-interaction DLRMs of `generate.py` with the lower triangle of
`Z = T @ T^T` (`[B,F,F]`) taken in other forms than the flat Gather (called from
`generate.py`, which saves each case with ONNX Runtime's outputs):

- dlrm_slice: one Slice per row `Z[:, i:i+1, 0:i]` (opset 13: bounds and axes as
  inputs), Squeeze of axis 1, Concat along axis 1 (no diagonal);
- dlrm_slice_self: rows `Z[:, i:i+1, 0:i+1]` (with the diagonal) concatenated
  along axis 2, then Reshape to `[B, P]` (the batch read by Shape);
- dlrm_gather_nd: `Transpose(Z, [1,2,0])` -> GatherND by the pairs `[[i,j], ..]`
  (j < i, row-major) -> Transpose back (no diagonal);
- dlrm_gather_nd_self: the same with the diagonal (j <= i);
- dlrm_tril_order: GatherND by the lower-triangle pairs in column-major order
  (j outer): not the interaction's order, so the model must stay generic.
"""
import numpy as np
from onnx import TensorProto, helper, numpy_helper


def const(inits, name, vals):
    inits.append(numpy_helper.from_array(np.array(vals, dtype=np.int64), name))
    return name


def pairs_of(f, diag, column_major=False):
    if column_major:
        return [(i, j) for j in range(f) for i in range(j + (0 if diag else 1), f)]
    return [(i, j) for i in range(f) for j in range(i + (1 if diag else 0))]


def slices_squeeze(nodes, inits, z, out, f):
    parts = []
    ax = const(inits, "sl_axes", [1, 2])
    sq = const(inits, "sq_axes", [1])
    for i in range(1, f):
        s = const(inits, f"sl_start_{i}", [i, 0])
        e = const(inits, f"sl_end_{i}", [i + 1, i])
        nodes.append(helper.make_node("Slice", [z, s, e, ax], [f"Zrow_{i}"], name=f"/inter/Slice_{i}"))
        nodes.append(helper.make_node("Squeeze", [f"Zrow_{i}", sq], [f"Zsq_{i}"], name=f"/inter/Squeeze_{i}"))
        parts.append(f"Zsq_{i}")
    nodes.append(helper.make_node("Concat", parts, [out], name="/inter/Concat_tril", axis=1))
    return f * (f - 1) // 2


def slices_self_cat2(nodes, inits, z, out, f):
    parts = []
    for i in range(f):
        s = const(inits, f"sl_start_{i}", [i, 0])
        e = const(inits, f"sl_end_{i}", [i + 1, i + 1])
        ax = const(inits, f"sl_axes_{i}", [1, 2])
        st = const(inits, f"sl_steps_{i}", [1, 1])
        nodes.append(helper.make_node("Slice", [z, s, e, ax, st], [f"Zrow_{i}"], name=f"/inter/Slice_{i}"))
        parts.append(f"Zrow_{i}")
    nodes.append(helper.make_node("Concat", parts, ["Zrows"], name="/inter/Concat_rows", axis=2))
    p = f * (f + 1) // 2
    nodes.append(helper.make_node("Shape", [z], ["Z_shape"], name="/inter/Shape_Z"))
    nodes.append(helper.make_node("Slice", ["Z_shape", const(inits, "b0", [0]), const(inits, "b1", [1])],
                                  ["Z_b"], name="/inter/Slice_b"))
    nodes.append(helper.make_node("Concat", ["Z_b", const(inits, "tri_width", [p])], ["tri_shape"],
                                  name="/inter/Concat_shape", axis=0))
    nodes.append(helper.make_node("Reshape", ["Zrows", "tri_shape"], [out], name="/inter/Reshape_tril"))
    return p


def gather_nd(diag, column_major=False):
    def build(nodes, inits, z, out, f):
        pairs = pairs_of(f, diag, column_major)
        const(inits, "tri_pairs", pairs)
        nodes.append(helper.make_node("Transpose", [z], ["Zp"], name="/inter/Transpose_1", perm=[1, 2, 0]))
        nodes.append(helper.make_node("GatherND", ["Zp", "tri_pairs"], ["Zg"], name="/inter/GatherND"))
        nodes.append(helper.make_node("Transpose", ["Zg"], [out], name="/inter/Transpose_2", perm=[1, 0]))
        return len(pairs)
    return build


def main(save, dlrm, dlrm_inputs):
    i64 = TensorProto.INT64
    cases = [
        ("dlrm_slice", slices_squeeze, 11),
        ("dlrm_slice_self", slices_self_cat2, 12),
        ("dlrm_gather_nd", gather_nd(False), 13),
        ("dlrm_gather_nd_self", gather_nd(True), 14),
        ("dlrm_tril_order", gather_nd(False, column_major=True), 15),
    ]
    for name, tril, seed in cases:
        save(name, dlrm("dot", 13, i64, "batch", seed=seed, tril=tril), dlrm_inputs(5, np.int64, seed=seed + 100))
