// Dropout of a LoRA adapter's input (training only), forward and backward: one mask, drawn from a counter.
// Reference twin: ops/ref/dropout.py (dropout, dropout_backward).
// Launchers: ops/cuda/dropout.py; tests: tests/ops/test_dropout.py.
//
// Math:    y[i] = keep(i) ? x[i] * scale : 0, keep(i) = (splitmix64(seed, (stream << 40) + i) >> 32) >= threshold,
//          threshold = round(p * 2^32), scale = 1 / (1 - p) in fp32. The backward is the same map applied to
//          dy (same seed and stream), so no mask is ever stored.
// Shapes:  x, y (n,) DTYPE, dense; n % VEC == 0, n < 2^40.
// Launch:  grid-stride over the n / VEC vectors, 256 threads per block; 16-byte loads and stores.
#include "common.cuh"

extern "C" __global__ void dropout(scalar_t* __restrict__ y, const scalar_t* __restrict__ x, long long n,
                                   u64 seed, u64 stream, unsigned int threshold, float scale) {
    const long long vectors = n / VEC;
    const u64 first_key = stream << 40;
    for (long long v = blockIdx.x * (long long)blockDim.x + threadIdx.x; v < vectors;
         v += (long long)gridDim.x * blockDim.x) {
        float e[VEC];
        load_vec(x + v * VEC, e);
#pragma unroll
        for (int k = 0; k < VEC; ++k) {
            const u64 bits = splitmix64(seed, first_key + (u64)(v * VEC + k));
            e[k] = (unsigned int)(bits >> 32) >= threshold ? e[k] * scale : 0.0f;
        }
        store_vec(y + v * VEC, e);
    }
}
