#!/usr/bin/env python3
"""The reference DLRM as Intel's own CPU recipe runs it with Intel's extension for
PyTorch (IPEX), built from a dlrmc JSON description, timed on random batches:
prints `train SAMPLES_PER_S` or `infer SAMPLES_PER_S` (one line), like
scripts/pytorch_dlrm.py and scripts/torchrec_dlrm.py, for scripts/measure-peers.

usage: ipex_dlrm.py MODEL.json train|infer [--iters N] [--threads T]
                    [--indices zipf|uniform] [--tables auto|merged|per-table]
                    [--check [STEPS]]

Needs torch 2.8 + intel-extension-for-pytorch 2.8 (../shared/tools/install-peers
ipex makes /tmp/peers-ipex/venv). The recipe is intel/ai-reference-models'
models_v2/pytorch/dlrm (dlrm_s_pytorch.py; training/cpu/run_model.sh passes
`--ipex-interaction --ipex-merged-emb`, inference/cpu/run_model.sh
`--ipex-interaction`), on one process:

- the model is scripts/pytorch_dlrm.py's (imported: the same layers, the same
  initial weights and the same 4 batches for the same seed), its dot interaction
  replaced by `ipex.nn.functional.interaction` (IPEX's fused kernel: the bottom
  MLP's output, then the strict lower triangle of the Gram matrix);
- training: the tables become one `ipex.nn.modules.MergedEmbeddingBagWithSGD`
  (every table in one kernel, the SGD update fused into its backward; for
  `optimizer: adagrad` `MergedEmbeddingBagWithAdaGrad`, IPEX's element-wise
  Adagrad; IPEX has no row-wise Adagrad, so `rowwise_adagrad` runs element-wise
  like scripts/pytorch_dlrm.py's), the MLPs `torch.optim.SGD` (or `Adagrad`)
  through `ipex.optimize(model, optimizer=..., dtype=torch.float32,
  auto_kernel_selection=True)` (prepacked oneDNN Linear layers, the fused update
  step), then each Linear and its ReLU or Sigmoid fused
  (`ipex.nn.modules.IPEXLinearEltwise`), as the recipe does;
- inference: the per-table `nn.EmbeddingBag`s (the recipe merges tables only for
  training), `ipex.optimize(model.eval(), dtype=torch.float32,
  auto_kernel_selection=True)`, then `torch.jit.trace` and `torch.jit.freeze`.

fp32 throughout. IPEX 2.8's merged tables with the fused optimizer update rows
wider than one SIMD vector wrongly (its backward applies the gradient's first
vector, 16 floats with AVX-512, 8 with AVX2, to every chunk of the row: wrong for
embedding_dim > 16 on AVX-512 CPUs, > 8 on AVX2 ones). So (`--tables auto`, the
default) one fused step on a 2-row table of the model's width is checked first,
and where it is wrong training keeps the reference's tables, one
`nn.EmbeddingBag(sparse=True)` per table (IPEX's own embedding-bag kernel, which
importing IPEX installs for `torch.embedding_bag`) updated by the ipex-optimized
`torch.optim.SGD` (sparse gradients; the recipe unmerged on one process would
use dense table gradients, a whole-table update every step);
`--tables merged|per-table` forces a form.

Inputs as scripts/pytorch_dlrm.py makes them: 4 batches made beforehand, cycled;
3 warm-up steps, then `--iters` timed steps. A plain process with `--threads`
intra-op threads: the recipe's launcher (`intel_extension_for_pytorch.cpu.launch`
with tcmalloc and Intel OpenMP preloaded) is not used, as the venv has neither
library.

Not expressible with IPEX's interaction (refused): `interaction: "cat"` or
`"dcn"`, `interaction_itself`, a bottom MLP not ending at `embedding_dim`.

`--check [STEPS]`: the same weights and batches through scripts/pytorch_dlrm.py's
model (plain PyTorch, sparse SGD) and through this one. `train`: STEPS (default
3; the two drift apart by about 4x a step at lr 0.1, from rounding alone: on
dlrm-mlperf outputs 2e-7 apart after 1 step, 1e-4 after 5) training steps of both; every step's loss must agree within 1e-5 relative
(plus 1e-6 absolute), after them every table's total update within 10% (L2
norm of the difference over that of PyTorch's update: PyTorch rounds each of a
hot row's updates separately, the merged tables apply their sum once, which
differs by up to a few percent; a wrong update by ~100%) and the outputs on the 4
batches within 1e-4. The reference runs
PyTorch's own `torch.embedding_bag`, not the one IPEX installs.
`infer`: the traced, frozen model's outputs against the reference's within 1e-4
(dlrm-intel-small's 100-row bags: 1.2e-5 apart).
Prints what it compared; exits 1 unless all agree.
"""
import argparse
import contextlib
import copy
import json
import os
import sys
import time

