#!/usr/bin/env python3
"""Real PyTorch exports of a reference-style DLRM, for dlrmc's import tests.

The model is written in the structure of the reference DLRM (`dlrm_s_pytorch.py`'s
`DLRM_Net`): Linear+ReLU MLPs built by `create_mlp` (the last top layer followed by
Sigmoid), one `nn.EmbeddingBag` per table built by `create_emb`, `apply_emb` calling
each bag with offsets (or fixed-size bags, or per-sample weights), the dot interaction
through `torch.bmm` and the `Z[:, li, lj]` lower triangle, or the cat interaction.
It is exported by PyTorch itself (`torch.onnx.export`, TorchScript exporter at several
opsets, and `dynamo=True`), and a TorchRec-style model (`EmbeddingBagCollection`
semantics in plain PyTorch, fed `KeyedJaggedTensor`-like `values` / `lengths`) too.

Each case directory gets `model.onnx`, `case.json` (what the case is), and for each
batch size B in BATCHES `inputs_B.npz` and `outputs_B.npz`: PyTorch's own outputs of
the eager model on those inputs (ONNX Runtime, when installed, is checked against
them here too, so a broken export is caught before it is committed). CI has no
PyTorch: the Rust tests read the committed files.

usage: export_pytorch.py [OUT_DIR] [--only NAME ...]
       export_pytorch.py --json MODEL.json OUT.onnx [--opset N] [--dynamo] [--batch B]
(the second form exports the reference-style DLRM of a dlrmc JSON description's
shape, fixed-size bags of its pooling, for comparing a real export's plan with its
JSON twin's, and for scripts/measure-peers; with --batch it writes `inputs.npz` and
PyTorch's `outputs.npz` of that batch beside OUT)
needs: torch, onnx, numpy; onnxscript for the dynamo exporter; onnxruntime optional
(`../shared/tools/install-pytorch` installs all of them in a virtual environment).
"""
import argparse
import json
import os
import sys
import warnings

import numpy as np
import torch
import torch.nn as nn

BATCHES = (1, 7, 2048)
DENSE = 13
ROWS = (40, 25, 60)
DIM = 8


