// RMSNorm over the last axis, forward and backward.
//
// Math:    rstd[t] = 1 / sqrt(mean_c x[t,c]^2 + eps);  y[t,c] = x[t,c] * rstd[t] * w[c]
//          backward, with xhat = x * rstd and g = dy * w:
//          dx[t,c] = rstd[t] * (g[t,c] - xhat[t,c] * mean_c(g * xhat)[t]);   dw[c] += sum_t dy[t,c] * xhat[t,c]
// Shapes:  x, y, dy, dx (T, C) DTYPE, rows contiguous, C % VEC == 0; w (C,) DTYPE; rstd (T,) fp32;
//          dw (C,) fp32, accumulated (the caller zeroes it once per optimizer step).
// Launch:  one warp per row, ROWS_PER_BLOCK (4) warps per block, grid-stride over rows; 16-byte accesses.
//          The second pass over a row re-reads it from L1/L2 (a row is a few KiB).
//          Backward: each warp adds its rows' dy * xhat into its own slice of dynamic shared memory
//          (ROWS_PER_BLOCK * C fp32), then the block sums the slices and adds them to dw with one atomicAdd
//          per column per block.
#include "common.cuh"

constexpr int ROWS_PER_BLOCK = 4;

extern "C" __global__ void rmsnorm_forward(scalar_t* __restrict__ y, float* __restrict__ rstd_out,
                                           const scalar_t* __restrict__ x, const scalar_t* __restrict__ w,
                                           int rows, int cols, float eps) {
    const int lane = threadIdx.x & 31;
    const int warp = threadIdx.x >> 5;
    for (int row = blockIdx.x * ROWS_PER_BLOCK + warp; row < rows; row += gridDim.x * ROWS_PER_BLOCK) {
        const scalar_t* xr = x + (long long)row * cols;
        float ss = 0.0f;
        for (int c = lane * VEC; c < cols; c += 32 * VEC) {
            float v[VEC];
            load_vec(xr + c, v);
#pragma unroll
            for (int i = 0; i < VEC; ++i) ss += v[i] * v[i];
        }
        const float rstd = rsqrtf(warp_sum(ss) / cols + eps);
        if (lane == 0) rstd_out[row] = rstd;
        scalar_t* yr = y + (long long)row * cols;
        for (int c = lane * VEC; c < cols; c += 32 * VEC) {
            float v[VEC], wv[VEC];
            load_vec(xr + c, v);
            load_vec(w + c, wv);
#pragma unroll
            for (int i = 0; i < VEC; ++i) v[i] = v[i] * rstd * wv[i];
            store_vec(yr + c, v);
        }
    }
}

extern "C" __global__ void rmsnorm_backward(scalar_t* __restrict__ dx, float* __restrict__ dw,
                                            const scalar_t* __restrict__ dy, const scalar_t* __restrict__ x,
                                            const scalar_t* __restrict__ w, const float* __restrict__ rstd_in,
                                            int rows, int cols) {
    extern __shared__ float dw_partial[];  // (ROWS_PER_BLOCK, cols)
    const int lane = threadIdx.x & 31;
    const int warp = threadIdx.x >> 5;
    float* my_dw = dw_partial + warp * cols;
    for (int c = lane; c < cols; c += 32) my_dw[c] = 0.0f;
    __syncwarp();
    for (int row = blockIdx.x * ROWS_PER_BLOCK + warp; row < rows; row += gridDim.x * ROWS_PER_BLOCK) {
        const long long base = (long long)row * cols;
        const float rstd = rstd_in[row];
        float dot = 0.0f;  // sum_c g * xhat
        for (int c = lane * VEC; c < cols; c += 32 * VEC) {
            float xv[VEC], dv[VEC], wv[VEC];
            load_vec(x + base + c, xv);
            load_vec(dy + base + c, dv);
            load_vec(w + c, wv);
#pragma unroll
            for (int i = 0; i < VEC; ++i) {
                const float xhat = xv[i] * rstd;
                dot += dv[i] * wv[i] * xhat;
                my_dw[c + i] += dv[i] * xhat;
            }
        }
        const float mean_dot = warp_sum(dot) / cols;
        for (int c = lane * VEC; c < cols; c += 32 * VEC) {
            float xv[VEC], dv[VEC], wv[VEC];
            load_vec(x + base + c, xv);
            load_vec(dy + base + c, dv);
            load_vec(w + c, wv);
#pragma unroll
            for (int i = 0; i < VEC; ++i) dv[i] = rstd * (dv[i] * wv[i] - xv[i] * rstd * mean_dot);
            store_vec(dx + base + c, dv);
        }
    }
    __syncthreads();
    for (int c = threadIdx.x; c < cols; c += blockDim.x) {
        float sum = 0.0f;
#pragma unroll
        for (int r = 0; r < ROWS_PER_BLOCK; ++r) sum += dw_partial[r * cols + c];
        atomicAdd(dw + c, sum);
    }
}
