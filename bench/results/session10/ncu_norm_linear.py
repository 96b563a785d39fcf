"""Two cold launches each of the fused qkv kernel at 1 and 64 rows, for ncu (session 10, call 2)."""
import cupy
from bench_kernels import BF16, rand

from barerl.backend import cuda

copies = [rand((4096, 1024), BF16, 1024**-0.5) for _ in range(12)]
g = rand((1024,), BF16)
for rows in (1, 64):
    x = rand((rows, 1024), BF16, 3.0)
    for i in range(4):
        cuda.rmsnorm_linear(x, g, 1e-6, copies[i])
cupy.cuda.Device().synchronize()
