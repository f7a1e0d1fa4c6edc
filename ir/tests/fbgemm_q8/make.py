#!/usr/bin/env python3
"""Writes FBGEMM's own fused 8-bit row-wise quantization of random tables, the
fixture of ir/tests/embedding_bag_q8.rs (dlrmc's quantizer must write the same
bytes).

Run with a Python that has torch and fbgemm_gpu (the TorchRec peer's venv:
`../shared/tools/install-peers trec`):

    /tmp/peers-trec/venv/bin/python ir/tests/fbgemm_q8/make.py

For each width D in 1, 7, 16, 64, 128 it draws 37 rows of f32 (normal, scaled per
row by 10^U(-4, 2), shifted by U(-3, 3)), with row 0 constant, row 1 all zero,
row 2 one nonzero element and row 3 holding a subnormal, then writes
`d{D}.f32` (the rows, little-endian f32) and `d{D}.u8`
(`torch.ops.fbgemm.FloatToFused8BitRowwiseQuantized` of them: D codes, then the
row's f32 scale and bias, per row).
"""
import os
import numpy as np
import torch
import fbgemm_gpu  # noqa: F401  (registers torch.ops.fbgemm)

HERE = os.path.dirname(os.path.abspath(__file__))
rng = np.random.default_rng(20261129)
for d in (1, 7, 16, 64, 128):
    rows = 37
    x = rng.standard_normal((rows, d)).astype(np.float32)
    x *= (10.0 ** rng.uniform(-4, 2, size=(rows, 1))).astype(np.float32)
    x += rng.uniform(-3, 3, size=(rows, 1)).astype(np.float32)
    x[0, :] = 0.25
    x[1, :] = 0.0
    x[2, :] = 0.0
    x[2, d // 2] = -1.5
    x[3, 0] = np.float32(1e-40)
    q = torch.ops.fbgemm.FloatToFused8BitRowwiseQuantized(torch.from_numpy(x)).numpy()
    assert q.shape == (rows, d + 8) and q.dtype == np.uint8
    x.astype("<f4").tofile(os.path.join(HERE, f"d{d}.f32"))
    q.tofile(os.path.join(HERE, f"d{d}.u8"))
    print(f"d={d}: {rows} rows")
print("torch", torch.__version__, "fbgemm_gpu", getattr(fbgemm_gpu, "__version__", "?"))
