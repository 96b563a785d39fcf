// paged_attention: causal attention of query tokens against a paged KV cache, split-KV ("flash-decoding").
// Reference twin: ops/ref/paged_attention.py (paged_attention).
// Launchers: ops/cuda/paged_attention.py; tests: tests/ops/test_paged_attention.py.
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
// GQA:     one CTA serves the GROUP query heads of one kv head: each K/V byte is read once per query token.
// Shapes:  q (T, H, D) Q_T, heads and dims dense, token rows q_stride elements apart (a view of the fused
//          qkv); k_cache, v_cache (num_blocks, BS, K, D) DTYPE dense; block_tables (S, max_blocks) int32;
//          context_lens (S,) int32; cu_seqlens_q (S+1,) int32; out (T, H, D) Q_T;
//          o_part (T, H, num_splits, D) fp32 and lse_part (T, H, num_splits) fp32 (unused with one split).
// Launch:  paged_attention_split: grid (num_splits, K, T), THREADS threads, static shared memory only.
//          paged_attention_combine: grid (T * H,), 64 or 128 threads.
//          is_decode != 0 promises one query per sequence (T == S), which skips the search for t's sequence.
// Layout inside a CTA: a K or V row of D elements is read by TPT = D / VEC threads, one 16-byte vector each;
//          the CTA's NTG = THREADS / TPT token groups take UNROLL consecutive tokens each a round (K and V; a
//          run that starts at a multiple of UNROLL, so one block-table lookup serves it when UNROLL divides
//          BLOCK_SIZE: parts start at multiples of UNROLL), the next STAGES - 1 rounds in flight (cp.async)
//          while one is used, and keep an online softmax of their own (running max, sum, fp32 P @ V in
//          registers), with no barrier inside the loop; the groups merge through shared memory at the end.
// Macros:  DTYPE (cache type), Q_T (q/out type, default DTYPE), HEAD_DIM (default 128), GROUP (default 2),
//          CTAS_PER_SM (the launch bounds' CTAs per SM: default by GROUP, see there),
//          KV_HEADS (K, default 8) and BLOCK_SIZE (default 16): the cache's geometry at compile time, so a key's
//          address is shifts and multiplies by constants, not a division per key (it was a quarter of the
//          loop's instructions);
//          UNROLL (default 4) and STAGES (default 2, >= 1; 1 = no round in flight): their ring of
//          2 x STAGES x UNROLL x THREADS 16-byte slices must fit the 48 KB of static shared memory with the merge
//          buffers (STAGES x UNROLL <= 10 at head_dim 128).
#include "mma.cuh"
#include "sequences.cuh"

#ifndef Q_T
#define Q_T DTYPE
#endif
#ifndef HEAD_DIM
#define HEAD_DIM 128
#endif
#ifndef GROUP
#define GROUP 2
#endif
#ifndef KV_HEADS
#define KV_HEADS 8
#endif
#ifndef BLOCK_SIZE
#define BLOCK_SIZE 16
#endif

constexpr int THREADS = 128;
constexpr int TPT = HEAD_DIM / VEC;  // threads per K/V row
constexpr int NTG = THREADS / TPT;   // token groups of a CTA
constexpr int TOKEN_STRIDE = KV_HEADS * HEAD_DIM;        // cache elements from one token's rows to the next
constexpr int BLOCK_STRIDE = BLOCK_SIZE * TOKEN_STRIDE;  // and from one physical block to the next
#ifndef UNROLL
#define UNROLL 4  // tokens per token group and round (16-byte K and V loads per thread)
#endif
#ifndef STAGES
#define STAGES 2  // rounds in the cp.async shared-memory ring
#endif
static_assert(HEAD_DIM % VEC == 0 && TPT <= 32 && (TPT & (TPT - 1)) == 0, "unsupported HEAD_DIM for DTYPE");
static_assert(GROUP >= 1 && GROUP <= 16, "GROUP (query heads per kv head) must be 1..16");
static_assert(UNROLL >= 1 && STAGES >= 1, "UNROLL and STAGES must be at least 1");
// paged_attention_split's static shared memory: the K/V ring, then the token groups' merge buffers.
constexpr int RING_BYTES = 2 * STAGES * UNROLL * THREADS * (int)sizeof(uint4);
constexpr int MERGE_BYTES = (NTG * HEAD_DIM + 2 * NTG * GROUP) * (int)sizeof(float);
static_assert(RING_BYTES + MERGE_BYTES <= 48 * 1024,
              "the K/V ring (STAGES x UNROLL) and merge buffers exceed 48 KB of static shared memory");

