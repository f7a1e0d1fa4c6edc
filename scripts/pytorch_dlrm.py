#!/usr/bin/env python3
"""The reference DLRM (facebookresearch/dlrm `dlrm_s_pytorch.py`: its layers,
interaction, sparse embedding gradients and SGD) in PyTorch, built from a dlrmc
JSON description, timed on random batches: prints `train SAMPLES_PER_S` or
`infer SAMPLES_PER_S` (one line) for scripts/measure-peers.

usage: pytorch_dlrm.py MODEL.json train|infer [--iters N] [--threads T]
                       [--indices zipf|uniform]

The timed steps cycle 4 batches made beforehand. Their indices follow dlrm-run's
synthetic law by default (`zipf`: P(rank < r) = ln(r+1)/ln(rows+1), the ranks
spread over the table by a fixed bijection), so that both tools gather rows with
the same locality; `uniform` draws every row alike.

As the reference: `nn.EmbeddingBag(mode="sum", sparse=True)` per table, fed
`(indices, offsets)` (a per-table `pooling` list gives each table its bag size);
MLPs of `nn.Linear` + `ReLU` (the top MLP's last layer `Sigmoid`); the `dot`
interaction as `torch.bmm(T, T^T)` and the strict lower triangle gathered by index
(`interaction_itself` adds the diagonal); `dcn` (DLRM-DCNv2) as TorchRec's
`LowRankCrossNet` written in plain PyTorch (`x_{l+1} = x0 * (W_l (V_l x_l) + b_l)
+ x_l`, xavier-normal kernels, zero biases) over the concatenation; BCE loss on
the probabilities; `torch.optim.SGD`, or for `adagrad` and `rowwise_adagrad`
`torch.optim.Adagrad` (sparse gradients for the tables; PyTorch has no row-wise
form, so its tables keep an accumulator per element). Needs `torch` (a CUDA build
runs on the CPU too).
"""
import argparse
import json
import math
import time

import torch
from torch import nn


def widths(v):
    """An MLP's widths as the JSON writes them: a list, or "13-512-256"."""
    return [int(x) for x in (v.split("-") if isinstance(v, str) else v)]


class DLRM(nn.Module):
    def __init__(self, spec):
        super().__init__()
        d = spec["embedding_dim"]
        self.emb = nn.ModuleList(
            nn.EmbeddingBag(rows, d, mode=spec.get("pooling_mode", "sum"), sparse=True)
            for rows in spec["table_rows"]
        )
        self.bot = self.mlp(widths(spec["bottom_mlp"]), last_sigmoid=False)
        f = len(spec["table_rows"]) + 1
        self.itself = spec.get("interaction_itself", False)
        off = 0 if self.itself else -1
        li, lj = torch.tril_indices(f, f, offset=off)
        self.li, self.lj = li, lj
        self.dot = spec.get("interaction", "dot") == "dot"
        bot_out = widths(spec["bottom_mlp"])[-1]
        width = d + len(li) if self.dot else bot_out + d * (f - 1)
        self.cross = None
        if spec.get("interaction") == "dcn":
            self.cross = LowRankCrossNet(width, spec.get("dcn_layers", 3), spec["dcn_low_rank"])
        self.top = self.mlp([width] + widths(spec["top_mlp"]), last_sigmoid=True)

    @staticmethod
    def mlp(sizes, last_sigmoid):
        layers = []
        for i, (a, b) in enumerate(zip(sizes, sizes[1:])):
            layers.append(nn.Linear(a, b))
            last = i == len(sizes) - 2
            layers.append(nn.Sigmoid() if last and last_sigmoid else nn.ReLU())
        return nn.Sequential(*layers)

    def forward(self, dense, idx, offsets):
        x = self.bot(dense)
        ly = [e(i, o) for e, i, o in zip(self.emb, idx, offsets)]
        if self.dot:
            t = torch.cat([x] + ly, dim=1).view(x.shape[0], -1, x.shape[1])
            z = torch.bmm(t, torch.transpose(t, 1, 2))
            r = torch.cat([x, z[:, self.li, self.lj]], dim=1)
        else:
            r = torch.cat([x] + ly, dim=1)
            if self.cross is not None:
                r = self.cross(r)
        return self.top(r)