class DLRM_Net(nn.Module):
    """The reference DLRM's structure (MLPs, bags, interaction), reduced to what an
    export sees."""

    def create_mlp(self, ln, sigmoid_layer):
        layers = nn.ModuleList()
        for i in range(0, len(ln) - 1):
            n, m = int(ln[i]), int(ln[i + 1])
            ll = nn.Linear(n, m, bias=True)
            w = self.rng.normal(0.0, np.sqrt(2 / (m + n)), size=(m, n)).astype(np.float32)
            b = self.rng.normal(0.0, np.sqrt(1 / m), size=m).astype(np.float32)
            ll.weight.data = torch.tensor(w)
            ll.bias.data = torch.tensor(b)
            layers.append(ll)
            layers.append(nn.Sigmoid() if i == sigmoid_layer else nn.ReLU())
        return nn.Sequential(*layers)

    def create_emb(self, m, ln):
        emb_l = nn.ModuleList()
        for n in ln:
            e = nn.EmbeddingBag(
                n, m, mode=self.mode, include_last_offset=self.include_last_offset
            )
            w = self.rng.uniform(-np.sqrt(1 / n), np.sqrt(1 / n), size=(n, m)).astype(np.float32)
            e.weight.data = torch.tensor(w)
            emb_l.append(e)
        return emb_l

    def __init__(self, m_spa, ln_emb, ln_bot, ln_top, interaction="dot", itself=False,
                 mode="sum", include_last_offset=False, seed=0):
        super().__init__()
        self.rng = np.random.default_rng(seed)
        self.mode = mode
        self.include_last_offset = include_last_offset
        self.arch_interaction_op = interaction
        self.arch_interaction_itself = itself
        self.emb_l = self.create_emb(m_spa, ln_emb)
        self.bot_l = self.create_mlp(ln_bot, -1)
        self.top_l = self.create_mlp(ln_top, len(ln_top) - 2)
        if interaction == "dcn":  # DLRM-DCNv2: TorchRec's LowRankCrossNet, 2 layers of rank 4
            self.cross_v, self.cross_w, self.cross_b = self.create_cross(ln_top[0], 2, 4)

    def create_cross(self, n, layers, rank):
        """TorchRec's `LowRankCrossNet` parameters: V_l [r, n] and W_l [n, r]
        xavier-normal, biases (random here, so the export's bias is not all zero)."""
        xavier = lambda a, b: torch.tensor(
            self.rng.normal(0.0, np.sqrt(2 / (a + b)), size=(a, b)).astype(np.float32))
        v = nn.ParameterList(nn.Parameter(xavier(rank, n)) for _ in range(layers))
        w = nn.ParameterList(nn.Parameter(xavier(n, rank)) for _ in range(layers))
        b = nn.ParameterList(
            nn.Parameter(torch.tensor(self.rng.normal(0, 0.1, n).astype(np.float32)))
            for _ in range(layers))
        return v, w, b

    def apply_mlp(self, x, layers):
        return layers(x)

    def apply_emb(self, lS_o, lS_i, v_W_l):
        ly = []
        for k, sparse_index_group_batch in enumerate(lS_i):
            sparse_offset_group_batch = lS_o[k] if lS_o is not None else None
            per_sample_weights = v_W_l[k] if v_W_l is not None else None
            E = self.emb_l[k]
            V = E(sparse_index_group_batch, sparse_offset_group_batch,
                  per_sample_weights=per_sample_weights)
            ly.append(V)
        return ly

    def interact_features(self, x, ly):
        if self.arch_interaction_op == "dot":
            (batch_size, d) = x.shape
            T = torch.cat([x] + ly, dim=1).view((batch_size, -1, d))
            Z = torch.bmm(T, torch.transpose(T, 1, 2))
            _, ni, nj = Z.shape
            offset = 1 if self.arch_interaction_itself else 0
            li = torch.tensor([i for i in range(ni) for j in range(i + offset)])
            lj = torch.tensor([j for i in range(nj) for j in range(i + offset)])
            Zflat = Z[:, li, lj]
            R = torch.cat([x] + [Zflat], dim=1)
        else:
            R = torch.cat([x] + ly, dim=1)
        if self.arch_interaction_op == "dcn":  # LowRankCrossNet.forward, as TorchRec writes it
            x_0, x_l = R, R
            for v, w, b in zip(self.cross_v, self.cross_w, self.cross_b):
                x_l_v = nn.functional.linear(x_l, v)
                x_l_w = nn.functional.linear(x_l_v, w)
                x_l = x_0 * (x_l_w + b) + x_l
            R = x_l
        return R

    def forward(self, dense_x, lS_o, lS_i, v_W_l=None):
        x = self.apply_mlp(dense_x, self.bot_l)
        ly = self.apply_emb(lS_o, lS_i, v_W_l)
        z = self.interact_features(x, ly)
        return self.apply_mlp(z, self.top_l)


class TorchRecStyle(nn.Module):
    """`EmbeddingBagCollection` semantics in plain PyTorch: one sum bag per feature,
    fed a `KeyedJaggedTensor`'s `values` (all features' ids, feature-major) and
    `lengths` ([features * batch], feature-major), the dense arch an MLP, the
    interaction the dot product of DLRM, the over arch an MLP."""

    def __init__(self, seed=0):
        super().__init__()
        inner = DLRM_Net(DIM, ROWS, [DENSE, 16, DIM], [DIM + 6, 16, 1], seed=seed)
        self.tables = nn.ParameterList([nn.Parameter(e.weight.data.clone()) for e in inner.emb_l])
        self.dense_arch = inner.bot_l
        self.over_arch = inner.top_l
        self.inner = inner

    def forward(self, dense_features, values, lengths):
        n = len(self.tables)
        b = dense_features.shape[0]
        per_feature = lengths.view(n, b)
        ends = torch.cumsum(lengths, 0)
        starts = ends - lengths
        pooled = []
        for k in range(n):
            lo = starts[k * b]
            hi = ends[(k + 1) * b - 1]
            ids = values[lo:hi]
            offs = torch.cumsum(per_feature[k], 0) - per_feature[k]
            pooled.append(nn.functional.embedding_bag(ids, self.tables[k], offs, mode="sum"))
        x = self.dense_arch(dense_features)
        z = self.inner.interact_features(x, pooled)
        return self.over_arch(z)


