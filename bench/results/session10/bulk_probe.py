"""Session 10, call 4: how fast one CTA per SM pulls its weight tile from HBM, by cp.async (256 threads x 16 B)
or by the Hopper bulk-copy engine (cp.async.bulk into shared memory, completion counted on an mbarrier).
128 CTAs each read their own `tile` bytes of a cold weight (a CUDA graph cycles through copies spanning five
L2s, bench_gemm.py's method) and write one word. Prints us per launch and the GB/s it implies."""
import cupy
import numpy as np
from bench_gemm import cold_us

SRC = r'''
__device__ __forceinline__ unsigned sa(const void* p) { return (unsigned)__cvta_generic_to_shared(p); }
extern "C" __global__ void __launch_bounds__(256, 1) by_cp_async(const uint4* w, float* out, int tile) {
    extern __shared__ __align__(128) unsigned char smem[];
    const uint4* src = w + (long long)blockIdx.x * (tile / 16);
    for (int i = threadIdx.x; i < tile / 16; i += 256)
        asm volatile("cp.async.cg.shared.global [%0], [%1], 16;\n" :: "r"(sa(smem + 16 * i)), "l"(src + i));
    asm volatile("cp.async.commit_group;\ncp.async.wait_group 0;\n" ::);
    __syncthreads();
    if (threadIdx.x == 0) out[blockIdx.x] = *reinterpret_cast<float*>(smem + (tile - 16));
}
extern "C" __global__ void __launch_bounds__(256, 1) by_bulk(const unsigned char* w, float* out, int tile, int piece) {
    extern __shared__ __align__(128) unsigned char smem[];
    __shared__ __align__(8) unsigned long long bar;
    const unsigned char* src = w + (long long)blockIdx.x * tile;
    if (threadIdx.x == 0) {
        asm volatile("mbarrier.init.shared::cta.b64 [%0], 1;\n" :: "r"(sa(&bar)));
        asm volatile("fence.proxy.async.shared::cta;\n" ::: "memory");
    }
    __syncthreads();
    if (threadIdx.x == 0)
        asm volatile("mbarrier.arrive.expect_tx.shared::cta.b64 _, [%0], %1;\n" :: "r"(sa(&bar)), "r"(tile) : "memory");
    if (threadIdx.x < 32)  // one warp issues the pieces
        for (int i = threadIdx.x; i < tile / piece; i += 32)
            asm volatile("cp.async.bulk.shared::cluster.global.mbarrier::complete_tx::bytes [%0], [%1], %2, [%3];\n"
                         :: "r"(sa(smem + i * piece)), "l"(src + (long long)i * piece), "r"(piece), "r"(sa(&bar)) : "memory");
    unsigned done = 0;
    while (!done)
        asm volatile("{\n.reg .pred p;\nmbarrier.try_wait.parity.shared::cta.b64 p, [%1], 0;\nselp.u32 %0, 1, 0, p;\n}\n"
                     : "=r"(done) : "r"(sa(&bar)) : "memory");
    if (threadIdx.x == 0) out[blockIdx.x] = *reinterpret_cast<float*>(smem + (tile - 16));
}
'''
module = cupy.RawModule(code=SRC, options=("-std=c++17", "-arch=sm_90"))
CTAS = 128
out = cupy.zeros(4 * CTAS, np.float32)
# Call 5: the same loads with the CTA's dynamic shared memory raised to `carve` bytes (used: only `tile`), so the
# SM gives shared memory the room the fused kernel took and L1 what is left.
for tile in (64 << 10, 96 << 10):
    nbytes = CTAS * tile
    copies = [cupy.random.random(nbytes // 4, dtype=np.float32) for _ in range(max(10, (250 << 20) // nbytes))]
    cupy.cuda.Device().synchronize()
    for carve in (tile, 128 << 10, 160 << 10, 200 << 10, 227 << 10):
        for name, fn, args in (("cp.async", module.get_function("by_cp_async"), lambda w: (w, out, np.int32(tile))),
                               ("bulk 2048 B", module.get_function("by_bulk"), lambda w: (w, out, np.int32(tile), np.int32(2048)))):
            fn.max_dynamic_shared_size_bytes = carve
            us = cold_us(lambda w, fn=fn, args=args: fn((CTAS,), (256,), args(w), shared_mem=carve), copies)
            print(f"tile {tile >> 10:3d} KB  smem {carve >> 10:3d} KB  {name:12s} {us:6.2f} us  {nbytes / us / 1e3:6.0f} GB/s", flush=True)
