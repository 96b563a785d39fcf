// RMSNorm over the last axis, forward and backward.
// Reference twin: ops/ref/rmsnorm.py (rmsnorm, rmsnorm_backward).
// Launchers: ops/cuda/rmsnorm.py; tests: tests/ops/test_rmsnorm.py.
//
// Math:    rstd[t] = 1 / sqrt(mean_c x[t,c]^2 + eps);  y[t,c] = x[t,c] * rstd[t] * w[c]
//          backward, with xhat = x * rstd and g = dy * w:
//          dx[t,c] = rstd[t] * (g[t,c] - xhat[t,c] * mean_c(g * xhat)[t]) (+ residual_grad[t,c], when given: the
//          residual stream's gradient, added in fp32 before dx is rounded);   dw[c] += sum_t dy[t,c] * xhat[t,c]
// Shapes:  x, y, dy, dx (T, C) DTYPE, rows contiguous, C % VEC == 0; w (C,) DTYPE; rstd (T,) fp32;
//          dw (C,) fp32, accumulated (the caller zeroes it once per optimizer step).
// Launch:  one warp per row, ROWS_PER_BLOCK (4) warps per block, grid-stride over rows; 16-byte accesses.
//          Rows of up to 32 * VEC * MAX_VECS elements (1024 bf16 with the default 4) are held in registers:
//          all of a lane's loads (its x and w vectors) are issued at once and the row is read once. Longer
//          rows take a loop whose second pass re-reads the row from L1/L2.
//          Backward: each warp adds its rows' dy * xhat into its own slice of dynamic shared memory
//          (ROWS_PER_BLOCK * C fp32), then the block sums the slices and adds them to dw with one atomicAdd
//          per column per block.
#include "common.cuh"

constexpr int ROWS_PER_BLOCK = 4;
#ifndef MAX_VECS
#define MAX_VECS 4
#endif

// The row's vectors of this lane (vector i covers elements (lane + 32 i) * VEC..), unwritten past cols.
__device__ __forceinline__ void load_row(float (&v)[MAX_VECS][VEC], const scalar_t* row, int cols, int lane) {
#pragma unroll
    for (int i = 0; i < MAX_VECS; ++i) {
        const int c = (lane + 32 * i) * VEC;
        if (c < cols) load_vec(row + c, v[i]);
    }
}

extern "C" __global__ void rmsnorm_forward(scalar_t* __restrict__ y, float* __restrict__ rstd_out,
                                           const scalar_t* __restrict__ x, const scalar_t* __restrict__ w,
                                           int rows, int cols, float eps) {
    const int lane = threadIdx.x & 31;
    const int warp = threadIdx.x >> 5;
    if (cols <= 32 * VEC * MAX_VECS) {
        for (int row = blockIdx.x * ROWS_PER_BLOCK + warp; row < rows; row += gridDim.x * ROWS_PER_BLOCK) {
            float v[MAX_VECS][VEC], wv[MAX_VECS][VEC];
            load_row(v, x + (long long)row * cols, cols, lane);
            load_row(wv, w, cols, lane);  // with x's loads: no second round trip after the reduction
            float ss = 0.0f;
#pragma unroll
            for (int i = 0; i < MAX_VECS; ++i)
#pragma unroll
                for (int k = 0; k < VEC; ++k) ss += (lane + 32 * i) * VEC < cols ? v[i][k] * v[i][k] : 0.0f;
            const float rstd = rsqrtf(warp_sum(ss) / cols + eps);
            if (lane == 0) rstd_out[row] = rstd;
#pragma unroll
            for (int i = 0; i < MAX_VECS; ++i) {
                const int c = (lane + 32 * i) * VEC;
                if (c >= cols) continue;
#pragma unroll
                for (int k = 0; k < VEC; ++k) v[i][k] *= rstd * wv[i][k];
                store_vec(y + (long long)row * cols + c, v[i]);
            }
        }
        return;
    }
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

// Rows longer than the register cache: two passes per row, dw sums in this warp's shared-memory slice.
// v += residual_grad[at .. at + VEC), where it is given.
__device__ __forceinline__ void add_residual_grad(float (&v)[VEC], const scalar_t* __restrict__ residual_grad,
                                                  long long at) {
    if (residual_grad == nullptr) return;
    float r[VEC];
    load_vec(residual_grad + at, r);
#pragma unroll
    for (int i = 0; i < VEC; ++i) v[i] += r[i];
}

__device__ void backward_long_rows(scalar_t* __restrict__ dx, float* my_dw, const scalar_t* __restrict__ dy,
                                   const scalar_t* __restrict__ x, const scalar_t* __restrict__ w,
                                   const float* __restrict__ rstd_in, const scalar_t* __restrict__ residual_grad,
                                   int rows, int cols, int warp, int lane) {
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
            add_residual_grad(dv, residual_grad, base + c);
            store_vec(dx + base + c, dv);
        }
    }
}

