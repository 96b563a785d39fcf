"""The linear layers' matrix products at T1 and decode shapes: the GemmEx path against cuBLASLt's candidates.

For each Qwen3-0.6B linear layer (qkv, o_proj + residual, gate_up, down + residual) at T1's 18,432 rows and
at G1's 64 decode rows, times: `linear` as shipped (GemmEx: output prefilled with the residual, or split-K
for decode rows), and every algorithm cuBLASLt's heuristic proposes with the residual as C. Also the
backward products at T1 rows (dx = dy w through GemmEx and Lt; dw += dy^T x). Times are CUDA-graph replays
of 10 back-to-back calls (device time, no launch cost), median of 10 replays; each Lt result is checked
against the GemmEx one.

usage: PYTHONPATH=src python bench/bench_gemm.py [--csv out.csv]
"""

from __future__ import annotations

import argparse
import csv

import numpy as np
from bench_kernels import BF16, ceilings, rand, timed

SHAPES = {"qkv": (4096, 1024, False), "o_proj": (1024, 2048, True), "gate_up": (6144, 1024, False),
          "down": (1024, 3072, True)}  # name: (N, K, residual)
ROWS = {"T1": 16 * 1152, "decode": 64}
REPEATS = 10


def replay_us(fn) -> float:
    """Microseconds per call of fn, from a CUDA graph of REPEATS calls."""
    import cupy

    stream = cupy.cuda.Stream(non_blocking=True)
    with stream:
        fn()
        stream.synchronize()
        stream.begin_capture()
        for _ in range(REPEATS):
            fn()
        graph = stream.end_capture()
    return timed(lambda: graph.launch(stream), reps=10, stream=stream) * 1e3 / REPEATS


def rel_err(x, ref) -> float:
    x, ref = x.astype(np.float32), ref.astype(np.float32)
    return float(np.linalg.norm((x - ref).get()) / max(np.linalg.norm(ref.get()), 1e-30))


def forward_rows(rows: int, name: str, n: int, k: int, has_residual: bool) -> list[dict]:
    import cupy

    from barerl.kernels import cublaslt
    from barerl.kernels.linear import linear

    x, w = rand((rows, k)), rand((n, k), scale=0.02)
    residual = rand((rows, n)) if has_residual else None
    flops, nbytes = 2.0 * rows * n * k, 2 * (x.size + w.size + rows * n * (2 if has_residual else 1))
    shipped = linear(x, w, residual=residual)
    out = cupy.empty_like(shipped)
    beta = 1.0 if has_residual else 0.0
    rows_out = [dict(case=f"{name} fwd", rows=rows, variant="linear (GemmEx)",
                     us=replay_us(lambda: linear(x, w, residual=residual)), flops=flops, bytes=nbytes, err=0.0)]
    for i in range(cublaslt.candidates(x, w, out, transb=True, c=residual)):
        def call(i=i):
            cublaslt.matmul(x, w, out, transb=True, beta=beta, c=residual, algo=i)
        us = replay_us(call)
        call()
        rows_out.append(dict(case=f"{name} fwd", rows=rows, variant=f"Lt #{i}", us=us, flops=flops, bytes=nbytes,
                             err=rel_err(out, shipped)))
    return rows_out


def backward_rows(rows: int, name: str, n: int, k: int) -> list[dict]:
    import cupy

    from barerl.kernels import cublaslt
    from barerl.kernels.cublas import gemm

    dy, w, x = rand((rows, n)), rand((n, k), scale=0.02), rand((rows, k))
    flops, nbytes = 2.0 * rows * n * k, 2 * (dy.size + w.size + x.size)
    dx_ref = gemm(dy, w, cupy.empty((rows, k), BF16))
    dx = cupy.empty_like(dx_ref)
    dw = cupy.zeros((n, k), np.float32)
    out = [dict(case=f"{name} dx", rows=rows, variant="GemmEx", us=replay_us(lambda: gemm(dy, w, dx_ref)),
                flops=flops, bytes=nbytes, err=0.0),
           dict(case=f"{name} dw", rows=rows, variant="GemmEx",
                us=replay_us(lambda: gemm(dy, x, dw, transa=True, beta=1.0)), flops=flops, bytes=nbytes, err=0.0)]
    for i in range(cublaslt.candidates(dy, w, dx)):
        def call(i=i):
            cublaslt.matmul(dy, w, dx, algo=i)
        us = replay_us(call)
        call()
        out.append(dict(case=f"{name} dx", rows=rows, variant=f"Lt #{i}", us=us, flops=flops, bytes=nbytes,
                        err=rel_err(dx, dx_ref)))
    for i in range(cublaslt.candidates(dy, x, dw, transa=True)):
        out.append(dict(case=f"{name} dw", rows=rows, variant=f"Lt #{i}", flops=flops, bytes=nbytes, err=0.0,
                        us=replay_us(lambda i=i: cublaslt.matmul(dy, x, dw, transa=True, beta=1.0, algo=i))))
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--csv", default=None)
    args = parser.parse_args()
    bandwidth, tflops = ceilings()
    print(f"ceilings: copy {bandwidth:.0f} GB/s, bf16 GEMM {tflops:.0f} TFLOP/s")
    results = []
    for label, rows in ROWS.items():
        for name, (n, k, has_residual) in SHAPES.items():
            results += forward_rows(rows, name, n, k, has_residual)
            if label == "T1":
                results += backward_rows(rows, name, n, k)
    print(f"{'case':<14}{'rows':>7}  {'variant':<16}{'us':>9}{'TFLOP/s':>9}{'GB/s':>8}{'rel err':>10}")
    for r in results:
        print(f"{r['case']:<14}{r['rows']:>7}  {r['variant']:<16}{r['us']:>9.2f}{r['flops'] / r['us'] / 1e6:>9.1f}"
              f"{r['bytes'] / r['us'] / 1e3:>8.0f}{r['err']:>10.1e}")
    if args.csv:
        with open(args.csv, "w", newline="") as f:
            writer = csv.DictWriter(f, fieldnames=list(results[0]))
            writer.writeheader()
            writer.writerows(results)


if __name__ == "__main__":
    main()
