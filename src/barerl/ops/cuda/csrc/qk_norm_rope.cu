// Per-head q/k RMSNorm (Qwen3; optional) + rotary embedding (NeoX half-split), fused; v passes through.
// Reference twin: ops/ref/qk_norm_rope.py (qk_norm_rope, qk_norm_rope_backward, qk_norm_rope_store).
// Launchers: ops/cuda/qk_norm_rope.py; tests: tests/ops/test_qk_norm_rope.py.
// The forward can also write each token's rotated k and its v into the paged KV cache (the engine's
// qk_norm_rope_store: qk_norm_rope then store_kv, in one kernel).
//
// Math (per token t, per q or k head, HALF = D / 2, i < HALF, p = positions[t]):
//          r = 1 / sqrt(mean(x^2) + eps);  n = x * r * w            (n = x when there is no norm weight)
//          y[i] = n[i] * cos[p, i] - n[i + HALF] * sin[p, i];  y[i + HALF] = n[i + HALF] * cos[p, i] + n[i] * sin[p, i]
//          backward: g[i] = dy[i] c + dy[i+HALF] s, g[i+HALF] = dy[i+HALF] c - dy[i] s (the transposed rotation),
//          then the RMSNorm backward of g: dx = r * (g w - xhat * mean(g w xhat)), dw += g * xhat (xhat = x r).
//          cache store (k_cache non-null): k_cache[slot, kh, :] = out's k head kh, v_cache[slot, kh, :] = its
//          v head kh, for slot = slot_mapping[t] (flat: block * BS + offset; slot < 0 skips the token); the
//          value is rounded to DTYPE as in out, then to CACHE_T: exactly what store_kv writes from out.
// Shapes:  qkv, out, dout, dqkv (T, (H + 2K) * D) DTYPE, rows contiguous; positions (T,) int32;
//          cos, sin (P, HALF) fp32; q_norm, k_norm (D,) DTYPE or both null; q_rstd (T, H), k_rstd (T, K) fp32
//          (unused without norm); dq_norm, dk_norm (D,) fp32, accumulated (the caller zeroes them);
//          k_cache, v_cache (num_blocks, BS, K, D) CACHE_T, dense, or both null (no store); slot_mapping (T,)
//          int32 (unused without caches).
// Launch:  forward: one warp per (token, head) (grid-stride: a decode step's few tokens still fill the GPU);
//          backward: one warp per token; 4 warps per block; compiled per HEAD_DIM (a multiple of 64):
//          lane l holds elements l PER + j and HALF + l PER + j (j < PER = D / 64), so each rotation pair
//          is in one lane and each half moves as one PER-element access per lane.
//          Backward sums dq_norm/dk_norm per lane in registers, then per block in shared memory, then one
//          atomicAdd per element per block.
//          The cache store is a run-time switch (k_cache != null, uniform over the grid): the warp that
//          writes a k or v head of out writes the same registers to the cache, so k and v are not read back.
// Macros:  DTYPE = qkv/out type, HEAD_DIM, CACHE_T = KV-cache storage type (defaults to DTYPE).
#include "common.cuh"

#ifndef HEAD_DIM
#define HEAD_DIM 128
#endif
#ifndef CACHE_T
#define CACHE_T DTYPE
#endif
typedef CACHE_T cache_t;
constexpr int HALF = HEAD_DIM / 2;
constexpr int PER = HALF / 32;  // pairs per lane
constexpr int WARPS = 4;

struct Head {
    float lo[PER], hi[PER];
};

// PER contiguous elements moved as one access (4 bytes for bf16 and D = 128).
template <typename T>
struct alignas(PER * sizeof(T)) Pack {
    T v[PER];
};

__device__ __forceinline__ Head load_head(const scalar_t* p, int lane) {
    const Pack<scalar_t> lo = *reinterpret_cast<const Pack<scalar_t>*>(p + lane * PER);
    const Pack<scalar_t> hi = *reinterpret_cast<const Pack<scalar_t>*>(p + HALF + lane * PER);
    Head h;
#pragma unroll
    for (int j = 0; j < PER; ++j) {
        h.lo[j] = to_float(lo.v[j]);
        h.hi[j] = to_float(hi.v[j]);
    }
    return h;
}