class LowRankCrossNet(nn.Module):
    """TorchRec's `LowRankCrossNet` (torchrec/modules/crossnet.py) in plain PyTorch."""

    def __init__(self, width, layers, rank):
        super().__init__()
        xavier = lambda *shape: nn.Parameter(nn.init.xavier_normal_(torch.empty(*shape)))
        self.v = nn.ParameterList(xavier(rank, width) for _ in range(layers))
        self.w = nn.ParameterList(xavier(width, rank) for _ in range(layers))
        self.b = nn.ParameterList(nn.Parameter(torch.zeros(width)) for _ in range(layers))

    def forward(self, x0):
        x = x0
        for v, w, b in zip(self.v, self.w, self.b):
            x = x0 * (nn.functional.linear(nn.functional.linear(x, v), w) + b) + x
        return x


def spread(rows, t):
    """Table `t`'s fixed bijection of ranks onto rows, `r·m + c mod rows` (m
    coprime to rows): the same hot rows in every batch, as dlrm-run's."""
    g = torch.Generator().manual_seed(1000 + t)
    m = 1 + int(torch.randint(0, rows, (1,), generator=g))
    while math.gcd(m, rows) != 1:
        m += 1
    return m, int(torch.randint(0, rows, (1,), generator=g))


def indices(rows, n, law, bijection):
    """`n` row indices below `rows`: uniform, or dlrm-run's Zipf-like law (rank
    r with probability about 1/(r+1)) mapped through the table's `bijection`."""
    if law == "uniform":
        return torch.randint(0, rows, (n,))
    u = torch.rand(n, dtype=torch.float64)
    rank = torch.floor(torch.exp(u * math.log(rows + 1)) - 1).clamp(0, rows - 1).to(torch.int64)
    m, c = bijection
    return (rank * m + c) % rows


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("json")
    ap.add_argument("mode", choices=["train", "infer"])
    ap.add_argument("--iters", type=int, default=30)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--indices", choices=["zipf", "uniform"], default="zipf")
    a = ap.parse_args()
    torch.set_num_threads(a.threads)
    torch.manual_seed(0)
    spec = json.load(open(a.json))
    b = spec["batch_size"]
    pool = spec.get("pooling", 1)
    pools = pool if isinstance(pool, list) else [pool] * len(spec["table_rows"])
    model = DLRM(spec)
    lr = spec.get("learning_rate", 0.1)
    if spec.get("optimizer", "sgd") == "sgd":
        opt = torch.optim.SGD(model.parameters(), lr=lr)
    else:
        opt = torch.optim.Adagrad(model.parameters(), lr=lr, eps=spec.get("eps", 1e-10))
    loss_fn = nn.BCELoss()

    def batch():
        dense = torch.rand(b, spec["dense_features"])
        tables = zip(spec["table_rows"], bijections, pools)
        idx = [indices(rows, b * p, a.indices, bij) for rows, bij, p in tables]
        offsets = [torch.arange(0, b * p, p) for p in pools]
        y = torch.randint(0, 2, (b, 1)).float()
        return dense, idx, offsets, y

    bijections = [spread(rows, t) for t, rows in enumerate(spec["table_rows"])]
    batches = [batch() for _ in range(4)]
    warm = 3
    t0 = None
    for it in range(warm + a.iters):
        if it == warm:
            t0 = time.perf_counter()
        dense, idx, offsets, y = batches[it % len(batches)]
        if a.mode == "train":
            opt.zero_grad()
            loss = loss_fn(model(dense, idx, offsets), y)
            loss.backward()
            opt.step()
        else:
            with torch.no_grad():
                model(dense, idx, offsets)
    rate = a.iters * b / (time.perf_counter() - t0)
    print(f"{a.mode} {rate:.0f}")


if __name__ == "__main__":
    main()
