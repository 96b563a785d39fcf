"""The linear layers' matrix products at T1 and decode shapes: the GemmEx path against cuBLASLt's candidates.

For each Qwen3-0.6B linear layer (qkv, o_proj + residual, gate_up, down + residual) at T1's 18,432 rows and
at G1's 64 and G2's 256 decode rows, times: `linear` as shipped (cuBLASLt's tuned choice), every algorithm cuBLASLt's heuristic proposes with the residual as C, and the tuned
choice (its candidate index in the name). Also the backward products at T1 rows (dx = dy w, dw += dy^T x)
through GemmEx and Lt. Times are CUDA-graph replays of 10 back-to-back calls (device time, no launch cost),
median of 10 replays; results are checked against GemmEx's (relative error).

Decode rows are also timed cold ("cold" variants): the graph cycles through copies of the weight spanning
cuBLASLt's `_COLD_BYTES` (five times the H200's L2), so every call streams its weight from HBM as in a decode
step, where the KV cache evicts it between layers; a hot replay keeps it in L2. A summary ends the output:
per product, the fastest hot and cold variants against `linear`.

usage: PYTHONPATH=src python bench/bench_gemm.py [--rows T1 G1 G2] [--csv out.csv]
"""

from __future__ import annotations

import argparse
import csv
from functools import partial

import numpy as np
from bench_kernels import BF16, ceilings, rand, timed

SHAPES = {"qkv": (4096, 1024, False), "o_proj": (1024, 2048, True), "gate_up": (6144, 1024, False),
          "down": (1024, 3072, True)}  # name: (N, K, residual)
ROWS = {"T1": 16 * 1152, "G1": 64, "G2": 256}
REPEATS = 10


def replay_us(fn) -> float:
    """Microseconds per call of fn(), from a CUDA graph of REPEATS calls."""
    return graph_us([fn] * REPEATS)


def cold_us(fn, copies: list) -> float:
    """Microseconds per call of fn(weight), from a CUDA graph cycling through `copies` of the weight
    (REPEATS calls at least): each call finds its weight out of L2."""
    return graph_us([partial(fn, copies[i % len(copies)]) for i in range(max(len(copies), REPEATS))])


def graph_us(calls: list) -> float:
    """Microseconds per call of a CUDA graph of `calls` (no arguments, in order), median of 10 replays."""
    import cupy

    stream = cupy.cuda.Stream(non_blocking=True)
    with stream:
        calls[0]()  # compiles, tunes, and fills this stream's memory pool: the capture allocates nothing new
        stream.synchronize()
        stream.begin_capture()
        for call in calls:
            call()
        graph = stream.end_capture()
    return timed(lambda: graph.launch(stream), reps=10, stream=stream) * 1e3 / len(calls)


