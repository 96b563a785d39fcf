// paged_attention: causal attention of query tokens against a paged KV cache, split-KV ("flash-decoding").
//
// Math:    for query token t of sequence s (the i-th of its n new tokens, n = cu_seqlens_q[s+1] - cu[s]), at
//          position pos = context_lens[s] - n + i, and query head h = kvh * GROUP + g:
//            o[t, h] = sum_{j <= pos} softmax_j(scale * q[t, h] . K[s, j, kvh]) V[s, j, kvh]
//          where token j of sequence s lives in physical block block_tables[s, j / BS], row j % BS.
//          Scores are kept in the log2 domain (q is pre-multiplied by scale * log2(e)); all math is fp32.
// Split-KV: the L = pos + 1 visible keys of a query are cut into `num_splits` even, contiguous parts, one CTA
//          each. With one split the CTA writes o directly; otherwise it writes its normalised partial output
//          o_part and its log2-sum-exp lse_part, and `paged_attention_combine` merges the parts:
//            o = sum_p 2^(lse_p - M) o_p / sum_p 2^(lse_p - M),  M = max_p lse_p  (empty parts: lse = -inf).
// GQA:     one CTA serves the GROUP query heads of one kv head, so each K/V byte is read once per query token.
// Shapes:  q (T, H, D) Q_T dense; k_cache, v_cache (num_blocks, BS, K, D) DTYPE dense; block_tables
//          (S, max_blocks) int32; context_lens (S,) int32; cu_seqlens_q (S+1,) int32; out (T, H, D) Q_T;
//          o_part (T, H, num_splits, D) fp32 and lse_part (T, H, num_splits) fp32 (unused with one split).
// Launch:  paged_attention_split: grid (num_splits, K, T), THREADS threads, static shared memory only.
//          paged_attention_combine: grid (T * H,), 64 or 128 threads.
//          is_decode != 0 promises one query per sequence (T == S), which skips the search for t's sequence.
// Layout inside a CTA: a K or V row of D elements is read by TPT = D / VEC threads, one 16-byte vector each;
//          the CTA's THREADS / TPT thread groups take tokens side by side, UNROLL tokens each in flight.
//          Per CHUNK tokens: (1) scores into shared memory, (2) per-head online-softmax update of the running
//          max and sum, (3) P @ V into per-thread fp32 accumulators, rescaled when the max grows.
// Macros:  DTYPE (cache type), Q_T (q/out type, default DTYPE), HEAD_DIM (default 128), GROUP (default 2).
#include "common.cuh"

#ifndef Q_T
#define Q_T DTYPE
#endif
#ifndef HEAD_DIM
#define HEAD_DIM 128
#endif
#ifndef GROUP
#define GROUP 2
#endif

constexpr int THREADS = 128;
constexpr int NUM_WARPS = THREADS / 32;
constexpr int TPT = HEAD_DIM / VEC;  // threads per K/V row
constexpr int NTG = THREADS / TPT;   // token groups of a CTA
constexpr int CHUNK = 256;           // tokens whose scores sit in shared memory at once
constexpr int UNROLL = 4;            // 16-byte loads in flight per thread
static_assert(HEAD_DIM % VEC == 0 && TPT <= 32 && (TPT & (TPT - 1)) == 0, "unsupported HEAD_DIM for DTYPE");
static_assert(GROUP >= 1 && GROUP <= 16, "GROUP (query heads per kv head) must be 1..16");

__device__ __forceinline__ void vec_to_float(const uint4& raw, float* out) {
    const scalar_t* e = reinterpret_cast<const scalar_t*>(&raw);
#pragma unroll
    for (int i = 0; i < VEC; ++i) out[i] = to_float(e[i]);
}

// The sequence owning packed query token t: the last s with cu_seqlens_q[s] <= t.
__device__ __forceinline__ int sequence_of(const int* cu_seqlens_q, int num_seqs, int t) {
    int lo = 0, hi = num_seqs - 1;
    while (lo < hi) {
        const int mid = (lo + hi + 1) >> 1;
        if (cu_seqlens_q[mid] <= t) lo = mid; else hi = mid - 1;
    }
    return lo;
}

