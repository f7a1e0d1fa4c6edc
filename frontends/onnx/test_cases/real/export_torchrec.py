#!/usr/bin/env python3
"""Real exports of TorchRec's own `DLRM_DCN` (torchrec.models.dlrm), for issue 43.

The model is TorchRec's, not a re-implementation: `DLRM_DCN` over an unsharded plain
`EmbeddingBagCollection` (`EmbeddingBagConfig` per table, feature `f{t}`, sum pooling;
the FusedEmbeddingBagCollection of scripts/torchrec_dlrm.py runs FBGEMM custom ops and
does not export), shaped like examples/dlrm-dcnv2-tiny.json: 4 dense features, tables
of 50/30/20 rows, dim 8, dense arch 4-16-8, `LowRankCrossNet` of 2 layers of rank 4,
over arch 32-16-1. Seeded; the cross layers' biases (zeros at TorchRec's init, which
the exporter then folds into one shared initializer) are drawn at random so the export
carries two distinct biases.

ONNX cannot carry a `KeyedJaggedTensor`, so a thin wrapper (as TorchRec's inference
wrappers do) takes plain tensors, `dense_features` [B, 4], `values` (all features'
ids, feature-major) and `lengths` ([3 * B], feature-major), rebuilds the KJT in its
forward, and applies `torch.sigmoid` to DLRM_DCN's logits (as `DLRMTrain`'s
predictions, and as dlrmc's plans return probabilities).

The TorchScript exporter traces: the KJT's `length_per_key` (ids per feature), which
TorchRec computes with `.tolist()`, would be baked into the export as a constant Split
of `values` (right only for the tracing batch). The wrapper therefore passes
`length_per_key` to the KJT as 0-dim tensors (`lengths.view(3, -1).sum(1)`), which the
tracer records as dynamic split sizes. The dynamo exporter (torch.export) is tried
with the KJT computing `length_per_key` itself (unbacked sizes).

Each case directory gets what export_pytorch.py writes: `model.onnx`, `case.json`,
`inputs_B.npz` and `outputs_B.npz` (TorchRec's own eager outputs) for B in 1, 7, 2048,
checked against ONNX Runtime.

Status (torch 2.14.1, torchrec 1.9.2, onnxruntime checked to 6e-8 on both exports):
no case directory is committed, because dlrmc (at 6f8637b) does not import either
export, and this directory's cases are all compiled and trained by the tests. Both
fail at the first table's bag:

  ts17_torchrec_dcn:   node #72 `/model/sparse_arch/embedding_bag_collection/t0/Loop`
  dynamo_torchrec_dcn: node #48 `n19_2`
  (Loop): unsupported Loop: it does not compute an EmbeddingBag (the loop's bound is
  not known at import)

The bag Loops themselves are the usual ones (TorchScript: the include_last_offset
body, trip count `Gather(Shape(Slice(offs_k, 1, INT64_MAX)), 0)`; dynamo: rows
gathered outside, a `num_bag - 1` while-loop over a sequence). What bag/jagged.rs
does not recognise is how TorchRec's KJT.to_dict() forms the per-key ids and offsets
(`_maybe_compute_kjt_to_jt_dict`), with L = `lengths` viewed `[K, R]` (K = 3 keys):
  ids of key k:  TorchScript: `Slice(values, s_k, s_k + n_k)` with
                 `n = ReduceSum(Reshape(lengths, [3, -1]), axes=[1])` picked by
                 `Split([1,1,1]) + Squeeze + Unsqueeze`, `s_0 = 0`, `s_k+1 = s_k + n_k`
                 (an `Add` chain); dynamo: `Split(values, Concat(n_0, n_1, n_2))`
                 (n_k by `Slice + Squeeze + Reshape + Gather` of the same ReduceSum).
  offsets of k:  `O = Concat(ConstantOfShape([3, 1]) = 0, CumSum(L, axis=-1), axis=-1)`
                 ([K, R+1], `_batched_lengths_to_offsets`), row k by
                 `Split([1,1,1], axis 0) + Squeeze` (TorchScript) or
                 `Slice(k, k+1) + Squeeze` (dynamo), used whole as include_last_offset
                 bounds; its last entry is n_k, the ids' length, by arithmetic only.
  R:             TorchScript: `Div(ReduceProd(Shape(lengths)), 3)` (KJT's stride) for
                 the Reshape; dynamo: a `Reshape(lengths, ...)` of its own.
(`graph.txt` of each case, written by hand with onnx, lists the whole graphs.) Past the
bags (not reached by dlrmc, so its fusion is unchecked) the graph is
`Concat(Unsqueeze(dense, 1), Reshape(Concat(pooled, axis 1), [-1, 3, 8]), axis 1)`,
`Reshape([B, -1])`, then per layer
MatMul/MatMul (Gemm/Gemm for dynamo) + Add(bias) + Mul(x0) + Add(x_l).

usage: export_torchrec.py [OUT_DIR] [--only NAME ...]
  (OUT_DIR defaults to /tmp/trec-case, not this directory, until dlrmc imports
  the cases)
needs: torchrec (1.9.2 tested), torch, fbgemm-gpu-cpu, onnx, onnxruntime, onnxscript
"""
import argparse
import json
import os
import sys
import warnings

import numpy as np
import torch
import torch.nn as nn

from torchrec.models.dlrm import DLRM_DCN
from torchrec.modules.embedding_configs import EmbeddingBagConfig, PoolingType
from torchrec.modules.embedding_modules import EmbeddingBagCollection
from torchrec.sparse.jagged_tensor import KeyedJaggedTensor

BATCHES = (1, 7, 2048)
DENSE = 4
ROWS = (50, 30, 20)
DIM = 8
KEYS = [f"f{t}" for t in range(len(ROWS))]