# Importing IPEX imports torch._inductor, which starts a pool of compile-worker
# processes (two, ~600 MB each, busy for a second or two) that nothing here uses.
os.environ.setdefault("TORCHINDUCTOR_COMPILE_THREADS", "1")

import torch  # noqa: E402
from torch import nn  # noqa: E402

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from pytorch_dlrm import DLRM as Reference  # noqa: E402  (the same model, weights, index law)
from pytorch_dlrm import indices, spread  # noqa: E402

import intel_extension_for_pytorch as ipex  # noqa: E402
from intel_extension_for_pytorch.cpu.nn import _embeddingbag  # noqa: E402


def refuse(msg):
    sys.exit(f"ipex_dlrm.py: {msg}")


class plain_torch:
    """Inside: PyTorch's own `torch.embedding_bag`. Importing IPEX replaces it
    for every CPU `nn.EmbeddingBag` with IPEX's kernel (`torch_ipex::embedding_bag`);
    the check's reference runs PyTorch's."""

    def __enter__(self):
        self.ipex_bag, torch.embedding_bag = torch.embedding_bag, _embeddingbag.torch_embedding_bag

    def __exit__(self, *exc):
        torch.embedding_bag = self.ipex_bag


def merged_correct(dim, sgd):
    """Whether IPEX's merged tables with the fused optimizer update rows of width
    `dim` correctly on this CPU: one step on a 2-row table, checked. (IPEX 2.8's
    fused backward applies the gradient's first SIMD vector, 16 floats with
    AVX-512 and 8 with AVX2, to every chunk of the row: wrong for wider rows.)"""
    e = nn.EmbeddingBag(2, dim, mode="sum")
    w0 = e.weight.detach().clone()
    cls = ipex.nn.modules.MergedEmbeddingBagWithSGD if sgd else ipex.nn.modules.MergedEmbeddingBagWithAdaGrad
    m = cls.from_embeddingbag_list([e], lr=1.0)
    (out,) = m([torch.tensor([1])], [torch.tensor([0])])
    # Positive in the row's first half, negative in its second: a gradient chunk
    # applied to the wrong columns changes the update under SGD and Adagrad alike.
    j = torch.arange(dim)
    g = ((j + 1.0) * torch.where(j < dim // 2, -1.0, 1.0)).view(1, dim)
    out.backward(g)
    # SGD: w - g; Adagrad's first step: w - g / sqrt(g^2) = w - sign(g).
    want = w0[1] - (g[0] if sgd else g[0].sign())
    return torch.allclose(m.weights[0].detach()[1], want, atol=1e-4) and torch.equal(m.weights[0].detach()[0], w0[0])


class IpexDLRM(nn.Module):
    """The reference's MLPs and tables, IPEX's interaction; the tables either a
    list of `nn.EmbeddingBag` or one merged module taking lists."""

    def __init__(self, ref, emb, merged):
        super().__init__()
        self.bot, self.top, self.emb, self.merged = ref.bot, ref.top, emb, merged

    def forward(self, dense, idx, offsets):
        x = self.bot(dense)
        if self.merged:
            ly = self.emb(list(idx), list(offsets))
        else:
            ly = [e(i, o) for e, i, o in zip(self.emb, idx, offsets)]
        return self.top(ipex.nn.functional.interaction(x, *ly))


def fuse_eltwise(seq):
    """The recipe's Linear + activation fusion after ipex.optimize (training)."""
    for i in range(len(seq) - 1):
        if isinstance(seq[i], ipex.nn.utils._weight_prepack._IPEXLinear):
            act = "relu" if isinstance(seq[i + 1], nn.ReLU) else "sigmoid"
            seq[i] = ipex.nn.modules.IPEXLinearEltwise(seq[i], act)
            seq[i + 1] = nn.Identity()


def build(ref, spec, mode, tables, sample):
    """IPEX's model (and optimizer, for training) over `ref`'s modules (shared,
    not copied: pass a copy to keep `ref`)."""
    lr = spec.get("learning_rate", 0.1)
    eps = spec.get("eps", 1e-10)
    sgd = spec.get("optimizer", "sgd") == "sgd"
    if mode == "infer":
        model = IpexDLRM(ref, ref.emb, merged=False).eval()
        model = ipex.optimize(model, dtype=torch.float32, inplace=True, auto_kernel_selection=True)
        with torch.no_grad():
            model = torch.jit.freeze(torch.jit.trace(model, sample, check_trace=False))
            model(*sample)
            model(*sample)
        return model, None
    merged = tables == "merged" or (tables == "auto" and merged_correct(spec["embedding_dim"], sgd))
    if merged:
        # The recipe's tables: dense-gradient EmbeddingBags merged; the merged
        # module updates its rows inside its backward.
        for e in ref.emb:
            e.sparse = False
        cls = ipex.nn.modules.MergedEmbeddingBagWithSGD if sgd else ipex.nn.modules.MergedEmbeddingBagWithAdaGrad
        kw = {"lr": lr} if sgd else {"lr": lr, "eps": eps}
        emb = cls.from_embeddingbag_list(ref.emb, **kw)
    else:
        emb = ref.emb
    model = IpexDLRM(ref, emb, merged).train()
    # The merged tables' weights get no .grad, so the optimizer skips them.
    if sgd:
        opt = torch.optim.SGD(model.parameters(), lr=lr)
    else:
        opt = torch.optim.Adagrad(model.parameters(), lr=lr, eps=eps)
    model, opt = ipex.optimize(
        model, dtype=torch.float32, optimizer=opt, inplace=True, sample_input=sample, auto_kernel_selection=True
    )
    fuse_eltwise(model.bot)
    fuse_eltwise(model.top)
    return model, opt


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("json")
    ap.add_argument("mode", choices=["train", "infer"])
    ap.add_argument("--iters", type=int, default=30)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--indices", choices=["zipf", "uniform"], default="zipf")
    ap.add_argument("--tables", choices=["auto", "merged", "per-table"], default="auto")
    ap.add_argument("--check", type=int, nargs="?", const=3, default=None, metavar="STEPS")
    a = ap.parse_args()
    torch.set_num_threads(a.threads)
    torch.manual_seed(0)
    spec = json.load(open(a.json))
    if spec.get("interaction", "dot") != "dot":
        refuse(f"interaction {spec['interaction']!r}: IPEX's DLRM recipe (ipex.nn.functional.interaction) is dot only")
    if spec.get("interaction_itself", False):
        refuse("interaction_itself: ipex.nn.functional.interaction keeps only the pairs i < j")
    b = spec["batch_size"]
    pool = spec.get("pooling", 1)
    pools = pool if isinstance(pool, list) else [pool] * len(spec["table_rows"])
    ref = Reference(spec)  # the same draws as scripts/pytorch_dlrm.py: the same weights
    if ref.bot[-2].out_features != spec["embedding_dim"]:
        refuse(f"the bottom MLP must end at embedding_dim {spec['embedding_dim']} for IPEX's interaction")

    def batch():
        # The same draws in the same order as scripts/pytorch_dlrm.py's batch().
        dense = torch.rand(b, spec["dense_features"])
        tables = zip(spec["table_rows"], bijections, pools)
        idx = tuple(indices(rows, b * p, a.indices, bij) for rows, bij, p in tables)
        offsets = tuple(torch.arange(0, b * p, p) for p in pools)
        y = torch.randint(0, 2, (b, 1)).float()
        return dense, idx, offsets, y

    bijections = [spread(rows, t) for t, rows in enumerate(spec["table_rows"])]
    batches = [batch() for _ in range(4)]
    sample = batches[0][:3]
    if a.check is not None:
        check(a, spec, ref, batches, sample)
        return
    model, opt = build(ref, spec, a.mode, a.tables, sample)
    loss_fn = nn.BCELoss()
    warm = 3
    t0 = None
    for it in range(warm + a.iters):
        if it == warm:
            t0 = time.perf_counter()
        dense, idx, offsets, y = batches[it % len(batches)]
        if a.mode == "train":
            opt.zero_grad(set_to_none=True)
            loss = loss_fn(model(dense, idx, offsets), y)
            loss.backward()
            opt.step()
        else:
            with torch.no_grad():
                model(dense, idx, offsets)
    rate = a.iters * b / (time.perf_counter() - t0)
    print(f"{a.mode} {rate:.0f}")


def check_tables(ref, ours, w0):
    """The tables' updates over the steps: ||ipex's - pytorch's|| within 10% of
    ||pytorch's|| for every table. PyTorch's sparse SGD adds a row's updates into
    it one occurrence at a time, each rounded at the weight's ulp, while the
    merged tables sum a row's gradients and apply the sum once (closer to a float64
    update): on the hot rows of tiny tables the two differ by a few percent of the
    update (dlrm-kaggle: 5%). A wrong update (the fused backward's wide-row
    fault) differs by about 100%."""
    theirs = ours.emb.weights if isinstance(ours.emb, ipex.nn.modules.MergedEmbeddingBag) else [e.weight for e in ours.emb]
    worst, at = 0.0, 0
    for t, (e, w, w_0) in enumerate(zip(ref.emb, theirs, w0)):
        upd = (e.weight - w_0).detach()
        rel = ((w - w_0).detach() - upd).norm().item() / max(upd.norm().item(), 1e-30)
        if rel >= worst:
            worst, at = rel, t
    ok = worst <= 0.1
    print(f"check: tables' updates over the steps: worst table {at}: ||ipex - pytorch|| / ||pytorch|| "
          f"{worst:.2g} (<= 0.1: {'ok' if ok else 'FAILED'})")
    return ok


def check(a, spec, ref, batches, sample):
    """This model against scripts/pytorch_dlrm.py's on the same weights and batches."""
    ours, opt = build(copy.deepcopy(ref), spec, a.mode, a.tables, sample)
    loss_fn = nn.BCELoss()
    ok = True
    if a.mode == "train":
        lr = spec.get("learning_rate", 0.1)
        if spec.get("optimizer", "sgd") == "sgd":
            ref_opt = torch.optim.SGD(ref.parameters(), lr=lr)
        else:
            ref_opt = torch.optim.Adagrad(ref.parameters(), lr=lr, eps=spec.get("eps", 1e-10))
        w0 = [e.weight.detach().clone() for e in ref.emb]
        form = "merged" if isinstance(ours.emb, ipex.nn.modules.MergedEmbeddingBag) else "per-table"
        print(f"check: training, tables {form}, {a.check} steps, batch {spec['batch_size']}")
        for it in range(a.check):
            dense, idx, offsets, y = batches[it % len(batches)]
            losses = []
            for model, o in ((ref, ref_opt), (ours, opt)):
                with plain_torch() if model is ref else contextlib.nullcontext():
                    o.zero_grad(set_to_none=True)
                    loss = loss_fn(model(dense, idx, offsets), y)
                    loss.backward()
                    o.step()
                losses.append(loss.item())
            diff = abs(losses[0] - losses[1])
            good = diff <= 1e-5 * abs(losses[0]) + 1e-6
            ok &= good
            print(f"check: step {it} loss pytorch {losses[0]:.7f} ipex {losses[1]:.7f} |diff| {diff:.2g}"
                  f"{'' if good else '  FAILED'}")
        ok &= check_tables(ref, ours, w0)
        tol, what = 1e-4, f"after {a.check} steps"
        ref.eval()
        ours.eval()
    else:
        tol, what = 1e-4, "traced and frozen"
        print(f"check: inference, batch {spec['batch_size']}")
    for k, (dense, idx, offsets, _) in enumerate(batches):
        with torch.no_grad():
            with plain_torch():
                want = ref(dense, idx, offsets)
            err = (want - ours(dense, idx, offsets)).abs().max().item()
        good = err <= tol
        ok &= good
        print(f"check: batch {k} outputs ({what}) max |pytorch - ipex| {err:.2g} (<= {tol:g}: "
              f"{'ok' if good else 'FAILED'})")
    print(f"check: {'ok' if ok else 'FAILED'}")
    sys.exit(0 if ok else 1)


if __name__ == "__main__":
    main()
