// Epilogues of linear()'s split-K path: split_k_sum adds the split-K GEMM's fp32 parts to bias + residual;
// split_k_sum_rmsnorm also normalises each summed row (linear_rmsnorm: o_proj and the post-attention norm
// in one kernel instead of two).
//
// Math:    out[t, n] = bias[n] + residual[t, n] + sum_s parts[s, t, n]
//          (fp32 sums in that order, rounded once; bias and residual may be absent: null)
//          split_k_sum_rmsnorm: also y[t] = rmsnorm(out[t]) * w, rstd[t], from out's rounded values with
//          rmsnorm_forward's arithmetic (rmsnorm_row.cuh): the same bits as split_k_sum then rmsnorm.
// Shapes:  out, y (T, N) DTYPE; bias (N,) DTYPE or null; residual (T, N) DTYPE or null, rows contiguous;
//          parts (S, T, N) fp32 contiguous; w (N,) DTYPE; rstd (T,) fp32.
// Launch:  split_k_sum: grid-stride over T*N elements; any grid, 256 threads per block.
//          split_k_sum_rmsnorm: one warp per row, grid-stride over rows, N % VEC == 0 and
//          N <= 32 * VEC * MAX_VECS.
#include "rmsnorm_row.cuh"

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

extern "C" __global__ void split_k_sum_rmsnorm(scalar_t* __restrict__ out, scalar_t* __restrict__ y,
                                               float* __restrict__ rstd_out, const float* __restrict__ parts,
                                               const scalar_t* __restrict__ bias,
                                               const scalar_t* __restrict__ residual,
                                               const scalar_t* __restrict__ w, int splits, int rows, int cols,
                                               float eps) {
    const int lane = threadIdx.x & 31;
    const int warps = blockDim.x >> 5;
    const long long total = (long long)rows * cols;
    for (int row = blockIdx.x * warps + (threadIdx.x >> 5); row < rows; row += gridDim.x * warps) {
        float v[MAX_VECS][VEC];
#pragma unroll
        for (int i = 0; i < MAX_VECS; ++i) {
            const int c = (lane + 32 * i) * VEC;
            if (c >= cols) continue;
            const long long at = (long long)row * cols + c;
#pragma unroll
            for (int k = 0; k < VEC; ++k) v[i][k] = bias_plus_residual(bias, residual, at + k, cols);
            for (int s = 0; s < splits; ++s) {
                const float4* part = reinterpret_cast<const float4*>(parts + s * total + at);
#pragma unroll
                for (int q = 0; q < VEC / 4; ++q) {
                    const float4 p = part[q];
                    v[i][4 * q] += p.x;
                    v[i][4 * q + 1] += p.y;
                    v[i][4 * q + 2] += p.z;
                    v[i][4 * q + 3] += p.w;
                }
            }
            store_vec(out + at, v[i]);
#pragma unroll
            for (int k = 0; k < VEC; ++k) v[i][k] = to_float(from_float<scalar_t>(v[i][k]));  // as stored
        }
        const float rstd = normalize_row(v, y + (long long)row * cols, w, cols, lane, eps);
        if (lane == 0) rstd_out[row] = rstd;
    }
}