// Two 16-bit elements of a 32-bit word to fp32. A bf16 is the high half of its fp32, so each takes one integer
// op (to_float takes two for the high one of a pair).
__device__ __forceinline__ void pair_to_float(unsigned w, float* out, __nv_bfloat16) {
    out[0] = __uint_as_float(w << 16);
    out[1] = __uint_as_float(w & 0xffff0000u);
}
__device__ __forceinline__ void pair_to_float(unsigned w, float* out, __half) {
    const float2 f = __half22float2(*reinterpret_cast<const __half2*>(&w));
    out[0] = f.x;
    out[1] = f.y;
}

template <typename T>  // scalar_t (a template, so that the branch not taken is not compiled)
__device__ __forceinline__ void vec_to_float(const uint4& raw, float* out) {
    if constexpr (sizeof(T) == 2) {
        const unsigned words[4] = {raw.x, raw.y, raw.z, raw.w};
#pragma unroll
        for (int i = 0; i < 4; ++i) pair_to_float(words[i], out + 2 * i, T{});
    } else {
        const T* e = reinterpret_cast<const T*>(&raw);
#pragma unroll
        for (int i = 0; i < VEC; ++i) out[i] = to_float(e[i]);
    }
}

// 2^x on the SFU alone: exp2f adds a fix-up for results below 2^-126, weights worth nothing next to the
// row maximum's 1 (2^-inf = 0 still starts a group's running sum).
__device__ __forceinline__ float fast_exp2(float x) {
    float y;
    asm("ex2.approx.ftz.f32 %0, %1;" : "=f"(y) : "f"(x));
    return y;
}

// Element offset of token j's (logical position in its sequence) row, at this thread's slice of its kv head.
// Unsigned: j / BLOCK_SIZE is then a shift, with no rounding fix for negative j.
__device__ __forceinline__ unsigned long long row_offset(const int* table, unsigned j, unsigned slice) {
    const unsigned phys = table[j / BLOCK_SIZE];
    return (unsigned long long)phys * BLOCK_STRIDE + ((j % BLOCK_SIZE) * TOKEN_STRIDE + slice);
}

// The offsets of tokens j0 .. j0 + UNROLL - 1 (j0 a multiple of UNROLL; tokens not `in` are past the
// sequence's end and get an offset inside the cache, never read): one lookup when the run cannot cross a block,
// else one per token.
__device__ __forceinline__ void run_offsets(const int* table, unsigned j0, unsigned slice, const bool (&in)[UNROLL],
                                            unsigned long long (&rows)[UNROLL]) {
    if constexpr (BLOCK_SIZE % UNROLL == 0) {
        const unsigned long long first = in[0] ? row_offset(table, j0, slice) : 0;
#pragma unroll
        for (int u = 0; u < UNROLL; ++u) rows[u] = first + u * TOKEN_STRIDE;  // same block: inside the cache
    } else {
#pragma unroll
        for (int u = 0; u < UNROLL; ++u) rows[u] = in[u] ? row_offset(table, j0 + u, slice) : 0;
    }
}

