"""A decode step's gate_up product and SwiGLU (Qwen3-0.6B) fused (kernels/gate_up_swiglu.py) against the two
separate ops (cuBLASLt's tuned product, then swiglu), at decode batch sizes, weights cold.

Each variant is a CUDA graph cycling through copies of the 12.6 MB weight that span five times the L2, so
every call streams it from HBM as in a decode step. Prints microseconds per call, the weight's HBM time at
the measured copy rate, and the ratio.

usage: PYTHONPATH=src:bench python bench/bench_gate_up_swiglu.py
"""

from __future__ import annotations

from functools import partial

from bench_decode_kernels import copy_bandwidth
from bench_gemm import graph_us
from bench_kernels import BF16, rand

HIDDEN, INTER = 1024, 3072
L2_SPAN = 256 << 20  # weight copies cycled through: 5x the H200's 50 MB L2 (cublaslt._COLD_BYTES)


def main() -> None:
    import cupy

    from barerl.backend import cuda
    from barerl.kernels import gate_up_swiglu

    w = rand((2 * INTER, HIDDEN), BF16, HIDDEN**-0.5)
    copies = [w] + [w.copy() for _ in range(L2_SPAN // w.nbytes)]
    cupy.cuda.Device().synchronize()
    floor_us = w.nbytes / copy_bandwidth() / 1e3
    print(f"{'rows':>4s} {'separate us':>12s} {'fused us':>9s} {'ratio':>6s} {'floor us':>9s}")
    for rows in (1, 16, 32, 64):
        x = rand((rows, HIDDEN), BF16)
        times = {}
        for fused in (False, True):
            gate_up_swiglu._FUSED = fused
            times[fused] = graph_us([partial(cuda.gate_up_swiglu, x, copy) for copy in copies])
        print(f"{rows:4d} {times[False]:12.2f} {times[True]:9.2f} {times[False] / times[True]:6.2f} {floor_us:9.2f}",
              flush=True)


if __name__ == "__main__":
    main()
