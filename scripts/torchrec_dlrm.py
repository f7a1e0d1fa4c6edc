#!/usr/bin/env python3
"""TorchRec's DLRM (`torchrec.models.dlrm.DLRM_DCN`, or `DLRM` for the dot
interaction) built from a dlrmc JSON description, timed on random batches on the
CPU: prints `train SAMPLES_PER_S` or `infer SAMPLES_PER_S` (one line), like
scripts/pytorch_dlrm.py, for scripts/measure-dcnv2 (DLRM_DCN) and
scripts/measure-peers (DLRM, the four dot shapes).

usage: torchrec_dlrm.py MODEL.json train|infer [--iters N] [--threads T]
                        [--indices zipf|uniform] [--check [STEPS]]

TorchRec's own modules throughout: the tables are one `FusedEmbeddingBagCollection`
(`EmbeddingBagConfig` per table, feature `f{t}`; FBGEMM's
`SplitTableBatchedEmbeddingBagsCodegen` on the CPU, all tables in one batched
kernel, the optimizer fused into its backward), fed a `KeyedJaggedTensor`
(`from_lengths_sync`, every bag of table t holding `pooling_t` ids); `DLRM_DCN`
(`DenseArch` / `InteractionDCNArch` over `LowRankCrossNet` / `OverArch`) or
`DLRM` (`InteractionArch`), wrapped in `DLRMTrain` (`BCEWithLogitsLoss` on the
logits; inference applies `torch.sigmoid` to them, as dlrmc's plan returns
probabilities). The JSON's optimizer: `rowwise_adagrad` -> tables
`EXACT_ROWWISE_ADAGRAD` (`torchrec.optim.RowWiseAdagrad`), `adagrad` ->
`EXACT_ADAGRAD`, `sgd` -> `EXACT_SGD`, with the JSON's `learning_rate` and `eps`;
the dense parameters (MLPs, cross layers) `torch.optim.Adagrad` (or `SGD`) with the
same rate and eps.

Inputs as scripts/pytorch_dlrm.py makes them (its `indices` and `spread` are
imported: the same index law, by default dlrm-run's Zipf-like one through the same
per-table bijection, the same seed): 4 batches made beforehand, cycled; 3 warm-up
steps, then `--iters` timed steps.

Not expressible in TorchRec's models (refused): `interaction: "cat"`,
`interaction_itself`, and tables of different widths (one `embedding_dim` here
anyway). `--check [STEPS]` (a small model, e.g. examples/dlrm-dcnv2-tiny.json):
the collection's pooled output against `torch.nn.functional.embedding_bag` on its
own weights, then STEPS (default 60) training steps on the 4 batches, printing the
loss every 10th; exits 1 unless the loss fell.
"""
import argparse
import json
import os
import sys
import time

import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from pytorch_dlrm import indices, spread, widths  # noqa: E402  (the same index law)

from torchrec.datasets.utils import Batch  # noqa: E402
from torchrec.models.dlrm import DLRM, DLRM_DCN, DLRMTrain  # noqa: E402
from torchrec.modules.embedding_configs import EmbeddingBagConfig, PoolingType  # noqa: E402
from torchrec.modules.fused_embedding_modules import FusedEmbeddingBagCollection  # noqa: E402
from torchrec.optim import RowWiseAdagrad  # noqa: E402
from torchrec.sparse.jagged_tensor import KeyedJaggedTensor  # noqa: E402


def refuse(msg):
    sys.exit(f"torchrec_dlrm.py: {msg}")