class TorchRecDCN(nn.Module):
    """Plain tensors in, TorchRec's DLRM_DCN inside, probabilities out."""

    def __init__(self, seed=1, lpk_tensors=True):
        super().__init__()
        torch.manual_seed(seed)
        tables = [
            EmbeddingBagConfig(name=f"t{t}", embedding_dim=DIM, num_embeddings=rows,
                               feature_names=[KEYS[t]], pooling=PoolingType.SUM)
            for t, rows in enumerate(ROWS)
        ]
        ebc = EmbeddingBagCollection(tables=tables, device=torch.device("cpu"))
        self.model = DLRM_DCN(
            embedding_bag_collection=ebc, dense_in_features=DENSE,
            dense_arch_layer_sizes=[16, DIM], over_arch_layer_sizes=[16, 1],
            dcn_num_layers=2, dcn_low_rank_dim=4, dense_device=torch.device("cpu"))
        g = torch.Generator().manual_seed(seed + 100)
        with torch.no_grad():
            for b in self.model.inter_arch.crossnet.bias:
                b.copy_(torch.randn(b.shape, generator=g) * 0.1)
        self.lpk_tensors = lpk_tensors

    def forward(self, dense_features, values, lengths):
        if self.lpk_tensors:
            lpk = list(lengths.view(len(KEYS), -1).sum(1).unbind(0))
            kjt = KeyedJaggedTensor(keys=KEYS, values=values, lengths=lengths,
                                    length_per_key=lpk)
        else:
            kjt = KeyedJaggedTensor(keys=KEYS, values=values, lengths=lengths)
        return torch.sigmoid(self.model(dense_features, kjt))


def make_inputs(batch, seed):
    """Per bag 0-3 ids (empty bags included), `lengths` feature-major."""
    rng = np.random.default_rng(seed + batch)
    dense = rng.uniform(0, 3, size=(batch, DENSE)).astype(np.float32)
    lens = rng.integers(0, 4, size=(len(ROWS), batch))
    vals = np.concatenate([rng.integers(0, r, size=int(lens[k].sum()))
                           for k, r in enumerate(ROWS)])
    flat = {"dense_features": dense, "values": vals.astype(np.int64),
            "lengths": lens.reshape(-1).astype(np.int64)}
    return flat, tuple(torch.tensor(v) for v in flat.values())


# name -> (exporter, opset)
CASES = {
    "ts17_torchrec_dcn": ("torchscript", 17),
    "dynamo_torchrec_dcn": ("dynamo", 18),
}
NAMES = ["dense_features", "values", "lengths"]


def export(name, exporter, opset, out_dir, seed=7):
    import torchrec
    d = os.path.join(out_dir, name)
    os.makedirs(d, exist_ok=True)
    model = TorchRecDCN(lpk_tensors=(exporter == "torchscript")).eval()
    _, args = make_inputs(5, seed)
    path = os.path.join(d, "model.onnx")
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        if exporter == "torchscript":
            axes = {"dense_features": {0: "batch_size"}, "values": {0: "n_values"},
                    "lengths": {0: "n_lengths"}, "pred": {0: "batch_size"}}
            torch.onnx.export(model, args, path, dynamo=False, opset_version=opset,
                              input_names=NAMES, output_names=["pred"], dynamic_axes=axes)
        else:
            from torch.export import Dim
            shapes = ({0: Dim("batch_size", min=1, max=1 << 20)},
                      {0: Dim("n_values", min=0, max=1 << 24)},
                      {0: Dim("n_lengths", min=1, max=1 << 24)})
            prog = torch.onnx.export(model, args, dynamo=True, opset_version=opset,
                                     input_names=NAMES, output_names=["pred"],
                                     dynamic_shapes=shapes, external_data=False)
            prog.save(path)
    case = {"exporter": exporter, "opset": opset, "torch": torch.__version__,
            "torchrec": torchrec.__version__, "options": {"torchrec_dlrm_dcn": True},
            "inputs": NAMES, "outputs": ["pred"], "batches": list(BATCHES)}
    import onnxruntime as ort
    sess = ort.InferenceSession(path, providers=["CPUExecutionProvider"])
    worst = 0.0
    for b in BATCHES:
        flat, args = make_inputs(b, seed)
        with torch.no_grad():
            pred = model(*args).numpy()
        np.savez(os.path.join(d, f"inputs_{b}.npz"), **flat)
        np.savez(os.path.join(d, f"outputs_{b}.npz"), pred=pred)
        got = sess.run(None, {i.name: flat[i.name] for i in sess.get_inputs()})[0]
        worst = max(worst, float(np.abs(got - pred).max()))
    case["onnxruntime_max_abs_diff"] = worst
    if worst > 1e-5:
        raise SystemExit(f"{name}: ONNX Runtime differs from TorchRec by {worst}")
    with open(os.path.join(d, "case.json"), "w") as f:
        json.dump(case, f, indent=1, sort_keys=True)
        f.write("\n")
    print(f"{name}: {exporter} opset {opset}, ort max abs diff {worst:.2e}")


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    # Not this directory by default: the tests would pick up cases dlrmc cannot import.
    ap.add_argument("out", nargs="?", default="/tmp/trec-case")
    ap.add_argument("--only", nargs="*", help="case names (default: all)")
    a = ap.parse_args()
    failed = []
    for name, (exporter, opset) in CASES.items():
        if a.only and name not in a.only:
            continue
        try:
            export(name, exporter, opset, a.out)
        except Exception as e:  # report every failing export, then fail
            print(f"{name}: export failed: {type(e).__name__}: {e}", file=sys.stderr)
            failed.append(name)
    if failed:
        raise SystemExit(f"failed: {' '.join(failed)}")


if __name__ == "__main__":
    main()
