// LM-head log-softmax statistics and gradient over one chunk of fp32 logits (computed by a cuBLAS GEMM with
// Reference twin: ops/ref/lm_head.py (lm_head_logprobs, lm_head_backward, lm_head_forward_backward).
// Launchers: ops/cuda/lm_head.py; tests: tests/ops/test_lm_head.py.
// alpha = inv_temperature, so `logits` here are already scaled).
//
// Math (per row r, logits l over V classes, target y = targets[r]):
//          lse = log sum_j exp(l_j);  logprob = l_y - lse;  entropy = lse - sum_j p_j l_j, p = exp(l - lse)
//          backward with g = dlogprobs[r], tau = inv_temperature: dlogits_j = tau * g * ([j == y] - p_j)
//          (the gradient with respect to the unscaled h @ w.T, ready for the two GEMMs dh, dw).
// Shapes:  logits (rows, V) fp32, row stride V; targets (rows,) int32; logprobs, lse, entropy, dlogprobs
//          (rows,) fp32; dlogits (rows, V) DTYPE.
// Launch:  one block of 512 threads per row. Statistics use one pass with an online (max, sum, weighted sum)
//          per thread, merged across the block; 16-byte loads when V % 4 == 0.
#include "common.cuh"

struct SoftmaxState {
    float m, s, t;  // running max, sum exp(l - m), sum exp(l - m) * l
};

__device__ __forceinline__ void push(SoftmaxState& a, float l) {
    if (l > a.m) {
        const float c = __expf(a.m - l);  // a.m = -inf gives c = 0
        a.s *= c;
        a.t *= c;
        a.m = l;
    }
    const float e = __expf(l - a.m);
    a.s += e;
    a.t += e * l;
}

__device__ __forceinline__ SoftmaxState merge(SoftmaxState a, SoftmaxState b) {
    const float m = fmaxf(a.m, b.m);
    if (m == NEG_INF) return a;
    const float ca = __expf(a.m - m), cb = __expf(b.m - m);
    return {m, a.s * ca + b.s * cb, a.t * ca + b.t * cb};
}

extern "C" __global__ void lm_head_stats(float* __restrict__ logprobs, float* __restrict__ lse_out,
                                         float* __restrict__ entropy, const float* __restrict__ logits,
                                         const int* __restrict__ targets, int cols) {
    __shared__ SoftmaxState partial[32];
    const int row = blockIdx.x;
    const float* l = logits + (long long)row * cols;
    SoftmaxState st = {NEG_INF, 0.0f, 0.0f};
    if ((cols & 3) == 0) {
        for (int c = threadIdx.x * 4; c < cols; c += blockDim.x * 4) {
            const float4 v = *reinterpret_cast<const float4*>(l + c);
            push(st, v.x);
            push(st, v.y);
            push(st, v.z);
            push(st, v.w);
        }
    } else {
        for (int c = threadIdx.x; c < cols; c += blockDim.x) push(st, l[c]);
    }
#pragma unroll
    for (int o = 16; o > 0; o >>= 1) {
        const SoftmaxState other = {__shfl_xor_sync(0xffffffffu, st.m, o), __shfl_xor_sync(0xffffffffu, st.s, o),
                                    __shfl_xor_sync(0xffffffffu, st.t, o)};
        st = merge(st, other);
    }
    if ((threadIdx.x & 31) == 0) partial[threadIdx.x >> 5] = st;
    __syncthreads();
    if (threadIdx.x == 0) {
        for (int w = 1; w < (int)(blockDim.x >> 5); ++w) st = merge(st, partial[w]);
        const float lse = st.m + __logf(st.s);
        lse_out[row] = lse;
        logprobs[row] = l[targets[row]] - lse;
        entropy[row] = lse - st.t / st.s;
    }
}

extern "C" __global__ void lm_head_dlogits(scalar_t* __restrict__ dlogits, const float* __restrict__ logits,
                                           const int* __restrict__ targets, const float* __restrict__ lse_in,
                                           const float* __restrict__ dlogprobs, int cols, float inv_temperature) {
    const int row = blockIdx.x;
    const float* l = logits + (long long)row * cols;
    scalar_t* d = dlogits + (long long)row * cols;
    const float lse = lse_in[row];
    const float g = dlogprobs[row] * inv_temperature;
    const int target = targets[row];
    if ((cols & 3) == 0) {
        for (int c = threadIdx.x * 4; c < cols; c += blockDim.x * 4) {
            const float4 v = *reinterpret_cast<const float4*>(l + c);
            const float lv[4] = {v.x, v.y, v.z, v.w};
#pragma unroll
            for (int k = 0; k < 4; ++k) d[c + k] = from_float<scalar_t>(g * ((c + k == target) - __expf(lv[k] - lse)));
        }
    } else {
        for (int c = threadIdx.x; c < cols; c += blockDim.x) {
            d[c] = from_float<scalar_t>(g * ((c == target) - __expf(l[c] - lse)));
        }
    }
}