// One round of a token group's online softmax: the UNROLL tokens base + tg UNROLL + u (their K and V slices in
// k_raw, v_raw; tokens at or past `end` count as absent, unless FULL promises there are none) update the
// running max m, sum l and P @ V acc.
template <bool FULL>
__device__ __forceinline__ void attend_round(const uint4 (&k_raw)[UNROLL], const uint4 (&v_raw)[UNROLL], int base,
                                             int end, int tg, const float (&qf)[GROUP][VEC],
                                             float (&acc)[GROUP][VEC], float (&m)[GROUP], float (&l)[GROUP]) {
    float score[UNROLL][GROUP];
#pragma unroll
    for (int u = 0; u < UNROLL; ++u) {
        float kf[VEC];
        vec_to_float<scalar_t>(k_raw[u], kf);
#pragma unroll
        for (int g = 0; g < GROUP; ++g) {
            float dot = 0.0f;
#pragma unroll
            for (int e = 0; e < VEC; ++e) dot += qf[g][e] * kf[e];
#pragma unroll
            for (int o = TPT / 2; o > 0; o >>= 1) dot += __shfl_xor_sync(0xffffffffu, dot, o);
            score[u][g] = FULL || base + tg * UNROLL + u < end ? dot : NEG_INF;
        }
    }
#pragma unroll
    for (int g = 0; g < GROUP; ++g) {
        float m_new = m[g];
#pragma unroll
        for (int u = 0; u < UNROLL; ++u) m_new = fmaxf(m_new, score[u][g]);
        if (!FULL && m_new == NEG_INF) continue;  // no token of this group in this round (the tail)
        const float alpha = fast_exp2(m[g] - m_new);  // 0 on the group's first token: m = -inf
        l[g] *= alpha;
#pragma unroll
        for (int e = 0; e < VEC; ++e) acc[g][e] *= alpha;
        m[g] = m_new;
    }
#pragma unroll
    for (int u = 0; u < UNROLL; ++u) {
        float vf[VEC];
        vec_to_float<scalar_t>(v_raw[u], vf);
#pragma unroll
        for (int g = 0; g < GROUP; ++g) {
            const float p = !FULL && score[u][g] == NEG_INF ? 0.0f : fast_exp2(score[u][g] - m[g]);
            l[g] += p;
#pragma unroll
            for (int e = 0; e < VEC; ++e) acc[g][e] += p * vf[e];
        }
    }
}

