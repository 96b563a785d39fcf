// Epilogue of linear()'s split-K path: split_k_sum adds the split-K GEMM's fp32 parts to bias + residual.
//
// Math:    out[t, n] = bias[n] + residual[t, n] + sum_s parts[s, t, n]
//          (fp32 sums, rounded once; bias and residual may be absent: null)
// Shapes:  out (T, N) DTYPE; bias (N,) DTYPE or null; residual (T, N) DTYPE or null, rows contiguous;
//          parts (S, T, N) fp32 contiguous.
// Launch:  grid-stride over T*N elements; any grid, 256 threads per block.
#include "common.cuh"

__device__ __forceinline__ float bias_plus_residual(const scalar_t* bias, const scalar_t* residual, long long i,
                                                    int cols) {
    float v = 0.0f;
    if (bias != nullptr) v += to_float(bias[i % cols]);
    if (residual != nullptr) v += to_float(residual[i]);
    return v;
}

extern "C" __global__ void split_k_sum(scalar_t* __restrict__ out, const float* __restrict__ parts,
                                       const scalar_t* __restrict__ bias, const scalar_t* __restrict__ residual,
                                       int splits, long long rows, int cols) {
    const long long total = rows * cols;
    for (long long i = blockIdx.x * (long long)blockDim.x + threadIdx.x; i < total;
         i += (long long)gridDim.x * blockDim.x) {
        float v = bias_plus_residual(bias, residual, i, cols);
        for (int s = 0; s < splits; ++s) v += parts[s * total + i];
        out[i] = from_float<scalar_t>(v);
    }
}
