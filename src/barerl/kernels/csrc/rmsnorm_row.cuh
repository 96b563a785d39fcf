// RMSNorm of a row held in registers by one warp (lane owns vectors lane + 32 i, i < MAX_VECS): the forward
// of rmsnorm.cu's short rows, shared with linear.cu's split_k_sum_rmsnorm so that both give the same bits.
//
// Math:    rstd = 1 / sqrt(mean_c x[c]^2 + eps);  y[c] = x[c] * (rstd * w[c]); the sum of squares runs over a
//          lane's vectors in order, then across the warp (warp_sum).
// Rows:    up to 32 * VEC * MAX_VECS elements (1024 bf16 with the default 4).
#include "common.cuh"

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

// Writes y = rmsnorm(v) * w (v is scaled in place) and returns rstd; all 32 lanes call it.
__device__ __forceinline__ float normalize_row(float (&v)[MAX_VECS][VEC], scalar_t* y, const scalar_t* w,
                                               int cols, int lane, float eps) {
    float ss = 0.0f;
#pragma unroll
    for (int i = 0; i < MAX_VECS; ++i)
#pragma unroll
        for (int k = 0; k < VEC; ++k) ss += (lane + 32 * i) * VEC < cols ? v[i][k] * v[i][k] : 0.0f;
    const float rstd = rsqrtf(warp_sum(ss) / cols + eps);
#pragma unroll
    for (int i = 0; i < MAX_VECS; ++i) {
        const int c = (lane + 32 * i) * VEC;
        if (c >= cols) continue;
        float wv[VEC];
        load_vec(w + c, wv);
#pragma unroll
        for (int k = 0; k < VEC; ++k) v[i][k] *= rstd * wv[k];
        store_vec(y + c, v[i]);
    }
    return rstd;
}
