"""The linear layers' matrix products at T1 and decode shapes: the GemmEx path against cuBLASLt's candidates.

For each Qwen3-0.6B linear layer (qkv, o_proj + residual, gate_up, down + residual) at T1's 18,432 rows and
at G1's 64 decode rows, times: `linear` as shipped (cuBLASLt's tuned choice; split-K for decode rows with a
long K), every algorithm cuBLASLt's heuristic proposes with the residual as C, and the tuned choice. Also the
backward products at T1 rows (dx = dy w, dw += dy^T x) through GemmEx and Lt. Times are CUDA-graph replays
of 10 back-to-back calls (device time, no launch cost), median of 10 replays; results are checked against
GemmEx's (relative error).

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


def result(case: str, rows: int, variant: str, us: float, flops: float, nbytes: int, err: float = 0.0) -> dict:
    return {"case": case, "rows": rows, "variant": variant, "us": us, "flops": flops, "bytes": nbytes, "err": err}


def lt_variants(case: str, rows: int, call, flops: float, nbytes: int, count: int, check) -> list[dict]:
    """call(algo) for each candidate index, then None (the tuned choice); check() -> error of the last call."""
    out = []
    for algo in [*range(count), None]:
        us = replay_us(lambda algo=algo: call(algo))
        call(algo)
        out.append(result(case, rows, "Lt tuned" if algo is None else f"Lt #{algo}", us, flops, nbytes, check()))
    return out


def forward_rows(rows: int, name: str, n: int, k: int, has_residual: bool) -> list[dict]:
    import cupy

    from barerl.kernels import cublaslt
    from barerl.kernels.cublas import gemm
    from barerl.kernels.linear import linear

    x, w = rand((rows, k)), rand((n, k), scale=0.02)
    residual = rand((rows, n)) if has_residual else None
    flops, nbytes = 2.0 * rows * n * k, 2 * (x.size + w.size + rows * n * (2 if has_residual else 1))
    want = gemm(x, w, residual.copy() if has_residual else cupy.empty((rows, n), BF16), transb=True,
                beta=1.0 if has_residual else 0.0)
    out = cupy.empty_like(want)
    case = f"{name} fwd"
    rows_out = [result(case, rows, "linear", replay_us(lambda: linear(x, w, residual=residual)), flops, nbytes,
                       rel_err(linear(x, w, residual=residual), want))]
    count = cublaslt.candidates(x, w, out, transb=True, c=residual)
    return rows_out + lt_variants(
        case, rows, lambda algo: cublaslt.matmul(x, w, out, transb=True, beta=1.0 if has_residual else 0.0,
                                                 c=residual, algo=algo),
        flops, nbytes, count, lambda: rel_err(out, want))


def backward_rows(rows: int, name: str, n: int, k: int) -> list[dict]:
    import cupy

    from barerl.kernels import cublaslt
    from barerl.kernels.cublas import gemm

    dy, w, x = rand((rows, n)), rand((n, k), scale=0.02), rand((rows, k))
    flops, nbytes = 2.0 * rows * n * k, 2 * (dy.size + w.size + x.size)
    dx_ref = gemm(dy, w, cupy.empty((rows, k), BF16))
    dx = cupy.empty_like(dx_ref)
    dw = cupy.zeros((n, k), np.float32)
    out = [result(f"{name} dx", rows, "GemmEx", replay_us(lambda: gemm(dy, w, dx_ref)), flops, nbytes),
           result(f"{name} dw", rows, "GemmEx", replay_us(lambda: gemm(dy, x, dw, transa=True, beta=1.0)), flops,
                  nbytes)]
    out += lt_variants(f"{name} dx", rows, lambda algo: cublaslt.matmul(dy, w, dx, algo=algo), flops, nbytes,
                       cublaslt.candidates(dy, w, dx), lambda: rel_err(dx, dx_ref))
    out += lt_variants(f"{name} dw", rows, lambda algo: cublaslt.matmul(dy, x, dw, transa=True, beta=1.0, algo=algo),
                       flops, nbytes, cublaslt.candidates(dy, x, dw, transa=True), lambda: 0.0)
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
