// Fused AdamW step over one flat fp32 master buffer, and the global gradient norm.
// Reference twin: ops/ref/adamw.py (adamw_step, grad_norm).
// Launchers: ops/cuda/adamw.py; tests: tests/ops/test_adamw.py.
//
// Math (torch.optim.AdamW, per element; g = grad * grad_scale; d = decay_mask ? 1 - lr * wd : 1):
//          p *= d;  m = b1 m + (1 - b1) g;  v = b2 v + (1 - b2) g^2;
//          p -= step_size * m / (sqrt(v) / bias_correction2_sqrt + eps);  working = p rounded to WORK_DTYPE
//          with step_size = lr / (1 - b1^step), bias_correction2_sqrt = sqrt(1 - b2^step) (host computed).
//          stochastic != 0 (bf16 working weights only): working = stochastic_round_bf16(p, 16 bits of
//          splitmix64(rounding_seed, step * 2^40 + offset + i + 1)), unbiased (see ops.ref.adamw);
//          `offset` is element 0's index in the whole buffer, so a buffer updated chunk by chunk rounds
//          exactly as in one launch. master_low != null (with stochastic rounding): the master is held as its
//          low 16 bits, its high half being working's bits less the carry of (low + step - 1's random bits)
//          (ops.ref.adamw.master_from_low16); master is then null.
//          grad_norm: sum of g^2 in fp32 per block, blocks added into one fp64 scalar (caller zeroes it).
// Shapes:  master, exp_avg, exp_avg_sq (N,) fp32, updated in place; grad (N,) DTYPE; decay_mask (N,) uint8 or
//          null (decay everywhere); working (N,) WORK_DTYPE or null, overwritten; master_low (N,) uint16 or null.
// Launch:  grid-stride over N, 256 threads per block; one pass: each element read and written once.
//          IEEE division and sqrt (no fast math), so fp32 results match the reference bit for bit or nearly.
#include "common.cuh"

#ifndef WORK_DTYPE
#define WORK_DTYPE __nv_bfloat16
#endif

// Nearest for every working dtype; stochastic for bf16 when asked (the launcher allows it only there).
template <typename T>
__device__ __forceinline__ T round_working(float p, int, u64, long long, long long) { return from_float<T>(p); }
// Element i's 16 random bits at `step`: splitmix64(seed, step * 2^40 + i + 1) >> 48.
__device__ __forceinline__ unsigned int rounding_bits(u64 seed, long long step, long long i) {
    return (unsigned int)(splitmix64(seed, ((u64)step << 40) + (u64)i + 1ull) >> 48);
}
template <>
__device__ __forceinline__ __nv_bfloat16 round_working<__nv_bfloat16>(float p, int stochastic, u64 seed,
                                                                      long long step, long long i) {
    if (!stochastic) return from_float<__nv_bfloat16>(p);
    return stochastic_round_bf16(p, rounding_bits(seed, step, i));
}

extern "C" __global__ void adamw_step(float* __restrict__ master, float* __restrict__ exp_avg,
                                      float* __restrict__ exp_avg_sq, WORK_DTYPE* __restrict__ working,
                                      const scalar_t* __restrict__ grad, const unsigned char* __restrict__ decay_mask,
                                      long long n, float grad_scale, float beta1, float beta2, float eps,
                                      float decay, float step_size, float bias_correction2_sqrt,
                                      int stochastic, u64 rounding_seed, long long step, long long offset,
                                      unsigned short* __restrict__ master_low) {
    for (long long i = blockIdx.x * (long long)blockDim.x + threadIdx.x; i < n; i += (long long)gridDim.x * blockDim.x) {
        const float g = to_float(grad[i]) * grad_scale;
        float p;
        if (master_low != nullptr) {
            const unsigned int low = master_low[i], high = reinterpret_cast<const unsigned short*>(working)[i];
            const unsigned int carry = (low + rounding_bits(rounding_seed, step - 1, offset + i)) >> 16;
            p = __uint_as_float(((high - carry) << 16) | low);
        } else {
            p = master[i];
        }
        if (decay_mask == nullptr || decay_mask[i] != 0) p *= decay;
        const float m = beta1 * exp_avg[i] + (1.0f - beta1) * g;
        const float v = beta2 * exp_avg_sq[i] + (1.0f - beta2) * g * g;
        p -= step_size * m / (sqrtf(v) / bias_correction2_sqrt + eps);
        if (master_low != nullptr) {
            master_low[i] = (unsigned short)(__float_as_uint(p) & 0xFFFFu);
        } else {
            master[i] = p;
        }
        exp_avg[i] = m;
        exp_avg_sq[i] = v;
        if (working != nullptr) working[i] = round_working<WORK_DTYPE>(p, stochastic, rounding_seed, step, offset + i);
    }
}

extern "C" __global__ void grad_sum_squares(double* __restrict__ total, const scalar_t* __restrict__ grad,
                                            long long n) {
    float sum = 0.0f;
    for (long long i = blockIdx.x * (long long)blockDim.x + threadIdx.x; i < n; i += (long long)gridDim.x * blockDim.x) {
        const float g = to_float(grad[i]);
        sum += g * g;
    }
    sum = block_sum(sum);
    if (threadIdx.x == 0) atomicAdd(total, (double)sum);
}
