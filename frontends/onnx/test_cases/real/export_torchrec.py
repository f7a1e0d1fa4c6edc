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
both import (issue 43) and are committed here; like every case in this directory
they are compiled, served against TorchRec's outputs and trained by the tests.
`dlrmc compile` gives the plan of examples/dlrm-dcnv2-tiny.json (op for op after
`fuse`, `--dump-ir fuse`; the JSON model's bags are fixed-size, these read jagged
`values`/`lengths`): one `embedding_bag` (last_offset) per table, the `cat`
interaction, the two cross layers as `brgemm`s and `cross_mix` (`contract-cross`).

What the import recognises of KeyedJaggedTensor.to_dict() (frontends/onnx/src/bag/
jagged.rs, by what each value computes, for any number of keys K), with L =
`lengths` viewed `[K, R]` (`Reshape(lengths, [K, -1])`, or `[K, R]` with R =
`Div(ReduceProd(Shape(lengths)), K)`, KJT's stride):
  ids of key k:  TorchScript: `Slice(values, s_k, s_k + n_k)` with
                 `n = ReduceSum(L, axes=[1])` picked by `Split + Squeeze`, `s_0 = 0`,
                 `s_k+1 = s_k + n_k` (an `Add` chain); dynamo:
                 `Split(values, Concat(n_0, .., n_K-1))` (n_k by `Slice + Squeeze`,
                 `Reshape` and `Gather` of the same ReduceSum).
  offsets of k:  row k of `Concat(zeros[K, 1], CumSum(L, axis=-1), axis=-1)`
                 (`_batched_lengths_to_offsets`), by `Split + Squeeze` (TorchScript)
                 or `Slice(k, k+1) + Squeeze` (dynamo), used whole as
                 include_last_offset bounds (its last entry is n_k, the ids' length).
Each table's bag becomes `embedding_bag[last_offset](table, values,
offsets_from_lengths{K, k}(lengths))`, with `len(lengths)` made `K·R` and R then
the dense batch (the interaction's Concat). Past the bags, the graph is
`Reshape(Concat(Unsqueeze(dense, 1), Reshape(pooled, [-1, K, D]), axis 1), [B, -1])`,
which the `canon` rule `flatten-stacked-concat` gives back as one `cat`
interaction (the `Split` of the pooled `KeyedTensor` that a `Concat` undoes is
dropped at import), then per layer MatMul/MatMul (Gemm/Gemm for dynamo) + Add(bias)
+ Mul(x0) + Add(x_l), TorchRec's `LowRankCrossNet`.

usage: export_torchrec.py [OUT_DIR] [--only NAME ...] [--rows R,R,..] [--batches B,..]
  (OUT_DIR defaults to this directory; --rows gives other tables, and other than
  3 of them the case names end in _k{tables} and case.json says "tables".
  ../torchrec_keys/ was made with `--rows 40,30,20,10,25 --batches 1,7 --only
  ts17_torchrec_dcn_k5` and `--rows 40,30 --batches 1,7 --only
  dynamo_torchrec_dcn_k2`)
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


class TorchRecDCN(nn.Module):
    """Plain tensors in, TorchRec's DLRM_DCN inside, probabilities out."""

    def __init__(self, seed=1, lpk_tensors=True, rows=ROWS):
        super().__init__()
        torch.manual_seed(seed)
        self.keys = [f"f{t}" for t in range(len(rows))]
        tables = [
            EmbeddingBagConfig(name=f"t{t}", embedding_dim=DIM, num_embeddings=r,
                               feature_names=[self.keys[t]], pooling=PoolingType.SUM)
            for t, r in enumerate(rows)
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
        keys = self.keys
        if self.lpk_tensors:
            lpk = list(lengths.view(len(keys), -1).sum(1).unbind(0))
            kjt = KeyedJaggedTensor(keys=keys, values=values, lengths=lengths,
                                    length_per_key=lpk)
        else:
            kjt = KeyedJaggedTensor(keys=keys, values=values, lengths=lengths)
        return torch.sigmoid(self.model(dense_features, kjt))


def make_inputs(batch, seed, rows=ROWS):
    """Per bag 0-3 ids (empty bags included), `lengths` feature-major."""
    rng = np.random.default_rng(seed + batch)
    dense = rng.uniform(0, 3, size=(batch, DENSE)).astype(np.float32)
    lens = rng.integers(0, 4, size=(len(rows), batch))
    vals = np.concatenate([rng.integers(0, r, size=int(lens[k].sum()))
                           for k, r in enumerate(rows)])
    flat = {"dense_features": dense, "values": vals.astype(np.int64),
            "lengths": lens.reshape(-1).astype(np.int64)}
    return flat, tuple(torch.tensor(v) for v in flat.values())


# name -> (exporter, opset)
CASES = {
    "ts17_torchrec_dcn": ("torchscript", 17),
    "dynamo_torchrec_dcn": ("dynamo", 18),
}
NAMES = ["dense_features", "values", "lengths"]


def export(name, exporter, opset, out_dir, seed=7, rows=ROWS, batches=BATCHES):
    import torchrec
    d = os.path.join(out_dir, name)
    os.makedirs(d, exist_ok=True)
    model = TorchRecDCN(lpk_tensors=(exporter == "torchscript"), rows=rows).eval()
    _, args = make_inputs(5, seed, rows)
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
            "inputs": NAMES, "outputs": ["pred"], "batches": list(batches)}
    if len(rows) != 3:
        case["tables"] = len(rows)
    import onnxruntime as ort
    sess = ort.InferenceSession(path, providers=["CPUExecutionProvider"])
    worst = 0.0
    for b in batches:
        flat, args = make_inputs(b, seed, rows)
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
    ap.add_argument("out", nargs="?", default=os.path.dirname(os.path.abspath(__file__)))
    ap.add_argument("--only", nargs="*", help="case names (default: all)")
    ap.add_argument("--rows", help="the tables' rows, comma-separated (default: 50,30,20); "
                    "other than 3 tables, the case names end in _k{tables}")
    ap.add_argument("--batches", help="batch sizes, comma-separated (default: 1,7,2048)")
    a = ap.parse_args()
    rows = tuple(int(r) for r in a.rows.split(",")) if a.rows else ROWS
    batches = tuple(int(b) for b in a.batches.split(",")) if a.batches else BATCHES
    suffix = "" if len(rows) == 3 else f"_k{len(rows)}"
    failed = []
    for base, (exporter, opset) in CASES.items():
        name = base + suffix
        if a.only and name not in a.only:
            continue
        try:
            export(name, exporter, opset, a.out, rows=rows, batches=batches)
        except Exception as e:  # report every failing export, then fail
            print(f"{name}: export failed: {type(e).__name__}: {e}", file=sys.stderr)
            failed.append(name)
    if failed:
        raise SystemExit(f"failed: {' '.join(failed)}")


if __name__ == "__main__":
    main()
