"""Where batch_invariant's decode time goes (session 7, call 4): paged attention, ordinary vs invariant kernel,
at the G1 / G2 shapes, and the four decode GEMMs of a Qwen3-0.6B layer at 64 / 256 rows, heuristic vs
split-K-free algorithms (CUDA-graph replays; run from the repository root with PYTHONPATH=src:bench)."""

import cupy
import numpy as np
from bench_decode_kernels import BF16, attention_case, gpu_ms

from barerl.backend import cuda
from barerl.kernels import cublaslt

rng = np.random.default_rng(0)
for name, contexts in (("G1 64 x 640", np.full(64, 640)), ("G1 ragged 64 x 128..1152", rng.integers(128, 1153, 64)),
                       ("G2 256 x 384", np.full(256, 384))):
    case, nbytes = attention_case(rng, contexts, np.ones(len(contexts), np.int64))
    for fn in (cuda.paged_attention, cuda.paged_attention_invariant):
        ms = gpu_ms(fn, case)
        print(f"attention {name:26s} {fn.__name__:26s} {1e3 * ms:7.1f} us  {nbytes / ms / 1e9:6.2f} TB/s")
for rows in (64, 256):
    for name, n, k in (("qkv", 4096, 1024), ("o_proj", 1024, 2048), ("gate_up", 6144, 1024), ("down", 1024, 3072)):
        x = cupy.asarray(rng.standard_normal((rows, k), np.float32).astype(BF16))
        ws = [cupy.asarray((rng.standard_normal((n, k), np.float32) * 0.02).astype(BF16)) for _ in range(24)]
        res = cupy.asarray(rng.standard_normal((rows, n), np.float32).astype(BF16))
        line = []
        for invariant in (False, True):
            cublaslt.set_batch_invariant(invariant)

            def run(x=x, ws=ws, res=res, n=n, rows=rows):  # 24 weights: each product streams its own from HBM
                for w in ws:
                    cublaslt.matmul(x, w, cupy.empty((rows, n), BF16), transb=True, beta=1.0, c=res)
            line.append(f"{'invariant' if invariant else 'heuristic'} {1e3 * gpu_ms(run, calls=2) / len(ws):6.2f} us")
        cublaslt.set_batch_invariant(False)
        print(f"gemm {name:8s} {rows:4d} rows: " + ", ".join(line))
