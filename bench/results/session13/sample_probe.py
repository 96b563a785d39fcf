"""The sampler at the decode bench's batches, in one process: every row through the chunk passes (A), and
sample_plain_rows (B) at 512 and 1024 threads per CTA for Qwen's 5 chunks a CTA."""

import numpy as np
from bench_decode_kernels import VOCAB, gpu_ms, sample_case

from barerl.backend import cuda
from barerl.kernels import sampling

FORMS = {"A chunk passes": (False, 5), "B plain rows, 1024 threads": (True, 5), "B plain rows, 512 threads": (True, 6)}
MODES = {"greedy": (0.0, 0, 1.0), "temperature 1": (1.0, 0, 1.0), "temperature 0.7": (0.7, 0, 1.0),
         "top-k 50": (1.0, 50, 1.0), "top-p 0.9": (1.0, 0, 0.9)}
rng = np.random.default_rng(0)
for mode, (t, top_k, top_p) in MODES.items():
    for rows in (64, 256):
        case, nbytes = sample_case(rng, rows, t, top_k, top_p)
        for form, (plain, wide_from) in FORMS.items():
            sampling._PLAIN_ROWS, sampling._PLAIN_WIDE_FROM = plain, wide_from
            ms = gpu_ms(cuda.sample, case)
            print(f"sample {rows:3d} x {VOCAB} {mode:16s} {form:28s} {1e3 * ms:7.1f} us", flush=True)
