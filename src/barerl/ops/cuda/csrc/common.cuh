// Shared device helpers for every barerl kernel.
//
// Element type: each .cu is compiled once per storage dtype with -DDTYPE=<float | __half | __nv_bfloat16>
// (barerl.ops.cuda.build.ctype); `scalar_t` is that type. All arithmetic is fp32: load with to_float,
// store with from_float<T> (round to nearest even).
// Vectors: VEC = elements of scalar_t in 16 bytes; load_vec/store_vec move VEC elements as one 16-byte access
// (the pointer must be 16-byte aligned: launchers check row lengths are multiples of VEC).
// Row vectors: for_each_row_vector(rows, cols, body) grid-strides over the VEC-wide vectors of a row-major
// (rows, cols) array (cols % VEC == 0), calling body(row, col) with col the vector's first column.
// Reductions: warp_sum/warp_max over the 32 lanes; block_sum/block_max over the block (blockDim.x a
// multiple of 32, at most 1024), every thread gets the result; they use 32 floats of static shared memory.
// NVRTC-friendly: no standard library headers.
#pragma once
#include <cuda_bf16.h>
#include <cuda_fp16.h>

#ifndef DTYPE
#define DTYPE __nv_bfloat16
#endif
typedef DTYPE scalar_t;

__device__ __forceinline__ float to_float(float x) { return x; }
__device__ __forceinline__ float to_float(__half x) { return __half2float(x); }
__device__ __forceinline__ float to_float(__nv_bfloat16 x) { return __bfloat162float(x); }

template <typename T> __device__ __forceinline__ T from_float(float x);
template <> __device__ __forceinline__ float from_float<float>(float x) { return x; }
template <> __device__ __forceinline__ __half from_float<__half>(float x) { return __float2half_rn(x); }
template <> __device__ __forceinline__ __nv_bfloat16 from_float<__nv_bfloat16>(float x) {
    return __float2bfloat16_rn(x);
}

typedef unsigned long long u64;

// Counter-based random bits, the reference's ops.ref.counter_rng.splitmix64 (uint64, wrapping).
__device__ __forceinline__ u64 splitmix64(u64 seed, u64 key) {
    const u64 x = seed + 0x9E3779B97F4A7C15ull * key;
    u64 z = (x ^ (x >> 30)) * 0xBF58476D1CE4E5B9ull;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
    return z ^ (z >> 31);
}

// x rounded to bf16 up with probability (distance to the lower neighbour) / gap, given 16 random bits:
// the reference's stochastic_round_bfloat16 (inf and NaN round to nearest).
__device__ __forceinline__ __nv_bfloat16 stochastic_round_bf16(float x, unsigned int random16) {
    const unsigned int bits = __float_as_uint(x);
    if ((bits & 0x7f800000u) == 0x7f800000u) return __float2bfloat16_rn(x);
    return __ushort_as_bfloat16((unsigned short)((bits + random16) >> 16));
}

constexpr int VEC = 16 / sizeof(scalar_t);
#define NEG_INF __int_as_float(0xff800000)

template <typename Body>
__device__ __forceinline__ void for_each_row_vector(long long rows, int cols, Body body) {
    const int vecs_per_row = cols / VEC;
    const long long total = rows * vecs_per_row;
    for (long long i = blockIdx.x * (long long)blockDim.x + threadIdx.x; i < total;
         i += (long long)gridDim.x * blockDim.x) {
        const long long row = i / vecs_per_row;
        body(row, (int)(i - row * vecs_per_row) * VEC);
    }
}

// VEC elements at p (16-byte aligned) -> out[0..VEC) as fp32.
__device__ __forceinline__ void load_vec(const scalar_t* p, float* out) {
    uint4 raw = *reinterpret_cast<const uint4*>(p);
    const scalar_t* e = reinterpret_cast<const scalar_t*>(&raw);
#pragma unroll
    for (int i = 0; i < VEC; ++i) out[i] = to_float(e[i]);
}

// in[0..VEC) rounded to scalar_t -> p (16-byte aligned).
__device__ __forceinline__ void store_vec(scalar_t* p, const float* in) {
    uint4 raw;
    scalar_t* e = reinterpret_cast<scalar_t*>(&raw);
#pragma unroll
    for (int i = 0; i < VEC; ++i) e[i] = from_float<scalar_t>(in[i]);
    *reinterpret_cast<uint4*>(p) = raw;
}

__device__ __forceinline__ float warp_sum(float v) {
#pragma unroll
    for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
    return v;
}

__device__ __forceinline__ float warp_max(float v) {
#pragma unroll
    for (int o = 16; o > 0; o >>= 1) v = fmaxf(v, __shfl_xor_sync(0xffffffffu, v, o));
    return v;
}

// Block-wide reduction; all threads of the block must call it (it holds two __syncthreads).
template <bool IS_MAX>
__device__ __forceinline__ float block_reduce(float v) {
    __shared__ float partial[32];
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, num_warps = blockDim.x >> 5;
    v = IS_MAX ? warp_max(v) : warp_sum(v);
    __syncthreads();  // `partial` may still be read by a previous call
    if (lane == 0) partial[warp] = v;
    __syncthreads();
    v = lane < num_warps ? partial[lane] : (IS_MAX ? NEG_INF : 0.0f);
    return IS_MAX ? warp_max(v) : warp_sum(v);
}

__device__ __forceinline__ float block_sum(float v) { return block_reduce<false>(v); }
__device__ __forceinline__ float block_max(float v) { return block_reduce<true>(v); }
