"""Paged attention's decode cases (G1 64 x 640, G2 256 x 384, 1 x 32k) timed as the sources stand: run once
with cp.async as it is and once with an L2 prefetch-size qualifier on it (call6.sh edits mma.cuh between)."""

import sys

import numpy as np
from bench_decode_kernels import attention_case, gpu_ms

from barerl.backend import cuda

label = sys.argv[1] if len(sys.argv) > 1 else "as is"  # call6.sh names the cp.async form it set
rng = np.random.default_rng(0)
for name, contexts in {"G1 64 x 640": np.full(64, 640), "G2 256 x 384": np.full(256, 384),
                       "1 x 32k": np.full(1, 32768)}.items():
    case, nbytes = attention_case(rng, contexts, np.ones(len(contexts), np.int64))
    ms = gpu_ms(cuda.paged_attention, case)
    print(f"{label:8s} {name:14s} {1e3 * ms:7.1f} us  {nbytes / ms / 1e6:6.0f} GB/s", flush=True)