template <typename T>
__device__ __forceinline__ void store_head(T* p, const Head& h, int lane) {
    Pack<T> lo, hi;
#pragma unroll
    for (int j = 0; j < PER; ++j) {
        lo.v[j] = from_float<T>(h.lo[j]);
        hi.v[j] = from_float<T>(h.hi[j]);
    }
    *reinterpret_cast<Pack<T>*>(p + lane * PER) = lo;
    *reinterpret_cast<Pack<T>*>(p + HALF + lane * PER) = hi;
}

// The kv-th of a token's 2K k and v heads (as written to out) -> its cache row at the token's slot (none when
// slot < 0); rounded to DTYPE first, so the cache holds what store_kv would copy from out.
__device__ __forceinline__ void store_cache_head(cache_t* k_cache, cache_t* v_cache, int slot, Head x, int kv,
                                                 int num_kv_heads, int lane) {
    if (slot < 0) return;
#pragma unroll
    for (int j = 0; j < PER; ++j) {
        x.lo[j] = to_float(from_float<scalar_t>(x.lo[j]));
        x.hi[j] = to_float(from_float<scalar_t>(x.hi[j]));
    }
    const bool is_k = kv < num_kv_heads;
    cache_t* cache = is_k ? k_cache : v_cache;
    const int head = is_k ? kv : kv - num_kv_heads;
    store_head(cache + ((long long)slot * num_kv_heads + head) * HEAD_DIM, x, lane);
}

// This lane's PER cos and sin values of position pos (tables (positions, HALF) fp32).
__device__ __forceinline__ void load_rotation(const float* cos_table, const float* sin_table, int pos, int lane,
                                              float* c, float* s) {
#pragma unroll
    for (int j = 0; j < PER; ++j) {
        c[j] = cos_table[(long long)pos * HALF + lane * PER + j];
        s[j] = sin_table[(long long)pos * HALF + lane * PER + j];
    }
}

__device__ __forceinline__ float head_rstd(const Head& h, float eps) {
    float ss = 0.0f;
#pragma unroll
    for (int j = 0; j < PER; ++j) ss += h.lo[j] * h.lo[j] + h.hi[j] * h.hi[j];
    return rsqrtf(warp_sum(ss) / HEAD_DIM + eps);
}

extern "C" __global__ void qk_norm_rope_forward(
    scalar_t* __restrict__ out, float* __restrict__ q_rstd, float* __restrict__ k_rstd,
    const scalar_t* __restrict__ qkv, const int* __restrict__ positions, const float* __restrict__ cos_table,
    const float* __restrict__ sin_table, const scalar_t* __restrict__ q_norm, const scalar_t* __restrict__ k_norm,
    cache_t* __restrict__ k_cache, cache_t* __restrict__ v_cache, const int* __restrict__ slot_mapping,
    int tokens, int num_heads, int num_kv_heads, float eps) {
    const int lane = threadIdx.x & 31;
    const int heads = num_heads + 2 * num_kv_heads;
    const long long items = (long long)tokens * heads;
    for (long long item = blockIdx.x * WARPS + (threadIdx.x >> 5); item < items; item += gridDim.x * WARPS) {
        const int t = (int)(item / heads), h = (int)(item % heads);
        const long long offset = item * HEAD_DIM;  // row t, head h
        const bool rotated = h < num_heads + num_kv_heads, is_q = h < num_heads;
        const scalar_t* w = is_q ? q_norm : k_norm;
        // every load before any math: the head, its norm weight, its rotation and its cache slot travel together
        Head x = load_head(qkv + offset, lane), weight;
        if (rotated && w != nullptr) weight = load_head(w, lane);
        float c[PER], s[PER];
        if (rotated) load_rotation(cos_table, sin_table, positions[t], lane, c, s);
        const int slot = k_cache != nullptr && !is_q ? slot_mapping[t] : -1;
        if (rotated) {
            if (w != nullptr) {
                const float r = head_rstd(x, eps);
                if (lane == 0) {
                    if (is_q) q_rstd[(long long)t * num_heads + h] = r;
                    else k_rstd[(long long)t * num_kv_heads + h - num_heads] = r;
                }
#pragma unroll
                for (int j = 0; j < PER; ++j) {
                    x.lo[j] *= r * weight.lo[j];
                    x.hi[j] *= r * weight.hi[j];
                }
            }
#pragma unroll
            for (int j = 0; j < PER; ++j) {
                const float lo = x.lo[j], hi = x.hi[j];
                x.lo[j] = lo * c[j] - hi * s[j];
                x.hi[j] = hi * c[j] + lo * s[j];
            }
        }
        store_head(out + offset, x, lane);
        if (k_cache != nullptr && !is_q)
            store_cache_head(k_cache, v_cache, slot, x, h - num_heads, num_kv_heads, lane);
    }
}