// Row of token j (logical position in its sequence) of kv head kvh, at this thread's 16-byte slice.
__device__ __forceinline__ const scalar_t* row_ptr(const scalar_t* cache, const int* table, int j, int block_size,
                                                   int num_kv_heads, int kvh, int lane) {
    const long long phys = table[j / block_size];
    return cache + ((phys * block_size + j % block_size) * num_kv_heads + kvh) * HEAD_DIM + lane * VEC;
}

extern "C" __global__ void __launch_bounds__(THREADS) paged_attention_split(
        const Q_T* __restrict__ q, const scalar_t* __restrict__ k_cache, const scalar_t* __restrict__ v_cache,
        const int* __restrict__ block_tables, const int* __restrict__ context_lens,
        const int* __restrict__ cu_seqlens_q, Q_T* __restrict__ out, float* __restrict__ o_part,
        float* __restrict__ lse_part, int num_seqs, int num_kv_heads, int block_size, int max_blocks,
        int num_splits, int is_decode, float scale_log2) {
    __shared__ float scores[GROUP][CHUNK];
    __shared__ float reduce_buf[NTG][HEAD_DIM];
    __shared__ float row_max[GROUP], row_sum[GROUP], rescale[GROUP];

    const int split = blockIdx.x, kvh = blockIdx.y, t = blockIdx.z;
    const int tg = threadIdx.x / TPT, lane = threadIdx.x % TPT, warp = threadIdx.x / 32;
    const int num_heads = num_kv_heads * GROUP;
    const int s = is_decode ? t : sequence_of(cu_seqlens_q, num_seqs, t);
    const int num_new = is_decode ? 1 : cu_seqlens_q[s + 1] - cu_seqlens_q[s];
    const int first_new = is_decode ? t : cu_seqlens_q[s];
    const int visible = context_lens[s] - num_new + (t - first_new) + 1;  // keys 0..pos
    const int start = (int)((long long)split * visible / num_splits);
    const int end = (int)((long long)(split + 1) * visible / num_splits);
    const int* table = block_tables + (long long)s * max_blocks;

    float qf[GROUP][VEC];
#pragma unroll
    for (int g = 0; g < GROUP; ++g) {
        const Q_T* qp = q + ((long long)t * num_heads + kvh * GROUP + g) * HEAD_DIM + lane * VEC;
#pragma unroll
        for (int e = 0; e < VEC; ++e) qf[g][e] = to_float(qp[e]) * scale_log2;
    }
    float acc[GROUP][VEC];
#pragma unroll
    for (int g = 0; g < GROUP; ++g)
#pragma unroll
        for (int e = 0; e < VEC; ++e) acc[g][e] = 0.0f;
    if (threadIdx.x < GROUP) {
        row_max[threadIdx.x] = NEG_INF;
        row_sum[threadIdx.x] = 0.0f;
    }
    __syncthreads();

    for (int c0 = start; c0 < end; c0 += CHUNK) {
        const int n = min(CHUNK, end - c0);
        // (1) scores[g][j] = q_g . k_j for the chunk's tokens
        for (int j0 = 0; j0 < n; j0 += NTG * UNROLL) {
            uint4 raw[UNROLL];
#pragma unroll
            for (int u = 0; u < UNROLL; ++u) {
                const int j = j0 + u * NTG + tg;
                raw[u] = make_uint4(0u, 0u, 0u, 0u);
                if (j < n) raw[u] = *reinterpret_cast<const uint4*>(
                    row_ptr(k_cache, table, c0 + j, block_size, num_kv_heads, kvh, lane));
            }
#pragma unroll
            for (int u = 0; u < UNROLL; ++u) {
                const int j = j0 + u * NTG + tg;
                float kf[VEC];
                vec_to_float(raw[u], kf);
#pragma unroll
                for (int g = 0; g < GROUP; ++g) {
                    float dot = 0.0f;
#pragma unroll
                    for (int e = 0; e < VEC; ++e) dot += qf[g][e] * kf[e];
#pragma unroll
                    for (int o = TPT / 2; o > 0; o >>= 1) dot += __shfl_xor_sync(0xffffffffu, dot, o);
                    if (j < n && lane == 0) scores[g][j] = dot;
                }
            }
        }
        __syncthreads();
        // (2) online softmax: new running max, probabilities in place, running sum, rescale factor
        for (int g = warp; g < GROUP; g += NUM_WARPS) {
            const float m_old = row_max[g];
            float cmax = NEG_INF;
            for (int j = threadIdx.x % 32; j < n; j += 32) cmax = fmaxf(cmax, scores[g][j]);
            const float m_new = fmaxf(m_old, warp_max(cmax));
            float sum = 0.0f;
            for (int j = threadIdx.x % 32; j < n; j += 32) {
                const float p = exp2f(scores[g][j] - m_new);
                scores[g][j] = p;
                sum += p;
            }
            sum = warp_sum(sum);
            if (threadIdx.x % 32 == 0) {
                const float alpha = exp2f(m_old - m_new);
                rescale[g] = alpha;
                row_sum[g] = row_sum[g] * alpha + sum;
                row_max[g] = m_new;
            }
        }
        __syncthreads();
        // (3) acc_g = acc_g * rescale_g + sum_j p_gj v_j
#pragma unroll
        for (int g = 0; g < GROUP; ++g)
#pragma unroll
            for (int e = 0; e < VEC; ++e) acc[g][e] *= rescale[g];
        for (int j0 = 0; j0 < n; j0 += NTG * UNROLL) {
            uint4 raw[UNROLL];
#pragma unroll
            for (int u = 0; u < UNROLL; ++u) {
                const int j = j0 + u * NTG + tg;
                if (j < n) raw[u] = *reinterpret_cast<const uint4*>(
                    row_ptr(v_cache, table, c0 + j, block_size, num_kv_heads, kvh, lane));
            }
#pragma unroll
            for (int u = 0; u < UNROLL; ++u) {
                const int j = j0 + u * NTG + tg;
                if (j < n) {
                    float vf[VEC];
                    vec_to_float(raw[u], vf);
#pragma unroll
                    for (int g = 0; g < GROUP; ++g) {
                        const float p = scores[g][j];
#pragma unroll
                        for (int e = 0; e < VEC; ++e) acc[g][e] += p * vf[e];
                    }
                }
            }
        }
        __syncthreads();  // scores are overwritten by the next chunk
    }

    // Sum the token groups' accumulators, one head at a time, and write o (or this split's part of it).
    const long long row0 = (long long)t * num_heads + kvh * GROUP;
#pragma unroll
    for (int g = 0; g < GROUP; ++g) {
#pragma unroll
        for (int e = 0; e < VEC; ++e) reduce_buf[tg][lane * VEC + e] = acc[g][e];
        __syncthreads();
        const float inv_sum = row_sum[g] > 0.0f ? 1.0f / row_sum[g] : 0.0f;
        for (int d = threadIdx.x; d < HEAD_DIM; d += THREADS) {
            float o = 0.0f;
#pragma unroll
            for (int i = 0; i < NTG; ++i) o += reduce_buf[i][d];
            if (num_splits == 1) {
                out[(row0 + g) * HEAD_DIM + d] = from_float<Q_T>(o * inv_sum);
            } else {
                o_part[((row0 + g) * num_splits + split) * HEAD_DIM + d] = o * inv_sum;
            }
        }
        if (num_splits > 1 && threadIdx.x == 0) {
            lse_part[(row0 + g) * num_splits + split] =
                row_sum[g] > 0.0f ? row_max[g] + log2f(row_sum[g]) : NEG_INF;
        }
        __syncthreads();  // reduce_buf is reused by the next head
    }
}

extern "C" __global__ void paged_attention_combine(const float* __restrict__ o_part,
                                                   const float* __restrict__ lse_part, Q_T* __restrict__ out,
                                                   int num_splits) {
    const long long row = blockIdx.x;
    const float* lse = lse_part + row * num_splits;
    float m = NEG_INF;
    for (int p = 0; p < num_splits; ++p) m = fmaxf(m, lse[p]);
    for (int d = threadIdx.x; d < HEAD_DIM; d += blockDim.x) {
        float num = 0.0f, den = 0.0f;
        if (m != NEG_INF) {
            for (int p = 0; p < num_splits; ++p) {
                const float w = exp2f(lse[p] - m);
                num += w * o_part[(row * num_splits + p) * HEAD_DIM + d];
                den += w;
            }
        }
        out[row * HEAD_DIM + d] = from_float<Q_T>(den > 0.0f ? num / den : 0.0f);
    }
}
