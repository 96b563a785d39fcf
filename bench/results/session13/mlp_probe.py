"""Runs on branch mlp-decode, whose kernel it times. Where mlp_decode's time goes (call 3): the kernel cut
after each phase (0: loads only, 1: + gate_up, 2: + the pair exchange and SwiGLU, 3: + the gather, 4: whole),
with and without its cluster of 8 (phases 0-1),
the sum kernel alone, and how many 8-CTA clusters of it the GPU holds at once (cuOccupancyMaxActiveClusters).
Cold weights (copies spanning 256 MB), 64 rows, CUDA-graph replays."""

import ctypes
from functools import partial
from pathlib import Path

import numpy as np
from barerl.kernels.mlp_decode import shared_memory_bytes
from bench_gemm import graph_us
from bench_kernels import BF16, rand

from barerl.kernels.build import CSRC, ctype, load_kernel
from barerl.kernels.launch import reserve_shared_memory

HIDDEN, INTER, ROWS = 1024, 3072, 64
SMEM = shared_memory_bytes(HIDDEN, INTER)
source = (CSRC / "mlp_decode.cu").read_text()
cut = {  # phase -> (the line after which the kernel stops, what it does there)
    0: ("    cp_async_commit();\n\n    // gate_up:", "cp_async_wait<0>(); __syncthreads();"),
    1: ("K_HALF / 16);\n", "cp_async_wait<0>(); if (gu[0][0] == 1.2345f) parts[threadIdx.x] = 1.0f;"),
    2: ("no CTA reads a part any more\n", "cp_async_wait<0>();"),
    3: ("pairs with this\n", "cp_async_wait<0>(); cluster_wait(); if (gathered[0].x == 12345u) parts[0] = 1.0f;"),
}


def variant(phase: int, clustered: int) -> str:
    """clustered: the cluster's CTA count (8 as shipped; 4 or 2 for phase 0, whose loads ignore it; 0: none)."""
    text = source
    if phase in cut:
        anchor, stop = cut[phase]
        assert anchor in text, phase
        text = text.replace(anchor, anchor.replace("\n\n    // gate_up:", "\n") + f"    {stop} return;\n"
                            + ("\n    // gate_up:" if phase == 0 else ""), 1)
    dims = f"__cluster_dims__({clustered}, 1, 1)" if clustered else ""
    text = text.replace("#define MLP_CLUSTER __cluster_dims__(CLUSTER, 1, 1)", f"#define MLP_CLUSTER {dims}")
    path = Path(f"/tmp/mlp_probe_{phase}_{int(clustered)}.cu")
    path.write_text(text)
    return str(path)


def max_active_clusters(kernel) -> int:
    class LaunchConfig(ctypes.Structure):
        _fields_ = [("grid", ctypes.c_uint * 3), ("block", ctypes.c_uint * 3), ("shared", ctypes.c_uint),
                    ("stream", ctypes.c_void_p), ("attrs", ctypes.c_void_p), ("num_attrs", ctypes.c_uint)]

    config = LaunchConfig((ctypes.c_uint * 3)(128, 1, 1), (ctypes.c_uint * 3)(256, 1, 1), SMEM, None, None, 0)
    count = ctypes.c_int(-1)
    rc = ctypes.CDLL("libcuda.so.1").cuOccupancyMaxActiveClusters(ctypes.byref(count), ctypes.c_void_p(kernel.kernel.ptr),
                                                                    ctypes.byref(config))
    return count.value if rc == 0 else -rc


def main() -> None:
    import cupy

    w_gate_up, w_down = rand((2 * INTER, HIDDEN), BF16, 0.03), rand((HIDDEN, INTER), BF16, 0.02)
    copies = [(w_gate_up, w_down)] + [(w_gate_up.copy(), w_down.copy()) for _ in range(12)]
    x = rand((ROWS, HIDDEN), BF16)
    parts = cupy.zeros((16, ROWS, HIDDEN), np.float32)
    cupy.cuda.Device().synchronize()
    defines = {"DTYPE": ctype(BF16), "HIDDEN": HIDDEN, "INTER": INTER}
    for phase, clustered in [(0, 8), (0, 4), (0, 2), (0, 0), (1, 8), (1, 0), (2, 8), (3, 8), (4, 8)]:
        kernel = load_kernel(variant(phase, clustered), "mlp_decode", defines)
        reserve_shared_memory(kernel, SMEM)
        launch = lambda w, k=kernel: k((128,), (256,), (parts, x, *w, np.int32(ROWS)), shared_mem=SMEM)
        us = graph_us([partial(launch, w) for w in copies])
        clusters = max_active_clusters(kernel) if clustered else "-"
        print(f"phase {phase} cluster {clustered} {us:7.2f} us  max active clusters {clusters}", flush=True)
    out, residual = cupy.empty((ROWS, HIDDEN), BF16), rand((ROWS, HIDDEN), BF16)
    total = load_kernel("mlp_decode.cu", "mlp_decode_sum", defines)
    us = graph_us([lambda: total((64,), (256,), (out, parts, residual, np.int32(ROWS)))] * 10)
    print(f"mlp_decode_sum alone {us:7.2f} us", flush=True)


if __name__ == "__main__":
    main()
