"""Session 10, call 10: is a CTA's weight tile slower to load in K-stripes than row by row? 128 CTAs (256
threads, one per SM) each load 32 rows x 2 KB of their own cold weight rows (64 KB), by cp.async, in one of
three orders; and 64 rows x 2 KB that every CTA shares (x of a decode product, from L2) in the same orders.
Stripes: eighth c of every row before eighth c + 1 (what norm_linear did); rows: row r whole before row r + 1."""
import cupy
import numpy as np
from bench_gemm import cold_us, graph_us

SRC = r'''
__device__ __forceinline__ unsigned sa(const void* p) { return (unsigned)__cvta_generic_to_shared(p); }
// rows x 2 KB from src (row stride 2 KB) into shared memory; stripes: the unit order (eighth, row, unit)
extern "C" __global__ void __launch_bounds__(256, 1) load_tile(const uint4* w, float* out, int rows,
                                                              int stripes, int shared) {
    extern __shared__ __align__(128) unsigned char smem[];
    const uint4* src = w + (shared ? 0 : (long long)blockIdx.x * rows * 128);
    const int units = rows * 128;  // 16-byte units
    const int per = 128 / (stripes ? stripes : 1);  // units of a row in one stripe
    for (int i = threadIdx.x; i < units; i += 256) {
        int r, u;
        if (stripes) { const int s = i / (rows * per), j = i % (rows * per); r = j / per; u = s * per + j % per; }
        else { r = i / 128; u = i % 128; }
        asm volatile("cp.async.cg.shared.global [%0], [%1], 16;\n" :: "r"(sa(smem + 16 * (r * 128 + u))), "l"(src + r * 128 + u));
    }
    asm volatile("cp.async.commit_group;\ncp.async.wait_group 0;\n" ::);
    __syncthreads();
    if (threadIdx.x == 0) out[blockIdx.x] = *reinterpret_cast<float*>(smem + 16 * (units - 1));
}
'''
fn = cupy.RawModule(code=SRC, options=("-std=c++17", "-arch=sm_90")).get_function("load_tile")
fn.max_dynamic_shared_size_bytes = 128 << 10
CTAS = 128
out = cupy.zeros(CTAS, np.float32)
own = [cupy.random.random(CTAS * 32 * 512, dtype=np.float32) for _ in range(32)]  # 8 MB each
shared = cupy.random.random(64 * 512, dtype=np.float32)  # 128 KB
cupy.cuda.Device().synchronize()
for stripes, name in ((0, "rows"), (8, "8 stripes (256 B)"), (16, "16 stripes (128 B)")):
    us = cold_us(lambda w: fn((CTAS,), (256,), (w, out, np.int32(32), np.int32(stripes), np.int32(0)),
                               shared_mem=64 << 10), own)
    print(f"own 32 x 2 KB, {name:20s} {us:6.2f} us  {CTAS * 65536 / us / 1e3:6.0f} GB/s", flush=True)
for stripes, name in ((0, "rows"), (8, "8 stripes (256 B)")):
    us = graph_us([lambda: fn((CTAS,), (256,), (shared, out, np.int32(64), np.int32(stripes), np.int32(1)),
                              shared_mem=128 << 10)] * 10)
    print(f"shared 64 x 2 KB, {name:17s} {us:6.2f} us  ({CTAS * 131072 / us / 1e3:6.0f} GB/s into SMs)", flush=True)