def weight_copies(w) -> list:
    """w and copies of it spanning cuBLASLt's _COLD_BYTES in all (the same rotation as its cold tuning)."""
    import cupy

    from barerl.ops.cuda import cublaslt

    count = min(cublaslt._COLD_MAX_COPIES, -(-cublaslt._COLD_BYTES // w.nbytes))
    copies = [w] + [w.copy() for _ in range(count - 1)]
    cupy.cuda.Device().synchronize()  # made on the legacy stream, read on the timing's non-blocking one
    return copies


def rel_err(x, ref) -> float:
    x, ref = x.astype(np.float32), ref.astype(np.float32)
    return float(np.linalg.norm((x - ref).get()) / max(np.linalg.norm(ref.get()), 1e-30))


def result(case: str, rows: int, variant: str, us: float, flops: float, nbytes: int, err: float = 0.0) -> dict:
    return {"case": case, "rows": rows, "variant": variant, "us": us, "flops": flops, "bytes": nbytes, "err": err}


def lt_variants(case: str, rows: int, call, flops: float, nbytes: int, count: int, check, copies=None,
                chosen=None) -> list[dict]:
    """call(algo) for each candidate index, then None (the tuned choice; chosen() -> its index); check() ->
    error of the last call. With `copies` of its weight (call(algo, weight) takes one), also timed cold."""
    out = []
    for algo in [*range(count), None]:
        hot = replay_us(lambda algo=algo: call(algo))
        cold = None if copies is None else cold_us(lambda weight, algo=algo: call(algo, weight), copies)
        call(algo)
        err = check()
        variant = f"Lt #{algo}" if algo is not None else "Lt tuned" if chosen is None else f"Lt tuned #{chosen()}"
        out.append(result(case, rows, variant, hot, flops, nbytes, err))
        if cold is not None:
            out.append(result(case, rows, f"{variant} cold", cold, flops, nbytes, err))
    return out


def forward_rows(rows: int, name: str, n: int, k: int, has_residual: bool) -> list[dict]:
    import cupy

    from barerl.ops.cuda import cublaslt
    from barerl.ops.cuda.cublas import gemm
    from barerl.ops.cuda.linear import linear

    x, w = rand((rows, k)), rand((n, k), scale=0.02)
    residual = rand((rows, n)) if has_residual else None
    flops, nbytes = 2.0 * rows * n * k, 2 * (x.size + w.size + rows * n * (2 if has_residual else 1))
    want = gemm(x, w, residual.copy() if has_residual else cupy.empty((rows, n), BF16), transb=True,
                beta=1.0 if has_residual else 0.0)
    out = cupy.empty_like(want)
    case = f"{name} fwd"
    decode = rows <= cublaslt._TUNE_MIN_ROWS
    copies = weight_copies(w) if decode else None

    def run(weight=w):
        return linear(x, weight, residual=residual)

    err = rel_err(run(), want)
    rows_out = [result(case, rows, "linear", replay_us(run), flops, nbytes, err)]
    if decode:
        rows_out.append(result(case, rows, "linear cold", cold_us(run, copies), flops, nbytes, err))
    count = cublaslt.candidates(x, w, out, transb=True, c=residual)

    def call(algo, weight=w):
        return cublaslt.matmul(x, weight, out, transb=True, beta=1.0 if has_residual else 0.0, c=residual,
                               algo=algo)

    return rows_out + lt_variants(case, rows, call, flops, nbytes, count, lambda: rel_err(out, want), copies,
                                  lambda: cublaslt.chosen(x, w, out, transb=True, c=residual))


def backward_rows(rows: int, name: str, n: int, k: int) -> list[dict]:
    import cupy

    from barerl.ops.cuda import cublaslt
    from barerl.ops.cuda.cublas import gemm

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


def summary(results: list[dict]) -> None:
    """Per product: `linear` as shipped, and the fastest variant, hot and (decode rows) cold."""
    print(f"\n{'case':<14}{'rows':>7}  {'timing':<6}{'linear us':>10}  {'fastest':<26}{'us':>8}")
    for case, rows in dict.fromkeys((r["case"], r["rows"]) for r in results):
        mine = [r for r in results if (r["case"], r["rows"]) == (case, rows)]
        for timing in ("hot", "cold"):
            group = [r for r in mine if r["variant"].endswith(" cold") == (timing == "cold")]
            if not group:
                continue
            shipped = next((r["us"] for r in group if r["variant"].startswith("linear")), float("nan"))
            best = min(group, key=lambda r: r["us"])
            print(f"{case:<14}{rows:>7}  {timing:<6}{shipped:>10.2f}  {best['variant']:<26}{best['us']:>8.2f}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rows", nargs="+", default=list(ROWS), choices=list(ROWS), help="row counts to time")
    parser.add_argument("--csv", default=None)
    args = parser.parse_args()
    bandwidth, tflops = ceilings()
    print(f"ceilings: copy {bandwidth:.0f} GB/s, bf16 GEMM {tflops:.0f} TFLOP/s")
    results = []
    for label in args.rows:
        for name, (n, k, has_residual) in SHAPES.items():
            results += forward_rows(ROWS[label], name, n, k, has_residual)
            if label == "T1":
                results += backward_rows(ROWS[label], name, n, k)
    print(f"{'case':<14}{'rows':>7}  {'variant':<26}{'us':>9}{'TFLOP/s':>9}{'GB/s':>8}{'rel err':>10}")
    for r in results:
        print(f"{r['case']:<14}{r['rows']:>7}  {r['variant']:<26}{r['us']:>9.2f}{r['flops'] / r['us'] / 1e6:>9.1f}"
              f"{r['bytes'] / r['us'] / 1e3:>8.0f}{r['err']:>10.1e}")
    summary(results)
    if args.csv:
        with open(args.csv, "w", newline="") as f:
            writer = csv.DictWriter(f, fieldnames=list(results[0]))
            writer.writeheader()
            writer.writerows(results)


if __name__ == "__main__":
    main()
