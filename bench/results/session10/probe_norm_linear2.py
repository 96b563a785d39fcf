"""Session 10, call 6: norm_linear with each CTA starting at its own eighth of K (rotation) against the same
without it, without products (loads only), and the unfused ops; then in a graph after a small kernel (rmsnorm),
as in a decode step, with and without rmsnorm asking for the same shared-memory carveout."""
import cupy
from bench_gemm import cold_us, graph_us, weight_copies
from bench_kernels import BF16, rand

from barerl.backend import cuda
from barerl.kernels import norm_linear
from barerl.kernels.build import ctype, load_kernel

VARIANTS = {"rotated": {}, "not rotated": {"PROBE_NO_ROTATE": 1}, "rotated, loads only": {"PROBE_NO_MMA": 1}}
for name, (n, k) in {"qkv": (4096, 1024), "gate_up": (6144, 1024)}.items():
    copies = weight_copies(rand((n, k), BF16, k**-0.5))
    g = rand((k,), BF16)
    swiglu = name == "gate_up"
    op = cuda.rmsnorm_linear_swiglu if swiglu else cuda.rmsnorm_linear
    for rows in (1, 64):
        x = rand((rows, k), BF16, 3.0)
        if swiglu:
            unfused = lambda w: cuda.swiglu(cuda.linear(cuda.rmsnorm(x, g, 1e-6)[0], w))
        else:
            unfused = lambda w: cuda.linear(cuda.rmsnorm(x, g, 1e-6)[0], w)
        print(f"{name:8} rows {rows:3d} {'unfused':28} {cold_us(unfused, copies):7.2f} us", flush=True)
        for variant, probe in VARIANTS.items():
            for ksplit in (2, 4):
                norm_linear._KSPLIT, norm_linear.PROBE = ksplit, probe
                us = cold_us(lambda w: op(x, g, 1e-6, w), copies)
                print(f"{name:8} rows {rows:3d} {variant + f' ksplit {ksplit}':28} {us:7.2f} us", flush=True)
        norm_linear._KSPLIT, norm_linear.PROBE = 2, {}
        # after a small kernel in the same graph: pair time minus the small kernel's own
        h = rand((64, 1024), BF16)
        small = lambda: cuda.rmsnorm(h, g, 1e-6)
        t_small = graph_us([small] * 12)
        pair = lambda w: (small(), op(x, g, 1e-6, w))
        print(f"{name:8} rows {rows:3d} {'after rmsnorm (pair - rmsnorm)':28} {cold_us(pair, copies) - t_small:7.2f} us  (rmsnorm {t_small:.2f})", flush=True)
        kernel = load_kernel("rmsnorm.cu", "rmsnorm_forward", {"DTYPE": ctype(BF16)})
        kernel.preferred_shared_memory_carveout = 100
        t_small = graph_us([small] * 12)
        print(f"{name:8} rows {rows:3d} {'after rmsnorm, carveout 100':28} {cold_us(pair, copies) - t_small:7.2f} us  (rmsnorm {t_small:.2f})", flush=True)
        kernel.preferred_shared_memory_carveout = -1
