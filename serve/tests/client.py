#!/usr/bin/env python3
"""dlrm-serve driven by a real client: Triton's `tritonclient[http]`.

Run by serve/tests/client.rs (which starts the server on ts17_dot_stacked's plan
and installs tritonclient into a venv under target/); by hand:

    python3 serve/tests/client.py --url localhost:8000 --model dlrm \
        --case frontends/onnx/test_cases/real/ts17_dot_stacked

Checks, failing with a message naming what differs:
- health, readiness and the metadata in the model's own names;
- the case's inputs (batches 1 and 7) in JSON tensors and in binary tensors
  (tritonclient's default) give PyTorch's outputs (outputs_*.npz) within 1e-5;
- random requests of 1 to 9 samples sent concurrently (async_infer, 8 at a time)
  give the answers they get one at a time within 1e-6, and /metrics shows
  batches that merged several requests;
- a bad request is refused with tritonclient's exception naming the input.
"""

import argparse
import sys
import time
import urllib.request

import numpy as np
import tritonclient.http as httpclient
from tritonclient.utils import InferenceServerException


def fail(msg):
    print(f"client.py: FAIL: {msg}", file=sys.stderr)
    sys.exit(1)


def make_inputs(arrays, binary):
    inputs = []
    for name, a in arrays:
        dtype = "INT64" if a.dtype.kind == "i" else "FP32"
        a = a.astype(np.int64 if dtype == "INT64" else np.float32)
        t = httpclient.InferInput(name, list(a.shape), dtype)
        t.set_data_from_numpy(a, binary_data=binary)
        inputs.append(t)
    return inputs


def infer(client, model, arrays, binary):
    outputs = [httpclient.InferRequestedOutput("pred", binary_data=binary)]
    r = client.infer(model, make_inputs(arrays, binary), outputs=outputs)
    return r.as_numpy("pred")


def random_request(rng, case, b):
    """b samples: dense features, bags of 0..3 of the case's own ids, stacked offsets."""
    width = case["dense_x"].shape[1]
    arrays = [("dense_x", rng.random((b, width), dtype=np.float32))]
    offsets, bags = [], []
    for t in range(3):
        pool = case[f"indices_{t}"]
        lens = rng.integers(0, 4, size=b)
        offsets.append(np.concatenate([[0], np.cumsum(lens)[:-1]]))
        bags.append((f"indices_{t}", rng.choice(pool, size=int(lens.sum()))))
    arrays.append(("offsets", np.stack(offsets).astype(np.int64)))
    return arrays + bags


def metric(url, prefix):
    text = urllib.request.urlopen(f"http://{url}/metrics").read().decode()
    for line in text.splitlines():
        if line.startswith(prefix):
            return float(line.rsplit(" ", 1)[1])
    fail(f"no {prefix} in /metrics:\n{text}")


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--url", required=True)
    p.add_argument("--model", default="dlrm")
    p.add_argument("--case", required=True)
    args = p.parse_args()
    client = httpclient.InferenceServerClient(args.url, concurrency=8)
    if not client.is_server_live():
        fail("server not live")
    # Ready once the warm-up has compiled the padded batch sizes.
    waited = 0.0
    while not client.is_server_ready():
        if waited > 60:
            fail("server not ready after 60 s")
        time.sleep(0.05)
        waited += 0.05
    if not client.is_model_ready(args.model):
        fail("model not ready")
    meta = client.get_model_metadata(args.model)
    names = [i["name"] for i in meta["inputs"]]
    if names != ["dense_x", "offsets", "indices_0", "indices_1", "indices_2"]:
        fail(f"metadata inputs {names}")

    for batch in (1, 7):
        case = np.load(f"{args.case}/inputs_{batch}.npz")
        want = np.load(f"{args.case}/outputs_{batch}.npz")["pred"]
        arrays = [(n, case[n]) for n in names]
        for binary in (False, True):
            got = infer(client, args.model, arrays, binary)
            worst = float(np.abs(got - want).max())
            if got.shape != want.shape or worst > 1e-5:
                fail(f"batch {batch}, binary={binary}: shape {got.shape}, "
                     f"differs from PyTorch by {worst}")
            print(f"batch {batch} binary={binary}: within {worst:.2e} of PyTorch")

    case = np.load(f"{args.case}/inputs_7.npz")
    rng = np.random.default_rng(7)
    reqs = [random_request(rng, case, 1 + (i * 5) % 9) for i in range(32)]
    alone = [infer(client, args.model, r, True) for r in reqs]
    merged_before = metric(args.url, "dlrm_serve_batch_requests_count")
    pending = [client.async_infer(
        args.model, make_inputs(r, i % 2 == 0),
        outputs=[httpclient.InferRequestedOutput("pred", binary_data=i % 2 == 0)])
        for i, r in enumerate(reqs)]
    for i, (h, want) in enumerate(zip(pending, alone)):
        got = h.get_result().as_numpy("pred")
        worst = float(np.abs(got - want).max())
        if got.shape != want.shape or worst > 1e-6:
            fail(f"concurrent request {i}: shape {got.shape}, differs by {worst}")
    batches = metric(args.url, "dlrm_serve_batch_requests_count") - merged_before
    if batches >= len(reqs):
        fail(f"{len(reqs)} concurrent requests ran in {batches} batches: none merged")
    print(f"{len(reqs)} concurrent requests: the answers alone, in {batches:.0f} batches")

    bad = [(n, case[n]) for n in names]
    bad[2] = ("indices_0", np.full_like(case["indices_0"], 10**6))
    try:
        infer(client, args.model, bad, True)
        fail("an id out of range was answered")
    except InferenceServerException as e:
        if "1000000" not in str(e):
            fail(f"the error does not name the id: {e}")
        print(f"bad request refused: {e}")
    print("client.py: ok")


if __name__ == "__main__":
    main()
