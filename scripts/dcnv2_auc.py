#!/usr/bin/env python3
"""DLRM-DCNv2 trained by dlrmc and by PyTorch on the same generated multi-hot data
with the same hyper-parameters: prints both test AUCs and their difference.

usage: dcnv2_auc.py [MODEL.json] [--dir DIR] [--days D] [--per-day N]
                    [--repeats R] [--threads T] [--seed S] [--dlrmc BIN]
                    [--dlrm-run BIN]

MODEL.json (default scripts/dcnv2-auc.json) is a dlrmc description with
`"interaction": "dcn"` and a fixed bag size per table. The data: `D` days of `N`
samples (default 6 x 40,000), written as dlrmc's `ragged-npz` days (`day_<d>.npz`:
`y`, `X_int`, `X_cat_<t>_ids`, `X_cat_<t>_lengths`, `counts`); labels drawn from a
hidden teacher (per-row scalar weights of every table, a pairwise product of two
tables' weights, the log dense features), so there is something to learn.
dlrmc: `dlrmc data convert --format ragged-npz` (days 0..D-2 train, the last day
halved into test then val), `dlrmc compile`, `dlrm-run --data --epochs 1`; the AUC
is the run's final test evaluation. PyTorch: `scripts/pytorch_dlrm.py`'s model
(TorchRec's `LowRankCrossNet` in plain PyTorch) trained one epoch over the same
train days in a seeded shuffled order, dropping the last partial batch as dlrm-run
does, then evaluated on the same test half (`ceil(n/2)` first samples of the last
day), initialised as dlrmc does (the reference DLRM's laws, TorchRec's for the
cross layers). The orders differ (each tool shuffles with its own generator), so the AUCs
agree within noise, not exactly: each tool trains `R` times (default 4) with the
shuffle seeds `S .. S+R-1` and the means are compared. Needs torch and numpy.
"""
import argparse
import json
import math
import os
import subprocess
import sys
import tempfile

import numpy as np
import torch
from torch import nn

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from pytorch_dlrm import DLRM  # noqa: E402

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def teacher(spec, rng):
    rows, pools = spec["table_rows"], spec["pooling"]
    w = [rng.normal(0, 1, r).astype(np.float32) for r in rows]
    a = rng.normal(0, 0.6, len(rows))
    dense_w = rng.normal(0, 0.3, spec["dense_features"])
    return w, a, dense_w, pools


def day(spec, t, n, rng):
    w, a, dense_w, pools = t
    x_int = rng.poisson(rng.uniform(0.5, 20, spec["dense_features"]), (n, spec["dense_features"]))
    logit = np.log1p(x_int) @ dense_w - 1.0
    arrays = {"X_int": x_int.astype(np.int64)}
    bag_means = []
    for k, (rows, p) in enumerate(zip(spec["table_rows"], pools)):
        # Zipf-like ids: a few hot rows, a long tail.
        u = rng.random(n * p)
        ids = np.minimum(np.floor(np.exp(u * math.log(rows + 1)) - 1), rows - 1).astype(np.int64)
        ids = (ids * 7919 + k * 31) % rows
        arrays[f"X_cat_{k}_ids"] = ids
        arrays[f"X_cat_{k}_lengths"] = np.full(n, p, dtype=np.int64)
        m = w[k][ids].reshape(n, p).mean(axis=1)
        bag_means.append(m)
        logit += a[k] * m
    logit += 0.8 * bag_means[0] * bag_means[1]
    y = (rng.random(n) < 1 / (1 + np.exp(-logit))).astype(np.int64)
    arrays["y"] = y
    arrays["counts"] = np.array(spec["table_rows"], dtype=np.int64)
    return arrays


def auc(scores, labels):
    order = np.argsort(scores, kind="mergesort")
    s, y = scores[order], labels[order]
    ranks = np.empty(len(s))
    i = 0
    while i < len(s):  # average ranks of ties
        j = i
        while j + 1 < len(s) and s[j + 1] == s[i]:
            j += 1
        ranks[i : j + 1] = (i + j) / 2 + 1
        i = j + 1
    pos = y.sum()
    neg = len(y) - pos
    return (ranks[y == 1].sum() - pos * (pos + 1) / 2) / (pos * neg)


def tensors(arrays, spec, lo, hi):
    dense = torch.from_numpy(np.log1p(np.maximum(arrays["X_int"][lo:hi], 0)).astype(np.float32))
    idx, offs = [], []
    for k, p in enumerate(spec["pooling"]):
        idx.append(torch.from_numpy(arrays[f"X_cat_{k}_ids"][lo * p : hi * p]))
        offs.append(torch.arange(0, (hi - lo) * p, p))
    y = torch.from_numpy(arrays["y"][lo:hi].astype(np.float32)).view(-1, 1)
    return dense, idx, offs, y