// CTAs per SM the registers are budgeted for. 6 (80 registers, as many as the shared-memory ring allows) for
// GROUP <= 2: G2's 2,048 CTAs need them. A thread holds GROUP x 2 x VEC fp32 of q and P @ V: 4 query heads per
// kv head (Qwen3-4B and -8B, Llama 3 8B) take 128 registers (at 6 per SM they spilled 692 bytes a thread), 5-8
// take up to 251 (nvcc 13.0 -Xptxas -v, sm_90, bf16; test_compile.py checks that none spills).
#ifndef CTAS_PER_SM
#define CTAS_PER_SM (GROUP <= 2 ? 6 : GROUP <= 4 ? 4 : 2)
#endif
extern "C" __global__ void __launch_bounds__(THREADS, CTAS_PER_SM) paged_attention_split(
        const Q_T* __restrict__ q, const scalar_t* __restrict__ k_cache, const scalar_t* __restrict__ v_cache,
        const int* __restrict__ block_tables, const int* __restrict__ context_lens,
        const int* __restrict__ cu_seqlens_q, Q_T* __restrict__ out, float* __restrict__ o_part,
        float* __restrict__ lse_part, int num_seqs, int max_blocks, int num_splits, int is_decode,
        float scale_log2, long long q_stride) {
    __shared__ float reduce_buf[NTG][HEAD_DIM];
    __shared__ float group_max[NTG][GROUP], group_sum[NTG][GROUP];

    const int split = blockIdx.x, kvh = blockIdx.y, t = blockIdx.z;
    const int tg = threadIdx.x / TPT, lane = threadIdx.x % TPT;
    const int num_heads = KV_HEADS * GROUP;
    const int s = is_decode ? t : sequence_of(cu_seqlens_q, num_seqs, t);
    const int num_new = is_decode ? 1 : cu_seqlens_q[s + 1] - cu_seqlens_q[s];
    const int first_new = is_decode ? t : cu_seqlens_q[s];
    const int visible = context_lens[s] - num_new + (t - first_new) + 1;  // keys 0..pos
    // even parts, each starting at a multiple of UNROLL (run_offsets)
    const int start = (int)((long long)split * visible / num_splits) / UNROLL * UNROLL;
    const int end = split + 1 == num_splits ? visible
                                            : (int)((long long)(split + 1) * visible / num_splits) / UNROLL * UNROLL;
    const int* table = block_tables + (long long)s * max_blocks;

    float qf[GROUP][VEC], acc[GROUP][VEC], m[GROUP], l[GROUP];
#pragma unroll
    for (int g = 0; g < GROUP; ++g) {
        const Q_T* qp = q + t * q_stride + (kvh * GROUP + g) * HEAD_DIM + lane * VEC;
#pragma unroll
        for (int e = 0; e < VEC; ++e) {
            qf[g][e] = to_float(qp[e]) * scale_log2;
            acc[g][e] = 0.0f;
        }
        m[g] = NEG_INF;
        l[g] = 0.0f;
    }

    // Each token group walks its own tokens with its own running max m and sum l (online softmax); the loop
    // bounds are the same for the whole CTA (warps hold several token groups and shuffle with all 32 lanes).
    // The K and V rows of the round STAGES - 1 ahead are requested (cp.async into a shared-memory ring of STAGES
    // rounds) before the current round is used, so their latency hides behind the math of the rounds between.
    // Each thread reads back only the slices it copied itself: no barrier. The request of round i + STAGES - 1
    // reuses the slot round i - 1 was read from, in registers by then. (Measured on the H200 against loads one
    // round ahead in registers: 8-9% faster on G1 and G2, docs/LOG.md.)
    // A round wholly before `end` (all but a part's last) takes the mask-free path.
    constexpr int ROUND = NTG * UNROLL;
    const unsigned slice = kvh * HEAD_DIM + lane * VEC;
    __shared__ uint4 ring_k[STAGES][UNROLL][THREADS], ring_v[STAGES][UNROLL][THREADS];
    auto request = [&](int base, int slot) {
        const bool full = base + ROUND <= end;
        const int j0 = base + tg * UNROLL;
        bool in[UNROLL];
#pragma unroll
        for (int u = 0; u < UNROLL; ++u) in[u] = full || j0 + u < end;
        unsigned long long rows[UNROLL];
        run_offsets(table, j0, slice, in, rows);
#pragma unroll
        for (int u = 0; u < UNROLL; ++u) {
            cp_async16(&ring_k[slot][u][threadIdx.x], k_cache + rows[u], in[u] ? 16 : 0);  // zeros past end
            cp_async16(&ring_v[slot][u][threadIdx.x], v_cache + rows[u], in[u] ? 16 : 0);
        }
        cp_async_commit();
    };
#pragma unroll
    for (int i = 0; i < STAGES - 1; ++i) request(start + i * ROUND, i);
    int slot = 0;
    for (int base = start; base < end; base += ROUND) {
        request(base + (STAGES - 1) * ROUND, (slot + STAGES - 1) % STAGES);
        cp_async_wait<STAGES - 1>();  // of the STAGES groups in flight, the oldest (this round's) has landed
        uint4 k_raw[UNROLL], v_raw[UNROLL];
#pragma unroll
        for (int u = 0; u < UNROLL; ++u) {
            k_raw[u] = ring_k[slot][u][threadIdx.x];
            v_raw[u] = ring_v[slot][u][threadIdx.x];
        }
        if (base + ROUND <= end) {
            attend_round<true>(k_raw, v_raw, base, end, tg, qf, acc, m, l);
        } else {
            attend_round<false>(k_raw, v_raw, base, end, tg, qf, acc, m, l);
        }
        slot = (slot + 1) % STAGES;
    }
    cp_async_wait<0>();  // the requests past end (zero fills) land before the CTA exits

    // Merge the token groups: rescale each to the CTA-wide max, sum, and write o (or this split's part).
    if (lane == 0) {
#pragma unroll
        for (int g = 0; g < GROUP; ++g) {
            group_max[tg][g] = m[g];
            group_sum[tg][g] = l[g];
        }
    }
    __syncthreads();
    const long long row0 = (long long)t * num_heads + kvh * GROUP;
#pragma unroll
    for (int g = 0; g < GROUP; ++g) {
        float m_all = NEG_INF, l_all = 0.0f;
#pragma unroll
        for (int i = 0; i < NTG; ++i) m_all = fmaxf(m_all, group_max[i][g]);
#pragma unroll
        for (int i = 0; i < NTG; ++i)
            l_all += m_all == NEG_INF ? 0.0f : group_sum[i][g] * exp2f(group_max[i][g] - m_all);
        const float own = m[g] == NEG_INF ? 0.0f : exp2f(m[g] - m_all);
#pragma unroll
        for (int e = 0; e < VEC; ++e) reduce_buf[tg][lane * VEC + e] = acc[g][e] * own;
        __syncthreads();
        const float inv_sum = l_all > 0.0f ? 1.0f / l_all : 0.0f;
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
        if (num_splits > 1 && threadIdx.x == 0)
            lse_part[(row0 + g) * num_splits + split] = l_all > 0.0f ? m_all + log2f(l_all) : NEG_INF;
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
