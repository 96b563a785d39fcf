"""The decode MLP (Qwen3-0.6B: gate_up, SwiGLU, down + residual) fused (kernels/mlp_decode.py) against its
three separate ops (cuBLASLt's tuned products and swiglu), at decode batch sizes, weights cold.

Each variant is a CUDA graph cycling through copies of the two weights that span five times the L2, so every
call streams its 18.9 MB of weights from HBM as in a decode step. Prints microseconds per MLP, the weights'
HBM time at the measured copy rate, and the ratio.

usage: PYTHONPATH=src:bench python bench/bench_mlp.py
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
    from barerl.kernels import mlp_decode

    w_gate_up, w_down = rand((2 * INTER, HIDDEN), BF16, HIDDEN**-0.5), rand((HIDDEN, INTER), BF16, INTER**-0.5)
    nbytes = w_gate_up.nbytes + w_down.nbytes
    copies = [(w_gate_up, w_down)] + [(w_gate_up.copy(), w_down.copy()) for _ in range(L2_SPAN // nbytes)]
    cupy.cuda.Device().synchronize()
    floor_us = nbytes / copy_bandwidth() / 1e3
    print(f"{'rows':>4s} {'separate us':>12s} {'fused us':>9s} {'ratio':>6s} {'floor us':>9s}")
    for rows in (1, 16, 32, 64):
        x, residual = rand((rows, HIDDEN), BF16), rand((rows, HIDDEN), BF16)
        times = {}
        for fused in (False, True):
            mlp_decode._FUSED = fused
            times[fused] = graph_us([partial(cuda.mlp, x, *w, residual) for w in copies])
        print(f"{rows:4d} {times[False]:12.2f} {times[True]:9.2f} {times[False] / times[True]:6.2f} {floor_us:9.2f}",
              flush=True)


if __name__ == "__main__":
    main()