extern "C" __global__ void qk_norm_rope_backward(
    scalar_t* __restrict__ dqkv, float* __restrict__ dq_norm, float* __restrict__ dk_norm,
    const scalar_t* __restrict__ dout, const scalar_t* __restrict__ qkv, const int* __restrict__ positions,
    const float* __restrict__ cos_table, const float* __restrict__ sin_table, const scalar_t* __restrict__ q_norm,
    const scalar_t* __restrict__ k_norm, const float* __restrict__ q_rstd, const float* __restrict__ k_rstd,
    int tokens, int num_heads, int num_kv_heads) {
    __shared__ float dw_block[2][HEAD_DIM];
    const int lane = threadIdx.x & 31;
    const int heads = num_heads + 2 * num_kv_heads;
    const bool has_norm = q_norm != nullptr;
    Head dw[2];  // per-lane partial sums of dq_norm, dk_norm
#pragma unroll
    for (int j = 0; j < PER; ++j) dw[0].lo[j] = dw[0].hi[j] = dw[1].lo[j] = dw[1].hi[j] = 0.0f;
    for (int t = blockIdx.x * WARPS + (threadIdx.x >> 5); t < tokens; t += gridDim.x * WARPS) {
        const long long row = (long long)t * heads * HEAD_DIM;
        const int pos = positions[t];
        float c[PER], s[PER];
        load_rotation(cos_table, sin_table, pos, lane, c, s);
        for (int h = 0; h < heads; ++h) {
            Head g = load_head(dout + row + h * HEAD_DIM, lane);
            if (h < num_heads + num_kv_heads) {
#pragma unroll
                for (int j = 0; j < PER; ++j) {
                    const float lo = g.lo[j], hi = g.hi[j];
                    g.lo[j] = lo * c[j] + hi * s[j];
                    g.hi[j] = hi * c[j] - lo * s[j];
                }
                if (has_norm) {
                    const bool is_q = h < num_heads;
                    const scalar_t* w = is_q ? q_norm : k_norm;
                    const float r = is_q ? q_rstd[(long long)t * num_heads + h]
                                         : k_rstd[(long long)t * num_kv_heads + h - num_heads];
                    const Head x = load_head(qkv + row + h * HEAD_DIM, lane);
                    Head& acc = dw[is_q ? 0 : 1];
                    float dot = 0.0f;
                    float wlo[PER], whi[PER];
#pragma unroll
                    for (int j = 0; j < PER; ++j) {
                        wlo[j] = to_float(w[lane * PER + j]);
                        whi[j] = to_float(w[HALF + lane * PER + j]);
                        dot += g.lo[j] * wlo[j] * x.lo[j] * r + g.hi[j] * whi[j] * x.hi[j] * r;
                        acc.lo[j] += g.lo[j] * x.lo[j] * r;
                        acc.hi[j] += g.hi[j] * x.hi[j] * r;
                    }
                    const float mean_dot = warp_sum(dot) / HEAD_DIM;
#pragma unroll
                    for (int j = 0; j < PER; ++j) {
                        g.lo[j] = r * (g.lo[j] * wlo[j] - x.lo[j] * r * mean_dot);
                        g.hi[j] = r * (g.hi[j] * whi[j] - x.hi[j] * r * mean_dot);
                    }
                }
            }
            store_head(dqkv + row + h * HEAD_DIM, g, lane);
        }
    }
    if (!has_norm) return;  // uniform over the block: no barrier is skipped by only some threads
    for (int i = threadIdx.x; i < 2 * HEAD_DIM; i += blockDim.x) (&dw_block[0][0])[i] = 0.0f;
    __syncthreads();
#pragma unroll
    for (int k = 0; k < 2; ++k) {
#pragma unroll
        for (int j = 0; j < PER; ++j) {
            atomicAdd(&dw_block[k][lane * PER + j], dw[k].lo[j]);
            atomicAdd(&dw_block[k][HALF + lane * PER + j], dw[k].hi[j]);
        }
    }
    __syncthreads();
    for (int i = threadIdx.x; i < HEAD_DIM; i += blockDim.x) {
        atomicAdd(dq_norm + i, dw_block[0][i]);
        atomicAdd(dk_norm + i, dw_block[1][i]);
    }
}