def init_like_dlrmc(model):
    """The reference DLRM's initialisation, which dlrmc uses: tables U(±sqrt(1/rows)),
    linear weights N(0, sqrt(2/(fan_in+fan_out))), biases N(0, sqrt(1/fan_out));
    the cross layers stay TorchRec's (xavier-normal kernels, zero biases), as dlrmc's."""
    with torch.no_grad():
        for e in model.emb:
            n = e.weight.shape[0]
            e.weight.uniform_(-math.sqrt(1 / n), math.sqrt(1 / n))
        for m in list(model.bot) + list(model.top):
            if isinstance(m, nn.Linear):
                fan_out, fan_in = m.weight.shape
                m.weight.normal_(0, math.sqrt(2 / (fan_in + fan_out)))
                m.bias.normal_(0, math.sqrt(1 / fan_out))


def pytorch_auc(spec, days, seed, threads):
    torch.manual_seed(seed)
    torch.set_num_threads(threads)
    model = DLRM(spec)
    init_like_dlrmc(model)
    lr = spec["learning_rate"]
    if spec.get("optimizer", "sgd") == "sgd":
        opt = torch.optim.SGD(model.parameters(), lr=lr)
    else:
        opt = torch.optim.Adagrad(model.parameters(), lr=lr, eps=spec.get("eps", 1e-10))
    loss_fn = nn.BCELoss()
    train = {k: np.concatenate([d[k] for d in days[:-1]]) for k in days[0] if k != "counts"}
    n = len(train["y"])
    b = spec["batch_size"]
    perm = np.random.default_rng(seed).permutation(n)
    shuffled = {k: v for k, v in train.items() if not k.startswith("X_cat")}
    shuffled = {k: v[perm] for k, v in shuffled.items()}
    for k, p in enumerate(spec["pooling"]):
        ids = train[f"X_cat_{k}_ids"].reshape(n, p)[perm].reshape(-1)
        shuffled[f"X_cat_{k}_ids"] = ids
    for s in range(n // b):
        dense, idx, offs, y = tensors(shuffled, spec, s * b, (s + 1) * b)
        opt.zero_grad()
        loss_fn(model(dense, idx, offs), y).backward()
        opt.step()
    last = days[-1]
    half = (len(last["y"]) + 1) // 2
    with torch.no_grad():
        dense, idx, offs, y = tensors(last, spec, 0, half)
        p = model(dense, idx, offs).view(-1).numpy()
    return auc(p, last["y"][:half])


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("json", nargs="?", default=os.path.join(ROOT, "scripts", "dcnv2-auc.json"))
    ap.add_argument("--dir")
    ap.add_argument("--days", type=int, default=6)
    ap.add_argument("--per-day", type=int, default=40000)
    ap.add_argument("--repeats", type=int, default=4)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--dlrmc", default=os.path.join(ROOT, "target", "release", "dlrmc"))
    ap.add_argument("--dlrm-run", default=os.path.join(ROOT, "target", "release", "dlrm-run"))
    a = ap.parse_args()
    spec = json.load(open(a.json))
    if not isinstance(spec.get("pooling"), list):
        spec["pooling"] = [spec.get("pooling", 1)] * len(spec["table_rows"])
    work = a.dir or tempfile.mkdtemp(prefix="dcnv2-auc-")
    os.makedirs(work, exist_ok=True)
    rng = np.random.default_rng(a.seed)
    t = teacher(spec, rng)
    days = [day(spec, t, a.per_day, rng) for _ in range(a.days)]
    files = []
    for d, arrays in enumerate(days):
        f = os.path.join(work, f"day_{d}.npz")
        np.savez(f, **arrays)
        files.append(f)
    ds, plan, metrics = (os.path.join(work, x) for x in ("data.ds", "dcn.plan", "metrics.jsonl"))
    run = lambda *cmd: subprocess.run(cmd, check=True)
    run(a.dlrmc, "data", "convert", "--format", "ragged-npz", *files, "-o", ds, "-q")
    run(a.dlrmc, "compile", a.json, "-o", plan, "-q")
    env = dict(os.environ, RAYON_NUM_THREADS=str(a.threads))
    ours, theirs = [], []
    for seed in range(a.seed, a.seed + a.repeats):
        cmd = [a.dlrm_run, plan, "--data", ds, "--epochs", "1", "--metrics", metrics, "-q"]
        subprocess.run(cmd + ["--seed", str(seed)], check=True, env=env)
        ours.append([json.loads(l) for l in open(metrics)][-1]["auc"])
        theirs.append(pytorch_auc(spec, days, seed, a.threads))
        print(f"seed {seed}: test AUC dlrmc {ours[-1]:.5f}, PyTorch {theirs[-1]:.5f}", flush=True)
    mo, mt = float(np.mean(ours)), float(np.mean(theirs))
    print(f"mean test AUC over {a.repeats} seeds: dlrmc {mo:.5f}, PyTorch {mt:.5f}, difference {mo - mt:+.5f}")
    print(f"(data: {a.days} days x {a.per_day} samples in {work}; model {a.json})")


if __name__ == "__main__":
    main()
