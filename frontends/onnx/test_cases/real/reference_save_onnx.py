#!/usr/bin/env python3
"""The reference DLRM's own ONNX exports: runs facebookresearch/dlrm's
`dlrm_s_pytorch.py --save-onnx` (unmodified) in both of its input modes and
writes each as a real-export case beside this script:

- `ref_random`: `--data-generation=random` (the default): offsets stacked
  `[T, B]` (`offsets`), one indices vector per table (`indices_<t>`), bags of 1..3
  ids, tables of 40, 25 and 60 rows;
- `ref_kaggle`: `--data-generation=dataset --data-set=kaggle` on a generated
  Criteo Kaggle TSV (`dlrmc data generate`), which the reference preprocesses
  itself: offsets and indices both stacked `[26, B]` (one id a bag), tables capped
  by `--max-ind-range=40`.

Both: TorchScript exporter at the script's own opset 11, embedding dim 8, bottom
MLP 13-16-8, top MLP (computed input)-16-1. Each case gets `inputs_<b>.npz` for
b = 1, 7, 2048 (random inputs in the model's own layout) and `outputs_<b>.npz`
from ONNX Runtime running the reference's file (the exporting framework's
runtime: the script keeps no PyTorch outputs), and `case.json`.

usage: reference_save_onnx.py DLRM_REPO [OUT_DIR] [--commit SHA] [--dlrmc BIN]
  DLRM_REPO: a checkout of facebookresearch/dlrm (e.g. from `git archive`).
Needs: torch, onnx, onnxruntime, numpy, scikit-learn, tensorboard, tqdm,
mlperf-logging; and for the Kaggle mode numpy < 2 on PYTHONPATH first (the
reference's preprocessing stores hashed ids as int32, which numpy 2 refuses:
`pip install --target DIR "numpy<2"`, then `NUMPY1=DIR`). torch >= 2.4 dropped
`profile(use_cuda=...)`, which the reference passes: a `sitecustomize` here drops
that keyword (the only shim; the reference's code is run as it is).
"""
import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile

import numpy as np

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.abspath(os.path.join(HERE, "..", "..", "..", ".."))
SHIM = '''import torch.autograd.profiler as _p
_init = _p.profile.__init__
def _patched(self, *a, use_cuda=None, **k):
    _init(self, *a, **k)
_p.profile.__init__ = _patched
'''
COMMON = ["--arch-sparse-feature-size=8", "--arch-mlp-bot=13-16-8", "--arch-mlp-top=16-1",
          "--mini-batch-size=5", "--num-batches=2", "--save-onnx"]
MODES = {
    "ref_random": ["--arch-embedding-size=40-25-60", "--num-indices-per-lookup=3"],
    "ref_kaggle": ["--data-generation=dataset", "--data-set=kaggle", "--raw-data-file=./train.txt",
                   "--processed-data-file=./kaggleAdDisplayChallenge_processed.npz",
                   "--loss-function=bce", "--round-targets=True", "--max-ind-range=40"],
}


def run_reference(repo, mode, work, dlrmc):
    os.makedirs(work, exist_ok=True)
    shim = os.path.join(work, "shim")
    os.makedirs(shim, exist_ok=True)
    with open(os.path.join(shim, "sitecustomize.py"), "w") as f:
        f.write(SHIM)
    path = [shim]
    if mode == "ref_kaggle":
        subprocess.run([dlrmc, "data", "generate", "--rows", "7000", "--cardinality-scale", "0.0001",
                        "-o", os.path.join(work, "train.txt"), "-q"], check=True)
        if os.environ.get("NUMPY1"):
            path.insert(0, os.environ["NUMPY1"])
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(path))
    cmd = [sys.executable, os.path.join(repo, "dlrm_s_pytorch.py")] + COMMON + MODES[mode]
    subprocess.run(cmd, cwd=work, env=env, check=True, stdout=subprocess.DEVNULL)
    return os.path.join(work, "dlrm_s_pytorch.onnx")


def inputs(model, batch, rng):
    """Random inputs of `batch` samples in the model's own layout."""
    from onnx import numpy_helper
    inits = {i.name: numpy_helper.to_array(i) for i in model.graph.initializer}
    tables = [(int(n.split(".")[1]), t.shape[0]) for n, t in inits.items()
              if n.startswith("emb_l.") and n.endswith(".weight")]
    rows = [r for _, r in sorted(tables)]
    names = [i.name for i in model.graph.input if i.name not in inits]
    feed = {"dense_x": rng.uniform(0, 3, size=(batch, 13)).astype(np.float32)}
    t = len(rows)
    if "indices" in names:  # both stacked [T, B]: one id a bag
        feed["offsets"] = np.tile(np.arange(batch, dtype=np.int64), (t, 1))
        feed["indices"] = np.stack([rng.integers(0, r, size=batch) for r in rows]).astype(np.int64)
        return feed
    offs = []
    for k, r in enumerate(rows):
        lens = rng.integers(1, 4, size=batch)
        offs.append(np.concatenate([[0], np.cumsum(lens)[:-1]]).astype(np.int64))
        feed[f"indices_{k}"] = rng.integers(0, r, size=int(lens.sum())).astype(np.int64)
    feed["offsets"] = np.stack(offs)
    return feed


def table_count(model):
    return sum(1 for i in model.graph.initializer if i.name.startswith("emb_l.") and i.name.endswith(".weight"))


def write_case(name, src, out_dir, repo, commit):
    import onnx
    import onnxruntime as ort
    d = os.path.join(out_dir, name)
    os.makedirs(d, exist_ok=True)
    path = os.path.join(d, "model.onnx")
    shutil.copyfile(src, path)
    model = onnx.load(path)
    sess = ort.InferenceSession(path, providers=["CPUExecutionProvider"])
    rng = np.random.default_rng(7)
    for b in (1, 7, 2048):
        feed = inputs(model, b, rng)
        feed = {i.name: feed[i.name] for i in sess.get_inputs()}
        pred = sess.run(None, feed)[0]
        np.savez(os.path.join(d, f"inputs_{b}.npz"), **feed)
        np.savez(os.path.join(d, f"outputs_{b}.npz"), pred=pred)
    if not commit:
        rev = subprocess.run(["git", "-C", repo, "rev-parse", "HEAD"], capture_output=True, text=True)
        commit = rev.stdout.strip() or "unknown"
    case = {"exporter": "torchscript", "opset": 11, "source": "facebookresearch/dlrm dlrm_s_pytorch.py --save-onnx",
            "reference_commit": commit, "mode": name,
            "outputs_from": "onnxruntime", "inputs": [i.name for i in sess.get_inputs()],
            "outputs": ["pred"], "batches": [1, 7, 2048], "tables": table_count(model)}
    with open(os.path.join(d, "case.json"), "w") as f:
        json.dump(case, f, indent=1, sort_keys=True)
        f.write("\n")
    print(f"{name}: {path} ({os.path.getsize(path)} bytes)")


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("repo")
    ap.add_argument("out", nargs="?", default=HERE)
    ap.add_argument("--commit", help="the reference's commit (default: DLRM_REPO's git HEAD)")
    ap.add_argument("--dlrmc", default=os.path.join(ROOT, "target", "release", "dlrmc"))
    a = ap.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        for mode in MODES:
            onnx_file = run_reference(os.path.abspath(a.repo), mode, os.path.join(tmp, mode), a.dlrmc)
            write_case(mode, onnx_file, a.out, a.repo, a.commit)


if __name__ == "__main__":
    main()