// Rows that fit the register cache: each lane owns fixed columns, so w and its dw sums stay in registers.
__device__ void backward_short_rows(scalar_t* __restrict__ dx, float* my_dw, const scalar_t* __restrict__ dy,
                                    const scalar_t* __restrict__ x, const scalar_t* __restrict__ w,
                                    const float* __restrict__ rstd_in, const scalar_t* __restrict__ residual_grad,
                                    int rows, int cols, int warp, int lane) {
    float wv[MAX_VECS][VEC], dw_sum[MAX_VECS][VEC];
    load_row(wv, w, cols, lane);
#pragma unroll
    for (int i = 0; i < MAX_VECS; ++i)
#pragma unroll
        for (int k = 0; k < VEC; ++k) dw_sum[i][k] = 0.0f;
    for (int row = blockIdx.x * ROWS_PER_BLOCK + warp; row < rows; row += gridDim.x * ROWS_PER_BLOCK) {
        const long long base = (long long)row * cols;
        const float rstd = rstd_in[row];
        float xv[MAX_VECS][VEC], dv[MAX_VECS][VEC];
        load_row(xv, x + base, cols, lane);
        load_row(dv, dy + base, cols, lane);
        float dot = 0.0f;
#pragma unroll
        for (int i = 0; i < MAX_VECS; ++i) {
            if ((lane + 32 * i) * VEC >= cols) continue;
#pragma unroll
            for (int k = 0; k < VEC; ++k) {
                xv[i][k] *= rstd;  // xhat
                dot += dv[i][k] * wv[i][k] * xv[i][k];
                dw_sum[i][k] += dv[i][k] * xv[i][k];
            }
        }
        const float mean_dot = warp_sum(dot) / cols;
#pragma unroll
        for (int i = 0; i < MAX_VECS; ++i) {
            const int c = (lane + 32 * i) * VEC;
            if (c >= cols) continue;
#pragma unroll
            for (int k = 0; k < VEC; ++k) dv[i][k] = rstd * (dv[i][k] * wv[i][k] - xv[i][k] * mean_dot);
            add_residual_grad(dv[i], residual_grad, base + c);
            store_vec(dx + base + c, dv[i]);
        }
    }
#pragma unroll
    for (int i = 0; i < MAX_VECS; ++i) {
        const int c = (lane + 32 * i) * VEC;
        if (c >= cols) continue;
#pragma unroll
        for (int k = 0; k < VEC; ++k) my_dw[c + k] = dw_sum[i][k];
    }
}

extern "C" __global__ void rmsnorm_backward(scalar_t* __restrict__ dx, float* __restrict__ dw,
                                            const scalar_t* __restrict__ dy, const scalar_t* __restrict__ x,
                                            const scalar_t* __restrict__ w, const float* __restrict__ rstd_in,
                                            const scalar_t* __restrict__ residual_grad, int rows, int cols) {
    extern __shared__ float dw_partial[];  // (ROWS_PER_BLOCK, cols): each warp's dw sums
    const int lane = threadIdx.x & 31;
    const int warp = threadIdx.x >> 5;
    float* my_dw = dw_partial + warp * cols;
    if (cols <= 32 * VEC * MAX_VECS) {
        backward_short_rows(dx, my_dw, dy, x, w, rstd_in, residual_grad, rows, cols, warp, lane);
    } else {
        backward_long_rows(dx, my_dw, dy, x, w, rstd_in, residual_grad, rows, cols, warp, lane);
    }
    __syncthreads();
    for (int c = threadIdx.x; c < cols; c += blockDim.x) {
        float sum = 0.0f;
#pragma unroll
        for (int r = 0; r < ROWS_PER_BLOCK; ++r) sum += dw_partial[r * cols + c];
        atomicAdd(dw + c, sum);
    }
}
