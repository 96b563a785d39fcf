"""Hardware counters for the G1 / G2 decode step's largest kernels (session 15): paged attention at G1 and G2
(with G1's shared prompt blocks), the four products at 64 rows with their residuals, the LM head and the
sampler at 64 and 256 rows. Each op runs once warm before the profiled region (cudaProfilerStart/Stop), so
`ncu --profile-from-start off` sees one launch of each.

    ncu --profile-from-start off --section SpeedOfLight ... python bench/results/session15/ncu_probe.py
"""

import cupy
import numpy as np
from bench_decode_kernels import BF16, attention_case, sample_case

from barerl.backend import cuda


def main() -> None:
    rng = np.random.default_rng(0)
    ops = []
    for lens, shared in ((np.full(64, 640), 0), (np.full(64, 640), 8), (np.full(256, 384), 0)):
        case, _ = attention_case(rng, lens, np.ones(len(lens), np.int64), shared, 8 if shared else 1)
        ops.append((cuda.paged_attention, case))
    for rows in (64,):
        for n, k, residual in ((4096, 1024, False), (1024, 2048, True), (6144, 1024, False), (1024, 3072, True)):
            x = cupy.asarray(rng.standard_normal((rows, k), np.float32).astype(BF16))
            w = cupy.asarray((rng.standard_normal((n, k), np.float32) * 0.02).astype(BF16))
            r = cupy.asarray(rng.standard_normal((rows, n), np.float32).astype(BF16)) if residual else None
            ops.append((cuda.linear, (x, w, None, r)))
    emb = cupy.asarray((rng.standard_normal((151936, 1024), np.float32) * 0.02).astype(BF16))
    for rows in (64, 256):
        h = cupy.asarray(rng.standard_normal((rows, 1024), np.float32).astype(BF16))
        ops.append((cuda.lm_head_logits, (h, emb)))
        case, _ = sample_case(rng, rows, 1.0, 0, 1.0)
        ops.append((cuda.sample, case))
    for fn, args in ops:  # compile, tune, warm
        fn(*args)
    cupy.cuda.Device().synchronize()
    cupy.cuda.runtime.profilerStart()
    for fn, args in ops:
        fn(*args)
        cupy.cuda.Device().synchronize()
    cupy.cuda.runtime.profilerStop()
    print(f"{len(ops)} ops profiled")


if __name__ == "__main__":
    main()