def build(spec):
    """DLRMTrain(DLRM_DCN | DLRM) over a FusedEmbeddingBagCollection, and the
    optimizer for the dense parameters."""
    inter = spec.get("interaction", "dot")
    if inter == "cat":
        refuse("interaction \"cat\" has no TorchRec model (DLRM is dot, DLRM_DCN is dcn)")
    if spec.get("interaction_itself", False):
        refuse("interaction_itself: TorchRec's InteractionArch keeps only the pairs i < j")
    d = spec["embedding_dim"]
    bot = widths(spec["bottom_mlp"])
    if bot[-1] != d:
        refuse(f"the bottom MLP must end at embedding_dim {d} for TorchRec's models, got {bot[-1]}")
    mode = spec.get("pooling_mode", "sum")
    tables = [
        EmbeddingBagConfig(
            name=f"t{t}",
            embedding_dim=d,
            num_embeddings=rows,
            feature_names=[f"f{t}"],
            pooling=PoolingType.SUM if mode == "sum" else PoolingType.MEAN,
        )
        for t, rows in enumerate(spec["table_rows"])
    ]
    lr = spec.get("learning_rate", 0.1)
    eps = spec.get("eps", 1e-10)
    opt = spec.get("optimizer", "sgd")
    if opt == "sgd":
        emb_opt, emb_kw = torch.optim.SGD, {"lr": lr}
    elif opt == "adagrad":
        emb_opt, emb_kw = torch.optim.Adagrad, {"lr": lr, "eps": eps}
    elif opt == "rowwise_adagrad":
        emb_opt, emb_kw = RowWiseAdagrad, {"lr": lr, "eps": eps}
    else:
        refuse(f"unknown optimizer {opt!r}")
    ebc = FusedEmbeddingBagCollection(
        tables=tables, optimizer_type=emb_opt, optimizer_kwargs=emb_kw, device=torch.device("cpu")
    )
    common = dict(
        embedding_bag_collection=ebc,
        dense_in_features=spec["dense_features"],
        dense_arch_layer_sizes=bot[1:],
        over_arch_layer_sizes=widths(spec["top_mlp"]),
    )
    if inter == "dcn":
        model = DLRM_DCN(
            **common, dcn_num_layers=spec.get("dcn_layers", 3), dcn_low_rank_dim=spec["dcn_low_rank"]
        )
    else:
        model = DLRM(**common)
    train = DLRMTrain(model)
    # The collection's weights show up as parameters (views of FBGEMM's buffer) but
    # its fused optimizer updates them inside the backward: the dense optimizer
    # takes every other parameter.
    dense = [p for n, p in train.named_parameters() if ".embedding_bag_collection." not in n]
    if opt == "sgd":
        dense_opt = torch.optim.SGD(dense, lr=lr)
    else:
        dense_opt = torch.optim.Adagrad(dense, lr=lr, eps=eps)
    return train, ebc, dense_opt


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("json")
    ap.add_argument("mode", choices=["train", "infer"])
    ap.add_argument("--iters", type=int, default=30)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--indices", choices=["zipf", "uniform"], default="zipf")
    ap.add_argument("--check", type=int, nargs="?", const=60, default=None, metavar="STEPS")
    a = ap.parse_args()
    torch.set_num_threads(a.threads)
    torch.manual_seed(0)
    spec = json.load(open(a.json))
    b = spec["batch_size"]
    pool = spec.get("pooling", 1)
    pools = pool if isinstance(pool, list) else [pool] * len(spec["table_rows"])
    train, ebc, dense_opt = build(spec)
    keys = [f"f{t}" for t in range(len(spec["table_rows"]))]

    def batch():
        # The same draws in the same order as scripts/pytorch_dlrm.py's batch().
        dense = torch.rand(b, spec["dense_features"])
        tables = zip(spec["table_rows"], bijections, pools)
        idx = [indices(rows, b * p, a.indices, bij) for rows, bij, p in tables]
        y = torch.randint(0, 2, (b, 1)).float()
        kjt = KeyedJaggedTensor.from_lengths_sync(
            keys=keys,
            values=torch.cat(idx),
            lengths=torch.cat([torch.full((b,), p, dtype=torch.int64) for p in pools]),
        )
        return Batch(dense_features=dense, sparse_features=kjt, labels=y.squeeze(1)), idx

    bijections = [spread(rows, t) for t, rows in enumerate(spec["table_rows"])]
    made = [batch() for _ in range(4)]
    batches = [m[0] for m in made]

    def step(bt):
        dense_opt.zero_grad()
        loss, _ = train(bt)
        loss.backward()  # the tables are updated here (fused)
        dense_opt.step()
        return loss

    if a.check is not None:
        check(spec, ebc, made, pools, a.check, step)
        return

    if a.mode == "infer":
        train.eval()
    warm = 3
    t0 = None
    for it in range(warm + a.iters):
        if it == warm:
            t0 = time.perf_counter()
        bt = batches[it % len(batches)]
        if a.mode == "train":
            step(bt)
        else:
            with torch.no_grad():
                torch.sigmoid(train.model(bt.dense_features, bt.sparse_features))
    rate = a.iters * b / (time.perf_counter() - t0)
    print(f"{a.mode} {rate:.0f}")


def check(spec, ebc, made, pools, steps, step):
    bt, idx = made[0]
    b = spec["batch_size"]
    with torch.no_grad():
        got = ebc(bt.sparse_features).values()
        want = []
        for t, w in enumerate(ebc.embedding_bags[f"t{t}"].weight for t in range(len(pools))):
            off = torch.arange(0, b * pools[t], pools[t])
            want.append(torch.nn.functional.embedding_bag(idx[t], w, off, mode=spec.get("pooling_mode", "sum")))
        want = torch.cat(want, dim=1)
    err = (got - want).abs().max().item()
    print(f"check: pooled embeddings [{got.shape[0]}, {got.shape[1]}] vs F.embedding_bag: max |diff| {err:.3g}")
    before = [ebc.embedding_bags[f"t{t}"].weight.detach().clone() for t in range(len(pools))]
    losses = []
    for it in range(steps):
        losses.append(step(made[it % len(made)][0]).item())
        if it % 10 == 0 or it == steps - 1:
            print(f"check: step {it:4d} loss {losses[-1]:.6f}")
    moved = sum(int(not torch.equal(w0, ebc.embedding_bags[f"t{t}"].weight)) for t, w0 in enumerate(before))
    print(f"check: {moved} of {len(pools)} tables updated by the fused optimizer")
    first, last = sum(losses[:4]) / 4, sum(losses[-4:]) / 4
    ok = err < 1e-5 and last < first and moved == len(pools)
    print(f"check: mean loss of the first 4 steps {first:.6f}, of the last 4 {last:.6f}: {'ok' if ok else 'FAILED'}")
    sys.exit(0 if ok else 1)


if __name__ == "__main__":
    main()
