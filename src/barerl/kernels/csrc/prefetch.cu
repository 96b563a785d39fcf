// prefetch_l2: ask the L2 cache to fetch a byte range ahead of its use. A hint: nothing waits for it, so the
// kernel retires at once while the memory system fills L2 behind it.
//
// Why: a decode step's GEMMs have a few rows, too few CTAs to keep enough weight bytes in flight, and they
//      run between latency-bound kernels that leave HBM idle. The engine asks for a layer's weights at the
//      layer's start; its matrix products then read them from L2 (the attention's K/V loads are marked
//      evict-first, so the KV-cache stream does not push the weights out).
// Shapes:  base 16-byte aligned, bytes a multiple of 16.
// Launch:  enough threads for one CHUNK each (any grid works: a grid-stride loop).
#include "common.cuh"

constexpr long long CHUNK = 1 << 15;  // bytes per bulk prefetch

extern "C" __global__ void prefetch_l2(const char* __restrict__ base, long long bytes) {
    const long long stride = (long long)gridDim.x * blockDim.x * CHUNK;
    for (long long off = ((long long)blockIdx.x * blockDim.x + threadIdx.x) * CHUNK; off < bytes; off += stride) {
        const unsigned n = (unsigned)(bytes - off < CHUNK ? bytes - off : CHUNK);
#if __CUDA_ARCH__ >= 900
        asm volatile("cp.async.bulk.prefetch.L2.global [%0], %1;\n" ::"l"(base + off), "r"(n) : "memory");
#else
        for (unsigned b = 0; b < n; b += 128) asm volatile("prefetch.global.L2 [%0];\n" ::"l"(base + off + b));
#endif
    }
}