def bag_inputs(rng, batch, rows, dtype, *, fixed=None, last_offset=False, weighted=False,
               empty=True):
    """Indices and offsets of one table for `batch` bags: 0-4 indices a bag, with empty
    bags first, in the middle and last (when `empty` and the batch allows)."""
    if fixed:
        idx = rng.integers(0, rows, size=(batch, fixed))
        w = rng.uniform(0.5, 1.5, size=(batch, fixed)).astype(np.float32) if weighted else None
        return torch.tensor(idx, dtype=dtype), None, (torch.tensor(w) if weighted else None)
    lens = rng.integers(1, 5, size=batch)
    if empty and batch >= 3:
        lens[0] = 0
        lens[batch // 2] = 0
        lens[-1] = 0
    offs = np.concatenate([[0], np.cumsum(lens)])
    idx = rng.integers(0, rows, size=int(offs[-1]))
    if not last_offset:
        offs = offs[:-1]
    w = rng.uniform(0.5, 1.5, size=idx.shape[0]).astype(np.float32) if weighted else None
    return (torch.tensor(idx, dtype=dtype), torch.tensor(offs, dtype=dtype),
            torch.tensor(w) if weighted else None)


# name -> (exporter, opset, options). exporter: "torchscript" or "dynamo".
CASES = {
    "ts11_dot_offsets": ("torchscript", 11, {}),
    "ts13_dot_offsets": ("torchscript", 13, {}),
    "ts17_dot_offsets": ("torchscript", 17, {}),
    "ts17_dot_int32": ("torchscript", 17, {"dtype": "int32"}),
    "ts17_dot_fixed": ("torchscript", 17, {"fixed": 3}),
    "ts13_dot_weighted": ("torchscript", 13, {"weighted": True}),
    "ts17_dot_mean": ("torchscript", 17, {"mode": "mean"}),
    "ts17_dot_last_offset": ("torchscript", 17, {"last_offset": True}),
    "ts17_dot_itself": ("torchscript", 17, {"itself": True}),
    "ts11_cat_offsets": ("torchscript", 11, {"interaction": "cat"}),
    "dynamo_dot_offsets": ("dynamo", 18, {}),
    # No dynamo int32 case: PyTorch 2.15's dynamo exporter writes an invalid model for
    # int32 bags (a Concat of int32 offsets with an int64 length; ONNX Runtime refuses
    # to load it), so there is nothing real to import. ts17_dot_int32 covers int32.
    "dynamo_dot_fixed": ("dynamo", 18, {"fixed": 3}),
    "dynamo_dot_weighted": ("dynamo", 18, {"weighted": True}),
    "dynamo_dot_mean": ("dynamo", 18, {"mode": "mean"}),
    "dynamo_dot_last_offset": ("dynamo", 18, {"last_offset": True}),
    "dynamo_cat_offsets": ("dynamo", 18, {"interaction": "cat"}),
    # The reference's own layouts: `lS_o` stacked into one [T, B] tensor (random-data
    # mode, several ids a bag), and lS_o and lS_i both stacked [T, B] (Criteo mode, one
    # id a bag).
    "ts17_dot_stacked": ("torchscript", 17, {"stacked": True}),
    "ts11_dot_stacked": ("torchscript", 11, {"stacked": True}),
    "ts17_dot_stacked_weighted": ("torchscript", 17, {"stacked": True, "weighted": True}),
    "ts17_dot_criteo": ("torchscript", 17, {"stacked": True, "criteo": True}),
    # As the reference's `--save-onnx` names its axes: every indices_k's length
    # labelled with the batch's own dim name (a hint, not a fact: bags have 0-4 ids).
    "ts17_dot_stacked_refaxes": ("torchscript", 17, {"stacked": True, "ref_axes": True}),
    "dynamo_dot_stacked": ("dynamo", 18, {"stacked": True}),
    "dynamo_dot_criteo": ("dynamo", 18, {"stacked": True, "criteo": True}),
    "ts17_dcn_offsets": ("torchscript", 17, {"interaction": "dcn"}),
    "dynamo_dcn_offsets": ("dynamo", 18, {"interaction": "dcn"}),
    "ts17_torchrec": ("torchscript", 17, {"torchrec": True}),
    "dynamo_torchrec": ("dynamo", 18, {"torchrec": True}),
}


def make_model(o, seed):
    if o.get("torchrec"):
        return TorchRecStyle(seed)
    inter = o.get("interaction", "dot")
    itself = o.get("itself", False)
    f = len(ROWS) + 1
    pairs = f * (f + 1) // 2 if itself else f * (f - 1) // 2
    top_in = DIM + pairs if inter == "dot" else DIM * f  # cat and dcn: the concatenation
    return DLRM_Net(DIM, ROWS, [DENSE, 16, DIM], [top_in, 16, 1], interaction=inter,
                    itself=itself, mode=o.get("mode", "sum"),
                    include_last_offset=o.get("last_offset", False), seed=seed)


def make_inputs(o, batch, seed):
    """(names, torch args for the model, flat dict of numpy arrays by input name)."""
    rng = np.random.default_rng(seed + batch)
    dtype = torch.int32 if o.get("dtype") == "int32" else torch.int64
    dense = torch.tensor(rng.uniform(0, 3, size=(batch, DENSE)).astype(np.float32))
    if o.get("torchrec"):
        lens = rng.integers(0, 4, size=(len(ROWS), batch))
        vals = np.concatenate([rng.integers(0, r, size=int(lens[k].sum()))
                               for k, r in enumerate(ROWS)])
        flat = {"dense_features": dense.numpy(), "values": vals.astype(np.int64),
                "lengths": lens.reshape(-1).astype(np.int64)}
        args = (dense, torch.tensor(flat["values"]), torch.tensor(flat["lengths"]))
        return list(flat), args, flat
    if o.get("criteo"):  # one id a bag, offsets 0..B-1: both stacked [T, B]
        idx = np.stack([rng.integers(0, r, size=batch) for r in ROWS]).astype(np.int64)
        offs = np.tile(np.arange(batch, dtype=np.int64), (len(ROWS), 1))
        flat = {"dense_x": dense.numpy(), "offsets": offs, "indices": idx}
        return list(flat), (dense, torch.tensor(offs), torch.tensor(idx)), flat
    lS_i, lS_o, lS_w = [], [], []
    for rows in ROWS:
        i, off, w = bag_inputs(rng, batch, rows, dtype, fixed=o.get("fixed"),
                               last_offset=o.get("last_offset", False),
                               weighted=o.get("weighted", False))
        lS_i.append(i)
        lS_o.append(off)
        lS_w.append(w)
    n = len(ROWS)
    flat = {"dense_x": dense.numpy()}
    if o.get("stacked"):  # the reference's `lS_o = torch.stack(lS_o)`: [T, B]
        lS_o = torch.stack(lS_o)
        flat["offsets"] = lS_o.numpy()
    elif not o.get("fixed"):
        flat.update({f"offsets_{k}": lS_o[k].numpy() for k in range(n)})
    flat.update({f"indices_{k}": lS_i[k].numpy() for k in range(n)})
    if o.get("weighted"):
        flat.update({f"weights_{k}": lS_w[k].numpy() for k in range(n)})
    args = (dense, None if o.get("fixed") else lS_o, lS_i,
            lS_w if o.get("weighted") else None)
    return list(flat), args, flat


def dynamic_axes(o, names):
    axes = {"pred": {0: "batch_size"}}
    for nm in names:
        if nm in ("dense_x", "dense_features"):
            axes[nm] = {0: "batch_size"}
        elif nm.startswith("offsets_"):
            axes[nm] = {0: "batch_size"}
        elif nm in ("offsets", "indices"):  # stacked [T, B]
            axes[nm] = {1: "batch_size"}
        elif nm.startswith(("indices_", "weights_")):
            fixed_len = o.get("fixed") or o.get("ref_axes")
            axes[nm] = {0: "batch_size"} if fixed_len else {0: "nnz_" + nm.split("_")[1]}
        elif nm in ("values", "lengths"):
            axes[nm] = {0: "n_" + nm}
    return axes


def dynamic_shapes(o):
    """torch.export's form of the same dynamic axes, shaped like the model's args."""
    from torch.export import Dim
    batch = Dim("batch_size", min=1, max=1 << 20)
    if o.get("torchrec"):
        return ({0: batch}, {0: Dim("n_values", min=0, max=1 << 24)},
                {0: Dim("n_lengths", min=1, max=1 << 24)})
    n = len(ROWS)
    if o.get("criteo"):
        return ({0: batch}, {1: batch}, {1: batch})
    nnz = [Dim(f"nnz_{k}", min=0, max=1 << 24) for k in range(n)]
    offs = None if o.get("fixed") else [{0: batch} for _ in range(n)]
    if o.get("stacked"):
        offs = {1: batch}
    if o.get("last_offset") and not o.get("fixed"):
        offs = [{0: Dim(f"n_offsets_{k}", min=2, max=1 << 20)} for k in range(n)]
    idx = [{0: batch} if o.get("fixed") else {0: nnz[k]} for k in range(n)]
    w = [dict(d) for d in idx] if o.get("weighted") else None
    return ({0: batch}, offs, idx, w)


def export(name, exporter, opset, o, out_dir, seed=7):
    d = os.path.join(out_dir, name)
    os.makedirs(d, exist_ok=True)
    model = make_model(o, seed).eval()
    names, args, _ = make_inputs(o, 5, seed)
    path = os.path.join(d, "model.onnx")
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        if exporter == "torchscript":
            axes = dynamic_axes(o, names)
            if o.get("last_offset"):  # B + 1 offsets: an axis of their own
                for nm in names:
                    if nm.startswith("offsets_"):
                        axes[nm] = {0: "n_offsets_" + nm.split("_")[1]}
            torch.onnx.export(model, args, path, dynamo=False, opset_version=opset,
                              input_names=names, output_names=["pred"], dynamic_axes=axes)
        else:
            prog = torch.onnx.export(model, args, dynamo=True, opset_version=opset,
                                     input_names=names, output_names=["pred"],
                                     dynamic_shapes=dynamic_shapes(o),
                                     external_data=False)
            prog.save(path)
    case = {"exporter": exporter, "opset": opset, "torch": torch.__version__,
            "options": o, "inputs": names, "outputs": ["pred"], "batches": list(BATCHES)}
    try:
        import onnxruntime as ort
        sess = ort.InferenceSession(path, providers=["CPUExecutionProvider"])
    except ImportError:
        sess = None
    worst = 0.0
    for b in BATCHES:
        _, args, flat = make_inputs(o, b, seed)
        with torch.no_grad():
            pred = model(*args).numpy()
        np.savez(os.path.join(d, f"inputs_{b}.npz"), **flat)
        np.savez(os.path.join(d, f"outputs_{b}.npz"), pred=pred)
        if sess is not None:
            feed = {i.name: flat[i.name] for i in sess.get_inputs()}
            got = sess.run(None, feed)[0]
            worst = max(worst, float(np.abs(got - pred).max()))
    if sess is not None:
        case["onnxruntime_max_abs_diff"] = worst
        if worst > 1e-5:
            raise SystemExit(f"{name}: ONNX Runtime differs from PyTorch by {worst}")
    with open(os.path.join(d, "case.json"), "w") as f:
        json.dump(case, f, indent=1, sort_keys=True)
        f.write("\n")
    print(f"{name}: {exporter} opset {opset}, ort max abs diff {worst:.2e}")


def export_json(spec_path, out, opset, dynamo, batch=None):
    """A reference-style DLRM of a JSON description's shape, fixed-size bags. With
    `batch`, also writes `inputs.npz` (random inputs of that batch) and `outputs.npz`
    (the eager model's outputs on them) beside OUT."""
    with open(spec_path) as f:
        spec = json.load(f)
    widths = lambda v: [int(x) for x in (v.split("-") if isinstance(v, str) else v)]
    rows, dim, pool = spec["table_rows"], spec["embedding_dim"], spec.get("pooling", 1)
    bot, f = widths(spec["bottom_mlp"]), len(rows) + 1
    itself = spec.get("interaction_itself", False)
    pairs = f * (f + 1) // 2 if itself else f * (f - 1) // 2
    top_in = bot[-1] + pairs if spec.get("interaction", "dot") == "dot" else bot[-1] + dim * len(rows)
    # The description's top MLP lists the layers' widths; the first takes top_in.
    model = DLRM_Net(dim, rows, bot, [top_in] + widths(spec["top_mlp"]),
                     interaction=spec.get("interaction", "dot"),
                     itself=itself,
                     mode=spec.get("pooling_mode", "sum"), seed=spec.get("seed", 0)).eval()
    rng = np.random.default_rng(0)
    os.makedirs(os.path.dirname(os.path.abspath(out)), exist_ok=True)
    b = 4
    dense = torch.tensor(rng.standard_normal((b, spec["dense_features"])).astype(np.float32))
    idx = [torch.tensor(rng.integers(0, r, size=(b, pool))) for r in rows]
    names = ["dense_x"] + [f"indices_{k}" for k in range(len(rows))]
    axes = {n: {0: "batch_size"} for n in names + ["pred"]}
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        if dynamo:
            from torch.export import Dim
            bd = Dim("batch_size", min=1, max=1 << 20)
            prog = torch.onnx.export(model, (dense, None, idx), dynamo=True,
                                     opset_version=max(opset, 18), input_names=names,
                                     output_names=["pred"],
                                     dynamic_shapes=({0: bd}, None, [{0: bd} for _ in rows]))
            prog.save(out)
        else:
            torch.onnx.export(model, (dense, None, idx), out, dynamo=False,
                              opset_version=opset, input_names=names,
                              output_names=["pred"], dynamic_axes=axes)
    if batch:
        d = os.path.dirname(os.path.abspath(out))
        dense = torch.tensor(rng.random((batch, spec["dense_features"]), dtype=np.float32))
        idx = [torch.tensor(rng.integers(0, r, size=(batch, pool))) for r in rows]
        with torch.no_grad():
            pred = model(dense, None, idx).numpy()
        flat = {"dense_x": dense.numpy(), **{f"indices_{k}": i.numpy() for k, i in enumerate(idx)}}
        np.savez(os.path.join(d, "inputs.npz"), **flat)
        np.savez(os.path.join(d, "outputs.npz"), pred=pred)
    print(f"{out}: {len(rows)} tables, pooling {pool}")


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("out", nargs="?", default=os.path.dirname(os.path.abspath(__file__)))
    ap.add_argument("--only", nargs="*", help="case names (default: all)")
    ap.add_argument("--json", help="export a JSON description's shape to OUT (a .onnx path)")
    ap.add_argument("--opset", type=int, default=17)
    ap.add_argument("--dynamo", action="store_true")
    ap.add_argument("--batch", type=int, help="with --json: also write inputs.npz and "
                    "PyTorch's outputs.npz of this batch size beside OUT")
    a = ap.parse_args()
    if a.json:
        return export_json(a.json, a.out, a.opset, a.dynamo, a.batch)
    torch.manual_seed(0)
    failed = []
    for name, (exporter, opset, o) in CASES.items():
        if a.only and name not in a.only:
            continue
        try:
            export(name, exporter, opset, o, a.out)
        except Exception as e:  # report every failing export, then fail
            print(f"{name}: export failed: {type(e).__name__}: {e}", file=sys.stderr)
            failed.append(name)
    if failed:
        raise SystemExit(f"failed: {' '.join(failed)}")


if __name__ == "__main__":
    main()
