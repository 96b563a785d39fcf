"""Where norm_linear's time goes (session 10, call 3): the kernel cold at 1 and 64 rows with its k-loop split
over more warps (KSPLIT), without the norm's A transform, and without any products (loads, waits, epilogue)."""
from bench_gemm import cold_us, weight_copies
from bench_kernels import BF16, rand

from barerl.backend import cuda
from barerl.kernels import norm_linear

VARIANTS = {"ksplit2": (2, {}), "ksplit4": (4, {}), "ksplit2 no_norm": (2, {"PROBE_NO_NORM": 1}),
            "ksplit4 no_norm": (4, {"PROBE_NO_NORM": 1}), "ksplit2 no_mma": (2, {"PROBE_NO_MMA": 1}),
            "ksplit4 no_mma": (4, {"PROBE_NO_MMA": 1})}
for name, (n, k) in {"qkv": (4096, 1024), "gate_up": (6144, 1024)}.items():
    copies = weight_copies(rand((n, k), BF16, k**-0.5))
    g = rand((k,), BF16)
    op = cuda.rmsnorm_linear_swiglu if name == "gate_up" else cuda.rmsnorm_linear
    for rows in (1, 64):
        x = rand((rows, k), BF16, 3.0)
        for variant, (ksplit, probe) in VARIANTS.items():
            norm_linear._KSPLIT, norm_linear.PROBE = ksplit, probe
            print(f"{name:8} rows {rows:3d} {variant:16} {cold_us(lambda w: op(x, g, 1e-6, w), copies):7.2f} us", flush=True)
