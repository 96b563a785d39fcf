// Epilogue of linear(): prefill out with bias + residual so that one cuBLAS GEMM with beta = 1 adds x @ w.T.
//
// Math:    out[t, n] = bias[n] + residual[t, n]   (fp32 sum, rounded once; either term may be absent: null)
// Shapes:  out (T, N) DTYPE; bias (N,) DTYPE or null; residual (T, N) DTYPE or null, rows contiguous.
// Launch:  grid-stride over T*N elements; any grid, 256 threads per block.
#include "common.cuh"

extern "C" __global__ void bias_residual_fill(scalar_t* __restrict__ out, const scalar_t* __restrict__ bias,
                                              const scalar_t* __restrict__ residual, long long rows, int cols) {
    const long long total = rows * cols;
    for (long long i = blockIdx.x * (long long)blockDim.x + threadIdx.x; i < total;
         i += (long long)gridDim.x * blockDim.x) {
        float v = 0.0f;
        if (bias != nullptr) v += to_float(bias[i % cols]);
        if (residual != nullptr) v += to_float(residual[i]);
        out[i] = from_float<scalar_t>(v);
    }
}
