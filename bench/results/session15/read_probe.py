"""The H200's read-only HBM bandwidth (session 15): a grid-stride kernel reading 1 GiB in 16-byte loads, against
a device-to-device copy, so paged attention's GB/s can be set against what pure reads reach."""

import cupy
import numpy as np
from bench_decode_kernels import copy_bandwidth, gpu_ms

SOURCE = r"""
extern "C" __global__ void read_all(const uint4* __restrict__ src, long long n, unsigned* out) {
    unsigned acc = 0;
    for (long long i = blockIdx.x * (long long)blockDim.x + threadIdx.x; i < n; i += (long long)gridDim.x * blockDim.x) {
        const uint4 v = src[i];
        acc ^= v.x ^ v.y ^ v.z ^ v.w;
    }
    if (acc == 0x9e3779b9u) out[0] = acc;  // keeps the loads; practically never true
}
"""

def main() -> None:
    kernel = cupy.RawKernel(SOURCE, "read_all")
    a = cupy.ones(1 << 30, np.uint8)
    out = cupy.zeros(1, np.uint32)
    n = a.nbytes // 16
    print(f"copy 1 GiB: {copy_bandwidth():.0f} GB/s (read + write)")
    for ctas_per_sm, threads in ((4, 256), (8, 256), (16, 256), (8, 512), (32, 128)):
        grid = 132 * ctas_per_sm
        ms = gpu_ms(kernel, ((grid,), (threads,), (a, np.int64(n), out)), calls=5, repeat=10)
        print(f"read 1 GiB, {grid} CTAs x {threads}: {a.nbytes / ms / 1e6:.0f} GB/s")


if __name__ == "__main__":
    main()
