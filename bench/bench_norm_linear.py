"""The fused norm + product kernels (kernels/norm_linear.py) against the unfused ops they replace.

For Qwen3-0.6B's qkv (rmsnorm + linear) and gate_up (rmsnorm + linear + swiglu) at decode rows, times both
paths cold: a CUDA graph cycles through copies of the weight spanning five L2s, so every call streams its
weight from HBM as in a decode step (bench_gemm.py's method). Prints us per call, the weight's bytes over the
time, and fused / unfused.

    PYTHONPATH=src:bench python bench/bench_norm_linear.py [--rows 1 16 64 128 256]
"""

from __future__ import annotations

import argparse

from bench_gemm import cold_us, weight_copies
from bench_kernels import BF16, rand

SHAPES = {"qkv": (4096, 1024), "gate_up": (6144, 1024)}  # name: (N, K)


def main() -> None:
    from barerl.backend import cuda
    from barerl.kernels import norm_linear

    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rows", type=int, nargs="+", default=[1, 16, 64, 128, 256])
    args = parser.parse_args()
    norm_linear.MAX_ROWS = max(args.rows)  # the kernel for every row count timed here
    print(f"{'product':8} {'rows':>5} {'unfused us':>11} {'fused us':>9} {'fused GB/s':>11} {'fused/unfused':>14}")
    for name, (n, k) in SHAPES.items():
        copies = weight_copies(rand((n, k), BF16, k**-0.5))
        g = rand((k,), BF16)
        swiglu = name == "gate_up"
        for rows in args.rows:
            x = rand((rows, k), BF16, 3.0)
            if swiglu:
                unfused = lambda w: cuda.swiglu(cuda.linear(cuda.rmsnorm(x, g, 1e-6)[0], w))
                fused = lambda w: cuda.rmsnorm_linear_swiglu(x, g, 1e-6, w)
            else:
                unfused = lambda w: cuda.linear(cuda.rmsnorm(x, g, 1e-6)[0], w)
                fused = lambda w: cuda.rmsnorm_linear(x, g, 1e-6, w)
            t_unfused, t_fused = cold_us(unfused, copies), cold_us(fused, copies)
            print(f"{name:8} {rows:5d} {t_unfused:11.2f} {t_fused:9.2f} {n * k * 2 / t_fused / 1e3:11.0f} "
                  f"{t_fused / t_unfused:14.2f}", flush=True)


if __name__ == "__main__":
    main()
