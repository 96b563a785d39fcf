// FlashAttention-2 for packed causal variable-length sequences with grouped-query heads (bf16/fp16 only).
// Reference twin: ops/ref/attention.py (attention, attention_backward).
// Launchers: ops/cuda/attention.py; tests: tests/ops/test_attention.py.
// Also the paged-cache kernels paged_attention_invariant and paged_attention_invariant_warps (single new tokens)
// and paged_prefill_attention (several per sequence), launched from ops/cuda/paged_attention.py: they run this
// file's forward tile code, so a query row's arithmetic is the same as in training.
// Dtypes: __nv_bfloat16 __half
//
// Math:    per sequence, head h (kv head h / (H / K)): S = Q K^T * scale, causal; P = softmax(S);  O = P V;
//          lse = log sum exp(S) per row (natural log).  Backward (FA2): with delta = rowsum(dO * O),
//          P = exp(S - lse); dV = P^T dO; dP = dO V^T; dS = P * (dP - delta); dQ = dS K * scale; dK = dS^T Q * scale.
// Shapes:  q (T, H, D), k and v (T, K, D): rows (tokens) may be strided (views of a fused qkv; stride a multiple
//          of 8 elements), heads and dims dense; o, dout (T, H, D) dense; lse, delta (H, T) fp32;
//          dq_accum (T, H, D) fp32, zeroed by the caller, filled with atomicAdd; dk, dv (T, K, D), heads and
//          dims dense, token rows dkv_stride elements apart (views of the fused dqkv).
//          cu_seqlens (S + 1,) int32. D = HEAD_DIM (64 or 128, compile-time).
// Launch:  forward: FWD_WARPS warps, each owns 16 FWD_MT query rows (FWD_BM = 16 FWD_MT FWD_WARPS per block); grid (tiles, H)
//          with tiles >= sum_s ceil(L_s / FWD_BM) (the launcher uses ceil(T / FWD_BM) + S); block b finds its
//          (sequence, q tile) by walking cu_seqlens; K/V tiles of FWD_BN_KEYS keys double-buffered in shared memory by
//          cp.async; online softmax in base 2.
//          backward: BWD_WARPS warps, each owns 16 keys; grid (key tiles, K) likewise; the block loops
//          over the group's query heads and over the 32-query tiles that can see its keys, keeping dK, dV in
//          registers (no atomics) and adding dQ with fp32 atomics; the next tile's Q, dO, lse and delta load
//          (cp.async, two stages) while the current one is used. Dynamic shared memory (> 48 KiB).
// Accumulation: all products in fp32 (mma.sync m16n8k16), P and dS rounded to DTYPE as mma operands.
#include "mma.cuh"

#ifndef HEAD_DIM
#define HEAD_DIM 128
#endif
constexpr int D = HEAD_DIM;
constexpr int LD = D + 8;  // shared-memory row pitch in elements: 16 bytes of padding keeps ldmatrix conflict-free
#ifndef FWD_WARPS
#define FWD_WARPS 4
#endif
#ifndef FWD_MT
#define FWD_MT 1
#endif
#ifndef FWD_BN_KEYS
#define FWD_BN_KEYS 64
#endif
#ifndef BWD_WARPS
#define BWD_WARPS 4
#endif
constexpr int FWD_THREADS = 32 * FWD_WARPS, BWD_THREADS = 32 * BWD_WARPS;
constexpr int MT = FWD_MT;                                // forward: m16 row tiles per warp
constexpr int FWD_BM = 16 * MT * FWD_WARPS, FWD_BN = FWD_BN_KEYS;  // forward: query rows, keys per tile
// A warp's 16 MT rows then fall in one key tile, and a row walks exactly the tiles 0..(its position / FWD_BN), as
// the decode kernel (paged_attention_invariant) does: the same arithmetic for it in both.
static_assert(FWD_BN % (16 * MT) == 0, "FWD_BN_KEYS must be a multiple of 16 FWD_MT");
constexpr int BWD_BN = 16 * BWD_WARPS, BWD_BM = 32;  // backward: keys per block (16 per warp), queries per step
constexpr int DQ_COLS = D / (BWD_WARPS / 2);         // dQ columns per warp (warps split 2 x BWD_WARPS / 2)
constexpr int LDS = BWD_BM + 8;          // pitch of the dS^T tile
constexpr float LOG2E = 1.4426950408889634f;
constexpr float LN2 = 0.6931471805599453f;

// Block -> (sequence start, length, tile index) for tiles of `tile` rows; false when past the last tile.
__device__ __forceinline__ bool find_tile(const int* cu_seqlens, int num_seqs, int tile, int block, int& start,
                                          int& len, int& index) {
    int seen = 0;
    for (int s = 0; s < num_seqs; ++s) {
        start = cu_seqlens[s];
        len = cu_seqlens[s + 1] - start;
        const int n = (len + tile - 1) / tile;
        if (block < seen + n) {
            index = block - seen;
            return true;
        }
        seen += n;
    }
    return false;
}

constexpr int ROW = LD * sizeof(scalar_t);  // bytes per shared-memory tile row
constexpr int EL = sizeof(scalar_t);        // bytes per element

// 2^x in one MUFU instruction (flushes denormals; ex2(-inf) = 0, which masking relies on).
__device__ __forceinline__ float fast_exp2(float x) {
    float y;
    asm("ex2.approx.ftz.f32 %0, %1;\n" : "=f"(y) : "f"(x));
    return y;
}

// dst[0..4) += v, one vector reduction on sm_90 (16-byte aligned dst).
__device__ __forceinline__ void atomic_add4(float* dst, float4 v) {
#if __CUDA_ARCH__ >= 900
    asm volatile("red.global.add.v4.f32 [%0], {%1, %2, %3, %4};\n" ::"l"(dst), "f"(v.x), "f"(v.y), "f"(v.z), "f"(v.w)
                 : "memory");
#else
    atomicAdd(dst, v.x);
    atomicAdd(dst + 1, v.y);
    atomicAdd(dst + 2, v.z);
    atomicAdd(dst + 3, v.w);
#endif
}

// ROWS x D tile of rows row0.. (sequence-local) of a strided matrix into shared memory; rows < 0 or >= len are
// zeros (a paged prefill's tile starts before its first new token).
template <int ROWS, int NTHREADS>
__device__ __forceinline__ void load_tile(scalar_t* dst, const scalar_t* base, long long stride, int row0, int len) {
    constexpr int CHUNKS = D / 8;  // 16-byte chunks per row
    for (int c = threadIdx.x; c < ROWS * CHUNKS; c += NTHREADS) {
        const int r = c / CHUNKS, col = (c % CHUNKS) * 8;
        const bool valid = row0 + r >= 0 && row0 + r < len;
        cp_async16(dst + r * LD + col, base + (valid ? (long long)(row0 + r) * stride : 0) + col, valid ? 16 : 0);
    }
}

// A row's softmax denominator: the four partial sums of its quad (every lane of the warp must call this).
__device__ __forceinline__ float quad_total(float partial) {
    partial += __shfl_xor_sync(0xffffffffu, partial, 1);
    partial += __shfl_xor_sync(0xffffffffu, partial, 2);
    return partial;
}

// This thread's columns of output row r (0: the rows g, 1: the rows g + 8) of an m16 tile: acc / sum, rounded.
// NT: the column tiles of 8 in acc, from orow's column on (a warp of the invariant decode holds a part of D).
template <int NT = D / 8>
__device__ __forceinline__ void store_row(scalar_t* orow, const float (&acc)[NT][4], int r, int t, float sum) {
    const float inv = sum > 0.0f ? 1.0f / sum : 0.0f;
#pragma unroll
    for (int nt = 0; nt < NT; ++nt)
        *reinterpret_cast<unsigned*>(orow + nt * 8 + 2 * t) =
            pack2(acc[nt][2 * r] * inv, acc[nt][2 * r + 1] * inv, scalar_t());
}

// One K/V tile of the forward's online softmax for a warp's MT m16 row tiles, in two steps. score_tile: S = Q K^T in
// fp32, the causal mask (key > the row's position, or past len) when `masked`, the running max and sum and acc
// rescaled, and s = P (unnormalised probabilities). accumulate_pv: acc += P V with P rounded to scalar_t. Row
// sums stay per-thread partials (summed over the quad at the end). The training forward and the batch-invariant
// decode kernel both run this code, so a query row goes through the same operations in the same order in both.
// q_regs: Q's A fragments when MT = 1; else read at q_base. k_tile, v_tile: the tile's K and V in shared memory
// (FWD_BN rows of pitch LD). score_tile is tile_scores then softmax_tile; the invariant decode's warps share a
// tile between them: each computes the scores of PB of its 16-key parts (k_tile at the first) and the P V of DP
// of its 16-column parts (v_tile at the first column, acc those columns), and all run softmax_tile on the whole
// tile's scores. Every score and every acc element goes through the same operations in the same order either way.
template <int MT, int PB = FWD_BN / 16>
__device__ __forceinline__ void tile_scores(float (&s)[MT][FWD_BN / 8][4],
                                            const unsigned (&q_regs)[MT == 1 ? D / 16 : 1][4], unsigned q_base,
                                            unsigned k_tile, int lane) {
    const unsigned k_base = k_tile + lane_offset_b(lane, LD);
#pragma unroll
    for (int m = 0; m < MT; ++m)
#pragma unroll
        for (int i = 0; i < 2 * PB; ++i) s[m][i][0] = s[m][i][1] = s[m][i][2] = s[m][i][3] = 0.0f;
#pragma unroll
    for (int kk = 0; kk < D / 16; ++kk) {
        unsigned qf[MT][4];
        if constexpr (MT == 1) {  // registers allow: Q's fragments were loaded once, at the first tile
#pragma unroll
            for (int i = 0; i < 4; ++i) qf[0][i] = q_regs[kk][i];
        } else {
#pragma unroll
            for (int m = 0; m < MT; ++m)
                ldsm_x4(qf[m], q_base + 16 * m * ROW + kk * 16 * EL);
        }
#pragma unroll
        for (int p = 0; p < PB; ++p) {
            unsigned b[4];
            ldsm_x4(b, k_base + p * 16 * ROW + kk * 16 * EL);
#pragma unroll
            for (int m = 0; m < MT; ++m) {
                mma(s[m][2 * p], qf[m], b, scalar_t());
                mma(s[m][2 * p + 1], qf[m], b + 2, scalar_t());
            }
        }
    }
}

template <int MT, int NT = D / 8>
__device__ __forceinline__ void softmax_tile(float (&s)[MT][FWD_BN / 8][4], float (&acc)[MT][NT][4],
                                             float (&row_max)[MT][2], float (&row_sum)[MT][2], int lane, int kv0,
                                             bool masked, const int (&row_pos)[MT][2], int len, float scale_log2) {
    const int t = lane & 3;
#pragma unroll
    for (int m = 0; m < MT; ++m) {
        float tile_max[2] = {NEG_INF, NEG_INF};
#pragma unroll
        for (int nt = 0; nt < FWD_BN / 8; ++nt) {
#pragma unroll
            for (int e = 0; e < 4; ++e) {
                float x = s[m][nt][e];  // raw score: scale > 0, so maxima commute with scaling
                if (masked) {
                    const int key = kv0 + nt * 8 + 2 * t + (e & 1);
                    if (key > row_pos[m][e >> 1] || key >= len) x = NEG_INF;
                }
                s[m][nt][e] = x;
                tile_max[e >> 1] = fmaxf(tile_max[e >> 1], x);
            }
        }
        float rescale[2];
#pragma unroll
        for (int r = 0; r < 2; ++r) {
            tile_max[r] = fmaxf(tile_max[r], __shfl_xor_sync(0xffffffffu, tile_max[r], 1));
            tile_max[r] = fmaxf(tile_max[r], __shfl_xor_sync(0xffffffffu, tile_max[r], 2));
            const float m_new = fmaxf(row_max[m][r], tile_max[r]);
            const float m_use = m_new == NEG_INF ? 0.0f : m_new * scale_log2;  // in base-2 exponent units
            rescale[r] = fast_exp2(row_max[m][r] * scale_log2 - m_use);
            row_max[m][r] = m_new;
            row_sum[m][r] *= rescale[r];
            tile_max[r] = m_use;
        }
#pragma unroll
        for (int nt = 0; nt < FWD_BN / 8; ++nt) {
#pragma unroll
            for (int e = 0; e < 4; ++e) {
                s[m][nt][e] = fast_exp2(fmaf(s[m][nt][e], scale_log2, -tile_max[e >> 1]));
                row_sum[m][e >> 1] += s[m][nt][e];
            }
        }
#pragma unroll
        for (int i = 0; i < NT; ++i) {
            acc[m][i][0] *= rescale[0];
            acc[m][i][1] *= rescale[0];
            acc[m][i][2] *= rescale[1];
            acc[m][i][3] *= rescale[1];
        }
    }
}

template <int MT>
__device__ __forceinline__ void score_tile(float (&s)[MT][FWD_BN / 8][4], float (&acc)[MT][D / 8][4],
                                           float (&row_max)[MT][2], float (&row_sum)[MT][2],
                                           const unsigned (&q_regs)[MT == 1 ? D / 16 : 1][4], unsigned q_base,
                                           unsigned k_tile, int lane, int kv0, bool masked,
                                           const int (&row_pos)[MT][2], int len, float scale_log2) {
    tile_scores<MT>(s, q_regs, q_base, k_tile, lane);
    softmax_tile<MT>(s, acc, row_max, row_sum, lane, kv0, masked, row_pos, len, scale_log2);
}

template <int MT, int DP = D / 16>
__device__ __forceinline__ void accumulate_pv(float (&acc)[MT][2 * DP][4], const float (&s)[MT][FWD_BN / 8][4],
                                              unsigned v_tile, int lane) {
    const unsigned v_base = v_tile + lane_offset_a(lane, LD);
#pragma unroll
    for (int kk = 0; kk < FWD_BN / 16; ++kk) {
        unsigned a[MT][4];
#pragma unroll
        for (int m = 0; m < MT; ++m) {
            a[m][0] = pack2(s[m][2 * kk][0], s[m][2 * kk][1], scalar_t());
            a[m][1] = pack2(s[m][2 * kk][2], s[m][2 * kk][3], scalar_t());
            a[m][2] = pack2(s[m][2 * kk + 1][0], s[m][2 * kk + 1][1], scalar_t());
            a[m][3] = pack2(s[m][2 * kk + 1][2], s[m][2 * kk + 1][3], scalar_t());
        }
#pragma unroll
        for (int dp = 0; dp < DP; ++dp) {
            unsigned b[4];
            ldsm_x4_trans(b, v_base + kk * 16 * ROW + dp * 16 * EL);
#pragma unroll
            for (int m = 0; m < MT; ++m) {
                mma(acc[m][2 * dp], a[m], b, scalar_t());
                mma(acc[m][2 * dp + 1], a[m], b + 2, scalar_t());
            }
        }
    }
}

template <int MT>
__device__ __forceinline__ void attend_tile(float (&acc)[MT][D / 8][4], float (&row_max)[MT][2],
                                            float (&row_sum)[MT][2], const unsigned (&q_regs)[MT == 1 ? D / 16 : 1][4],
                                            unsigned q_base, unsigned k_tile, unsigned v_tile, int lane, int kv0,
                                            bool masked, const int (&row_pos)[MT][2], int len, float scale_log2) {
    float s[MT][FWD_BN / 8][4];
    score_tile<MT>(s, acc, row_max, row_sum, q_regs, q_base, k_tile, lane, kv0, masked, row_pos, len, scale_log2);
    accumulate_pv<MT>(acc, s, v_tile, lane);
}

// Where a forward block's K and V tiles come from: the packed sequence's rows (training), or its cache slots.
// load: the FWD_BN keys from key0 into shared memory (rows of pitch LD), zeros for keys >= len.
struct PackedKeys {
    const scalar_t* k;  // the sequence's first key row, at its kv head
    const scalar_t* v;
    long long k_stride, v_stride;
    __device__ __forceinline__ void load(scalar_t* sk, scalar_t* sv, int key0, int len) const {
        load_tile<FWD_BN, FWD_THREADS>(sk, k, k_stride, key0, len);
        load_tile<FWD_BN, FWD_THREADS>(sv, v, v_stride, key0, len);
    }
};

struct PagedKeys {
    const scalar_t* k_cache;  // (num_blocks, block_size, K, D), at the kv head
    const scalar_t* v_cache;
    const int* table;  // the sequence's block table row
    int block_size, num_kv_heads;
    template <int NTHREADS = FWD_THREADS>  // the block's threads, which share the copy
    __device__ __forceinline__ void load(scalar_t* sk, scalar_t* sv, int key0, int len) const {
        constexpr int CHUNKS = D / 8;  // 16-byte chunks per row
        for (int c = threadIdx.x; c < FWD_BN * CHUNKS; c += NTHREADS) {
            const int r = c / CHUNKS, col = (c % CHUNKS) * 8, key = key0 + r;
            const bool valid = key < len;
            const long long slot = valid ? (long long)table[key / block_size] * block_size + key % block_size : 0;
            const long long offset = slot * num_kv_heads * D + col;
            cp_async16(sk + r * LD + col, k_cache + offset, valid ? 16 : 0);
            cp_async16(sv + r * LD + col, v_cache + offset, valid ? 16 : 0);
        }
    }
};

// The forward of one block of query rows, positions q0 .. q0 + FWD_BM of one sequence and head, against the
// sequence's keys 0 .. len. Only positions first .. len are queries here (the new tokens; first = 0 in
// training, the cached prefix's length against a paged cache): q and o point at position first's row, rows
// before first load as zeros and are not stored. lse (at position first; nullptr for none) gets each row's
// log-sum-exp. K/V tiles of FWD_BN keys double-buffered in shared memory by cp.async; online softmax in base 2.
// A warp's rows start at a multiple of 16 MT in position, in training (blocks at multiples of FWD_BM) as against the
// cache (find_prefill_block), so a row meets the same key tiles in both. Not only the same keys: a key tile wholly
// past a row is no exact no-op for it, since the rescale exp2(m c - m_use) with m_use = m c compiles to
// exp2(fma(m, c, -m_use)), the product's rounding error, not 1 (docs/LOG.md).
template <class Keys>
__device__ __forceinline__ void forward_block(scalar_t* __restrict__ o, float* __restrict__ lse,
                                              const scalar_t* __restrict__ qb, long long q_stride, int first, int q0,
                                              int len, const Keys& keys, int num_heads, float scale_log2) {
    extern __shared__ __align__(16) unsigned char smem[];
    scalar_t* sQ = reinterpret_cast<scalar_t*>(smem);
    scalar_t* sK = sQ + FWD_BM * LD;      // 2 stages
    scalar_t* sV = sK + 2 * FWD_BN * LD;  // 2 stages
    const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31, g = lane >> 2, t = lane & 3;
    const int num_tiles = (min(len, q0 + FWD_BM) + FWD_BN - 1) / FWD_BN;

    load_tile<FWD_BM, FWD_THREADS>(sQ, qb, q_stride, q0 - first, len - first);
    keys.load(sK, sV, 0, len);
    cp_async_commit();

    // Warp w owns query rows w * 16 MT .. + 16 MT of the tile (MT m16 tiles): every K/V fragment read from
    // shared memory feeds MT x 2 mma. Thread rows: row_a + 16 m and + 8 (m < MT). With MT = 1 the Q fragments
    // stay in registers; with MT = 2 there is no room, and they are re-read from shared memory per tile.
    float acc[MT][D / 8][4];
    float row_max[MT][2], row_sum[MT][2];
#pragma unroll
    for (int m = 0; m < MT; ++m) {
#pragma unroll
        for (int i = 0; i < D / 8; ++i) acc[m][i][0] = acc[m][i][1] = acc[m][i][2] = acc[m][i][3] = 0.0f;
        row_max[m][0] = row_max[m][1] = NEG_INF;
        row_sum[m][0] = row_sum[m][1] = 0.0f;
    }
    const int wrow = warp * 16 * MT;  // first tile row of this warp
    unsigned q_regs[MT == 1 ? D / 16 : 1][4];  // MT = 1: Q's A fragments, held for the whole loop
    const unsigned q_base = smem_addr(sQ + wrow * LD) + lane_offset_a(lane, LD);
    const int row_a = q0 + wrow + g;
    // a warp whose rows are all before the first row kept or at or past len attends nothing: its rows are never
    // stored, and the other warps' rows do not depend on it (the K/V tiles are loaded by every thread regardless)
    const bool warp_stores = q0 + wrow + 16 * MT > first && q0 + wrow < len;

    for (int j = 0; j < num_tiles; ++j) {
        const int stage = j & 1;
        if (j + 1 < num_tiles) keys.load(sK + (stage ^ 1) * FWD_BN * LD, sV + (stage ^ 1) * FWD_BN * LD,
                                         (j + 1) * FWD_BN, len);
        cp_async_commit();
        cp_async_wait<1>();
        __syncthreads();
        if (MT == 1 && j == 0) {
#pragma unroll
            for (int kk = 0; kk < D / 16; ++kk)
                ldsm_x4(q_regs[kk], q_base + kk * 16 * EL);
        }
        const int kv0 = j * FWD_BN;
        int row_pos[MT][2];  // each thread's two rows per m16 tile, positions in the sequence
#pragma unroll
        for (int m = 0; m < MT; ++m) row_pos[m][0] = row_a + 16 * m, row_pos[m][1] = row_a + 16 * m + 8;
        if (warp_stores && kv0 < q0 + wrow + 16 * MT)  // else no row of the warp is stored, or every key of the
                                                       // tile is past the warp's rows: nothing to add
            attend_tile<MT>(acc, row_max, row_sum, q_regs, q_base, smem_addr(sK + stage * FWD_BN * LD),
                            smem_addr(sV + stage * FWD_BN * LD), lane, kv0,
                            kv0 + FWD_BN - 1 > q0 + wrow || kv0 + FWD_BN > len, row_pos, len, scale_log2);
        __syncthreads();  // this stage is refilled by the next iteration's prefetch
    }

#pragma unroll
    for (int m = 0; m < MT; ++m) {
#pragma unroll
        for (int r = 0; r < 2; ++r) {
            const float sum = quad_total(row_sum[m][r]);
            const int row = row_a + 16 * m + 8 * r;
            if (row < first || row >= len) continue;
            store_row(o + (long long)(row - first) * num_heads * D, acc[m], r, t, sum);
            if (lse != nullptr && t == 0) lse[row - first] = (row_max[m][r] * scale_log2 + log2f(sum)) * LN2;
        }
    }
}

extern "C" __global__ void __launch_bounds__(FWD_THREADS) flash_attention_forward(
    scalar_t* __restrict__ o, float* __restrict__ lse, const scalar_t* __restrict__ q,
    const scalar_t* __restrict__ k, const scalar_t* __restrict__ v, const int* __restrict__ cu_seqlens,
    int num_seqs, int num_heads, int num_kv_heads, long long q_stride, long long k_stride, long long v_stride,
    int tokens, float scale_log2) {
    int start, len, tile;
    if (!find_tile(cu_seqlens, num_seqs, FWD_BM, blockIdx.x, start, len, tile)) return;
    tile = (len + FWD_BM - 1) / FWD_BM - 1 - tile;  // the longest rows of each sequence start first
    const int h = blockIdx.y, kvh = h / (num_heads / num_kv_heads);
    const PackedKeys keys{k + (long long)start * k_stride + kvh * D, v + (long long)start * v_stride + kvh * D,
                          k_stride, v_stride};
    forward_block(o + ((long long)start * num_heads + h) * D, lse + (long long)h * tokens + start,
                  q + (long long)start * q_stride + h * D, q_stride, 0, tile * FWD_BM, len, keys, num_heads,
                  scale_log2);
}

// Block -> (sequence, first query row) of paged_prefill_attention: blocks of FWD_BM rows from the sequence's first
// new token rounded down to a warp's 16 MT rows, for sequences with more than one new token (single tokens are
// paged_attention_invariant's); false past the last. A warp's rows are then a warp's rows in training's tiles (FWD_BM
// is a multiple of 16 MT), so each row walks training's key tiles with training's masks, while a turn of a few
// dozen tokens mid-tile takes one block, not two.
__device__ __forceinline__ bool find_prefill_block(const int* cu_seqlens_q, const int* context_lens, int num_seqs,
                                                   int block, int& seq, int& q0) {
    int seen = 0;
    for (seq = 0; seq < num_seqs; ++seq) {
        const int num_new = cu_seqlens_q[seq + 1] - cu_seqlens_q[seq];
        if (num_new < 2) continue;
        const int len = context_lens[seq], row0 = (len - num_new) / (16 * MT) * (16 * MT);
        const int n = (len - row0 + FWD_BM - 1) / FWD_BM;
        if (block < seen + n) {
            q0 = row0 + (n - 1 - (block - seen)) * FWD_BM;  // the longest rows of each sequence start first
            return true;
        }
        seen += n;
    }
    return false;
}

// Prefill against a paged KV cache (chunked prefill, prefix-cache hits, continued conversations): the new tokens
// of each sequence with more than one, as training's tiled forward computes them, keys read from the cache's
// slots once per tile of FWD_BM queries. Rows are bitwise the rows flash_attention_forward gives the same tokens
// in their whole sequence (same tiles, same code). Grid (tiles, H) with tiles >= the sequences' tile count
// (the launcher uses ceil(T / FWD_BM) + 2 S); FWD_THREADS threads; the forward's dynamic shared memory.
// q (T, H, D) with token rows q_stride apart; caches (num_blocks, block_size, K, D); out (T, H, D) dense.
extern "C" __global__ void __launch_bounds__(FWD_THREADS) paged_prefill_attention(
    scalar_t* __restrict__ out, const scalar_t* __restrict__ q, const scalar_t* __restrict__ k_cache,
    const scalar_t* __restrict__ v_cache, const int* __restrict__ block_tables, const int* __restrict__ context_lens,
    const int* __restrict__ cu_seqlens_q, int num_seqs, int num_heads, int num_kv_heads, int block_size,
    int max_blocks, long long q_stride, float scale_log2) {
    int s, q0;
    if (!find_prefill_block(cu_seqlens_q, context_lens, num_seqs, blockIdx.x, s, q0)) return;
    const int h = blockIdx.y, kvh = h / (num_heads / num_kv_heads);
    const int start = cu_seqlens_q[s], len = context_lens[s], first = len - (cu_seqlens_q[s + 1] - start);
    const PagedKeys keys{k_cache + kvh * D, v_cache + kvh * D, block_tables + (long long)s * max_blocks, block_size,
                         num_kv_heads};
    forward_block(out + ((long long)start * num_heads + h) * D, static_cast<float*>(nullptr),
                  q + (long long)start * q_stride + h * D, q_stride, first, q0, len, keys, num_heads, scale_log2);
}

constexpr int ROWS_PER_LANE = FWD_BN / 32;  // paged tiles: rows lane, lane + 32, ... of a tile per lane
static_assert(FWD_BN % 32 == 0, "FWD_BN_KEYS must be a multiple of 32 (whole tile rows per lane)");

// This lane's rows' cache slots (physical block table[key / block_size], row key % block_size) for the FWD_BN keys
// from key0; -1 for keys >= len. Plain loads: they stay in flight until copy_paged_tile first uses them.
__device__ __forceinline__ void read_slots(int (&slot)[ROWS_PER_LANE], const int* table, int key0, int len,
                                           int block_size, int lane) {
#pragma unroll
    for (int h = 0; h < ROWS_PER_LANE; ++h) {
        const int key = key0 + lane + 32 * h;
        slot[h] = key < len ? table[key / block_size] * block_size + key % block_size : -1;
    }
}

// One tile (K or V) of one kv head of the paged cache into shared memory (FWD_BN rows of pitch LD), its rows' slots
// passed around the warp by shuffles; zeros for slots < 0.
__device__ __forceinline__ void copy_paged_tile(scalar_t* dst, const scalar_t* cache, const int (&slot)[ROWS_PER_LANE],
                                                int num_kv_heads, int kvh, int lane) {
    constexpr int CHUNKS = D / 8;  // 16-byte chunks per row
#pragma unroll
    for (int c = lane; c < FWD_BN * CHUNKS; c += 32) {
        const int r = c / CHUNKS, col = (c % CHUNKS) * 8;
        int row_slot = -1;
#pragma unroll
        for (int h = 0; h < ROWS_PER_LANE; ++h) {
            const int from = __shfl_sync(0xffffffffu, slot[h], r & 31);
            if (r >> 5 == h) row_slot = from;
        }
        const long long offset = row_slot < 0 ? 0 : ((long long)row_slot * num_kv_heads + kvh) * D + col;
        cp_async16(dst + r * LD + col, cache + offset, row_slot < 0 ? 0 : 16);
    }
}

// Batch-invariant attention of query tokens against a paged KV cache: token t's output is bitwise the one
// flash_attention_forward gives the same query in its packed sequence, whatever the other tokens of the batch.
// One warp per (query token, kv head). The group's query heads are rows 0.. of an m16 tile (mma rows are
// independent); the keys go through score_tile and accumulate_pv in FWD_BN tiles from position 0, as the
// forward's rows do, so every row sees the same operations in the same order. The keys are not split across
// CTAs: merging parts would sum in another order. Grid (K, S): one CTA row per sequence; those with more than
// one new token (unless is_decode: one each) are left to paged_prefill_attention, which tiles their queries.
// Pipeline: K and V tiles take turns in a ring of three shared-memory tiles (K_j, V_j, K_j+1, V_j+1, ...): V_j+1
// is copied into K_j's place once the scores are done, K_j+2 into V_j's once P V is, so two tiles are in flight
// while one is used, and four CTAs fit on an SM (one wave for G1's 64 sequences x 8 kv heads on 132 SMs). Each
// tile's cache slots are read a tile ahead of their copy.
// q (T, H, D) with token rows q_stride apart; caches (num_blocks, block_size, K, D); out (T, H, D) dense.
extern "C" __global__ void __launch_bounds__(32) paged_attention_invariant(
    scalar_t* __restrict__ out, const scalar_t* __restrict__ q, const scalar_t* __restrict__ k_cache,
    const scalar_t* __restrict__ v_cache, const int* __restrict__ block_tables, const int* __restrict__ context_lens,
    const int* __restrict__ cu_seqlens_q, int num_heads, int num_kv_heads, int block_size, int max_blocks,
    int is_decode, long long q_stride, float scale_log2) {
    extern __shared__ __align__(16) unsigned char smem[];
    constexpr int TILE = FWD_BN * LD;  // elements of one K or V tile in shared memory
    scalar_t* sQ = reinterpret_cast<scalar_t*>(smem);
    scalar_t* ring = sQ + 16 * LD;  // three tiles; the i-th tile copied (K_j: i = 2j, V_j: i = 2j + 1) in i % 3
    const int kvh = blockIdx.x, s = blockIdx.y, lane = threadIdx.x, g = lane >> 2;
    const int group = num_heads / num_kv_heads;
    const int t = is_decode ? s : cu_seqlens_q[s];  // the sequence's new token
    if (!is_decode && cu_seqlens_q[s + 1] - t != 1) return;
    const int pos = context_lens[s] - 1;  // the token's position in its sequence
    const int len = pos + 1;                                       // keys it sees
    const int num_tiles = (len + FWD_BN - 1) / FWD_BN;
    const int* table = block_tables + (long long)s * max_blocks;
    auto slot_of = [&](int i) { return ring + (i % 3) * TILE; };

    // prologue: groups (Q, K_0), (V_0), (K_1) committed; slots of tiles 1 and 2 in registers
    int cur[ROWS_PER_LANE], nxt[ROWS_PER_LANE];
    read_slots(cur, table, 0, len, block_size, lane);
    const scalar_t* qt = q + (long long)t * q_stride + (long long)kvh * group * D;
    for (int c = lane; c < 16 * (D / 8); c += 32) {  // rows past the group are zeros
        const int r = c / (D / 8), col = (c % (D / 8)) * 8;
        cp_async16(sQ + r * LD + col, qt + (r < group ? r * D : 0) + col, r < group ? 16 : 0);
    }
    copy_paged_tile(slot_of(0), k_cache, cur, num_kv_heads, kvh, lane);
    cp_async_commit();
    copy_paged_tile(slot_of(1), v_cache, cur, num_kv_heads, kvh, lane);
    cp_async_commit();
    read_slots(cur, table, FWD_BN, len, block_size, lane);
    if (num_tiles > 1) copy_paged_tile(slot_of(2), k_cache, cur, num_kv_heads, kvh, lane);
    cp_async_commit();
    read_slots(nxt, table, 2 * FWD_BN, len, block_size, lane);

    float acc[1][D / 8][4], s_tile[1][FWD_BN / 8][4];
    float row_max[1][2] = {{NEG_INF, NEG_INF}}, row_sum[1][2] = {{0.0f, 0.0f}};
#pragma unroll
    for (int i = 0; i < D / 8; ++i) acc[0][i][0] = acc[0][i][1] = acc[0][i][2] = acc[0][i][3] = 0.0f;
    const int row_pos[1][2] = {{pos, pos}};
    unsigned q_regs[D / 16][4];
    const unsigned q_base = smem_addr(sQ) + lane_offset_a(lane, LD);
    for (int j = 0; j < num_tiles; ++j) {
        cp_async_wait<2>();  // K_j landed (V_j and K_j+1 may be in flight)
        __syncwarp();
        if (j == 0) {
#pragma unroll
            for (int kk = 0; kk < D / 16; ++kk) ldsm_x4(q_regs[kk], q_base + kk * 16 * EL);
        }
        const int kv0 = j * FWD_BN;
        score_tile<1>(s_tile, acc, row_max, row_sum, q_regs, q_base, smem_addr(slot_of(2 * j)), lane, kv0,
                      kv0 + FWD_BN > len, row_pos, len, scale_log2);
        __syncwarp();  // every lane is done with K_j's tile: V_j+1 goes there
        if (j + 1 < num_tiles) copy_paged_tile(slot_of(2 * j + 3), v_cache, cur, num_kv_heads, kvh, lane);
        cp_async_commit();
        cp_async_wait<2>();  // V_j landed
        __syncwarp();
        accumulate_pv<1>(acc, s_tile, smem_addr(slot_of(2 * j + 1)), lane);
        __syncwarp();  // V_j's tile is free: K_j+2 goes there
        if (j + 2 < num_tiles) copy_paged_tile(slot_of(2 * j + 4), k_cache, nxt, num_kv_heads, kvh, lane);
        cp_async_commit();
#pragma unroll
        for (int h = 0; h < ROWS_PER_LANE; ++h) cur[h] = nxt[h];
        read_slots(nxt, table, (j + 3) * FWD_BN, len, block_size, lane);
    }
#pragma unroll
    for (int r = 0; r < 2; ++r) {
        const float sum = quad_total(row_sum[0][r]);
        const int head = g + 8 * r;  // this thread's row of the tile: a query head of the group, or padding
        if (head < group) store_row(out + ((long long)t * num_heads + kvh * group + head) * D, acc[0], r, lane & 3, sum);
    }
}

// paged_attention_invariant for a few sequences (too few (sequence, kv head) pairs to fill the GPU with one warp
// each): INV_WARPS warps share each pair's tiles, with the same result to the bit. Of every K/V tile, each warp
// computes the scores of its INV_PB 16-key parts (tile_scores) and passes them to the others through shared memory;
// every warp then runs the whole tile's softmax_tile (the same operations on the same scores: the same maxima, sums
// and probabilities in each) and the P V of its INV_DP 16-column parts of the head (accumulate_pv), and stores those
// columns. A score is the same mma sequence over D whichever warp computes it, and an output column's acc the same
// rescales and mma sequence over the keys, so every row goes through training's operations in training's order.
// Tiles go through a ring of INV_STAGES stages of K and V, copied by all the block's threads, two tiles ahead.
// Same arguments and grid (K, S) as paged_attention_invariant; INV_THREADS threads; invariant_warps_shared_bytes.
constexpr int INV_WARPS = FWD_BN / 16 < 4 ? FWD_BN / 16 : 4;  // four, or one a 16-key part of a narrower tile
constexpr int INV_THREADS = 32 * INV_WARPS, INV_STAGES = 3;
constexpr int INV_PB = FWD_BN / 16 / INV_WARPS, INV_DP = D / 16 / INV_WARPS;  // a warp's 16-key, 16-column parts
static_assert(INV_PB * INV_WARPS * 16 == FWD_BN && INV_DP * INV_WARPS * 16 == D,
              "the invariant decode's warps split a tile's keys and the head's columns evenly");

extern "C" __global__ void __launch_bounds__(INV_THREADS) paged_attention_invariant_warps(
    scalar_t* __restrict__ out, const scalar_t* __restrict__ q, const scalar_t* __restrict__ k_cache,
    const scalar_t* __restrict__ v_cache, const int* __restrict__ block_tables, const int* __restrict__ context_lens,
    const int* __restrict__ cu_seqlens_q, int num_heads, int num_kv_heads, int block_size, int max_blocks,
    int is_decode, long long q_stride, float scale_log2) {
    extern __shared__ __align__(16) unsigned char smem[];
    constexpr int TILE = FWD_BN * LD;  // elements of one K or V tile in shared memory
    scalar_t* sQ = reinterpret_cast<scalar_t*>(smem);
    scalar_t* sK = sQ + 16 * LD;              // INV_STAGES stages
    scalar_t* sV = sK + INV_STAGES * TILE;    // INV_STAGES stages
    float* sS = reinterpret_cast<float*>(sV + INV_STAGES * TILE);  // a tile's scores, [FWD_BN / 8][4][32 lanes]
    const int kvh = blockIdx.x, s = blockIdx.y, warp = threadIdx.x >> 5, lane = threadIdx.x & 31, g = lane >> 2;
    const int group = num_heads / num_kv_heads;
    const int t = is_decode ? s : cu_seqlens_q[s];  // the sequence's new token
    if (!is_decode && cu_seqlens_q[s + 1] - t != 1) return;
    const int pos = context_lens[s] - 1;  // the token's position in its sequence
    const int len = pos + 1;              // keys it sees
    const int num_tiles = (len + FWD_BN - 1) / FWD_BN;
    const PagedKeys keys{k_cache + kvh * D, v_cache + kvh * D, block_tables + (long long)s * max_blocks, block_size,
                         num_kv_heads};

    // prologue: groups (Q, tile 0) and (tile 1) committed
    const scalar_t* qt = q + (long long)t * q_stride + (long long)kvh * group * D;
    for (int c = threadIdx.x; c < 16 * (D / 8); c += INV_THREADS) {  // rows past the group are zeros
        const int r = c / (D / 8), col = (c % (D / 8)) * 8;
        cp_async16(sQ + r * LD + col, qt + (r < group ? r * D : 0) + col, r < group ? 16 : 0);
    }
    keys.template load<INV_THREADS>(sK, sV, 0, len);
    cp_async_commit();
    if (num_tiles > 1) keys.template load<INV_THREADS>(sK + TILE, sV + TILE, FWD_BN, len);
    cp_async_commit();

    float acc[1][2 * INV_DP][4], scores[1][FWD_BN / 8][4];
    float row_max[1][2] = {{NEG_INF, NEG_INF}}, row_sum[1][2] = {{0.0f, 0.0f}};
#pragma unroll
    for (int i = 0; i < 2 * INV_DP; ++i) acc[0][i][0] = acc[0][i][1] = acc[0][i][2] = acc[0][i][3] = 0.0f;
    const int row_pos[1][2] = {{pos, pos}};
    unsigned q_regs[D / 16][4];
    const unsigned q_base = smem_addr(sQ) + lane_offset_a(lane, LD);
    for (int j = 0; j < num_tiles; ++j) {
        const int stage = j % INV_STAGES;
        if (j + 2 < num_tiles) {  // into the stage tile j - 1 left, free since the last barrier
            const int ahead = (j + 2) % INV_STAGES;
            keys.template load<INV_THREADS>(sK + ahead * TILE, sV + ahead * TILE, (j + 2) * FWD_BN, len);
        }
        cp_async_commit();
        cp_async_wait<2>();  // this thread's copies of tile j landed (tiles j + 1, j + 2 may be in flight)
        __syncthreads();     // and every other thread's
        if (j == 0) {
#pragma unroll
            for (int kk = 0; kk < D / 16; ++kk) ldsm_x4(q_regs[kk], q_base + kk * 16 * EL);
        }
        const int kv0 = j * FWD_BN;
        tile_scores<1, INV_PB>(scores, q_regs, q_base, smem_addr(sK + stage * TILE) + warp * INV_PB * 16 * ROW, lane);
#pragma unroll
        for (int i = 0; i < 2 * INV_PB; ++i)
#pragma unroll
            for (int e = 0; e < 4; ++e) sS[((warp * 2 * INV_PB + i) * 4 + e) * 32 + lane] = scores[0][i][e];
        __syncthreads();  // the whole tile's scores are in sS
#pragma unroll
        for (int nt = 0; nt < FWD_BN / 8; ++nt)
#pragma unroll
            for (int e = 0; e < 4; ++e) scores[0][nt][e] = sS[(nt * 4 + e) * 32 + lane];
        softmax_tile<1, 2 * INV_DP>(scores, acc, row_max, row_sum, lane, kv0, kv0 + FWD_BN > len, row_pos, len,
                                    scale_log2);
        accumulate_pv<1, INV_DP>(acc, scores, smem_addr(sV + stage * TILE) + warp * INV_DP * 16 * EL, lane);
        __syncthreads();  // tile j's stage and sS are free: refilled and rewritten from the next tile on
    }
#pragma unroll
    for (int r = 0; r < 2; ++r) {
        const float sum = quad_total(row_sum[0][r]);
        const int head = g + 8 * r;  // this thread's row of the tile: a query head of the group, or padding
        if (head < group)
            store_row<2 * INV_DP>(out + ((long long)t * num_heads + kvh * group + head) * D + warp * INV_DP * 16,
                                  acc[0], r, lane & 3, sum);
    }
}

// delta[h, t] = sum_d dout[t, h, d] * o[t, h, d]: one warp per (token, head) row, 4 warps per block.
extern "C" __global__ void attention_delta(float* __restrict__ delta, const scalar_t* __restrict__ dout,
                                           const scalar_t* __restrict__ o, int tokens, int num_heads) {
    const int lane = threadIdx.x & 31;
    for (long long row = blockIdx.x * 4LL + (threadIdx.x >> 5); row < (long long)tokens * num_heads;
         row += gridDim.x * 4LL) {
        float sum = 0.0f;
        for (int c = lane * VEC; c < D; c += 32 * VEC) {
            float a[VEC], b[VEC];
            load_vec(dout + row * D + c, a);
            load_vec(o + row * D + c, b);
#pragma unroll
            for (int i = 0; i < VEC; ++i) sum += a[i] * b[i];
        }
        sum = warp_sum(sum);
        if (lane == 0) delta[(row % num_heads) * tokens + row / num_heads] = sum;
    }
}

// out[r, c] = in[r, c] rounded to DTYPE, in (rows, cols) dense, out's rows out_stride elements apart
// (dq_accum -> dq, a view of the fused dqkv). Blocks stride over rows, threads over a row's columns.
extern "C" __global__ void round_rows_to_dtype(scalar_t* __restrict__ out, const float* __restrict__ in,
                                               long long rows, int cols, long long out_stride) {
    for (long long r = blockIdx.x; r < rows; r += gridDim.x)
        for (int c = threadIdx.x; c < cols; c += blockDim.x)
            out[r * out_stride + c] = from_float<scalar_t>(in[r * cols + c]);
}

extern "C" __global__ void __launch_bounds__(BWD_THREADS) flash_attention_backward(
    float* __restrict__ dq_accum, scalar_t* __restrict__ dk, scalar_t* __restrict__ dv,
    const scalar_t* __restrict__ q, const scalar_t* __restrict__ k, const scalar_t* __restrict__ v,
    const scalar_t* __restrict__ dout, const float* __restrict__ lse, const float* __restrict__ delta,
    const int* __restrict__ cu_seqlens, int num_seqs, int num_heads, int num_kv_heads, long long q_stride,
    long long k_stride, long long v_stride, int tokens, float scale, float scale_log2, long long dkv_stride) {
    extern __shared__ __align__(16) unsigned char smem[];
    scalar_t* sK = reinterpret_cast<scalar_t*>(smem);
    scalar_t* sV = sK + BWD_BN * LD;
    scalar_t* sQ0 = sV + BWD_BN * LD;     // 2 stages of Q and dO tiles
    scalar_t* sdO0 = sQ0 + 2 * BWD_BM * LD;
    scalar_t* sdS = sdO0 + 2 * BWD_BM * LD;  // dS^T: (keys, queries)
    float* sLse0 = reinterpret_cast<float*>(sdS + BWD_BN * LDS);  // 2 stages of lse, then 2 of delta
    float* sDelta0 = sLse0 + 2 * BWD_BM;
    int start, len, tile;
    if (!find_tile(cu_seqlens, num_seqs, BWD_BN, blockIdx.x, start, len, tile)) return;
    const int kvh = blockIdx.y, group = num_heads / num_kv_heads;
    const int k0 = tile * BWD_BN;
    const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31, g = lane >> 2, t = lane & 3;
    load_tile<BWD_BN, BWD_THREADS>(sK, k + (long long)start * k_stride + kvh * D, k_stride, k0, len);
    load_tile<BWD_BN, BWD_THREADS>(sV, v + (long long)start * v_stride + kvh * D, v_stride, k0, len);
    cp_async_commit();

    float dk_acc[D / 8][4], dv_acc[D / 8][4];
#pragma unroll
    for (int i = 0; i < D / 8; ++i)
#pragma unroll
        for (int e = 0; e < 4; ++e) dk_acc[i][e] = dv_acc[i][e] = 0.0f;
    const int key_a = k0 + warp * 16 + g;  // this thread's two keys: key_a and key_a + 8
    const int first_tile = k0 / BWD_BM, num_q_tiles = (len + BWD_BM - 1) / BWD_BM;
    // shared addresses of this lane's ldmatrix rows, see lane_offset_a/b
    const unsigned k_a = smem_addr(sK + warp * 16 * LD) + lane_offset_a(lane, LD);
    const unsigned v_a = smem_addr(sV + warp * 16 * LD) + lane_offset_a(lane, LD);
    const unsigned q_b0 = smem_addr(sQ0) + lane_offset_b(lane, LD), do_b0 = smem_addr(sdO0) + lane_offset_b(lane, LD);
    const unsigned q_t0 = smem_addr(sQ0) + lane_offset_a(lane, LD), do_t0 = smem_addr(sdO0) + lane_offset_a(lane, LD);
    constexpr unsigned STAGE_BYTES = BWD_BM * ROW;  // one stage of sQ or sdO
    const int qrow0 = (warp & 1) * 16, dcol0 = (warp >> 1) * DQ_COLS;  // this warp's part of dQ
    const unsigned ds_t = smem_addr(sdS + qrow0) + lane_offset_b(lane, LDS);
    const unsigned k_t = smem_addr(sK + dcol0) + lane_offset_a(lane, LD);

    // The (query head, query tile) pairs this block visits, in order; the next pair's Q, dO, lse and delta are
    // requested (cp.async, second stage) before the current pair is used, so their latency hides behind its math.
    const int tiles_per_head = num_q_tiles - first_tile;
    const int num_steps = group * tiles_per_head;
    auto request = [&](int step) {
        const int h = kvh * group + step / tiles_per_head, qs = (first_tile + step % tiles_per_head) * BWD_BM;
        const int stage = step & 1;
        load_tile<BWD_BM, BWD_THREADS>(sQ0 + stage * BWD_BM * LD, q + (long long)start * q_stride + h * D, q_stride,
                                       qs, len);
        load_tile<BWD_BM, BWD_THREADS>(sdO0 + stage * BWD_BM * LD, dout + ((long long)start * num_heads + h) * D,
                                       (long long)num_heads * D, qs, len);
        if (threadIdx.x < 2 * BWD_BM) {  // lse then delta, one fp32 each; rows past len read as zeros
            const int r = threadIdx.x % BWD_BM, valid = qs + r < len;
            const long long row = (long long)h * tokens + start + (valid ? qs + r : 0);
            const float* src = (threadIdx.x < BWD_BM ? lse : delta) + row;
            float* dst = (threadIdx.x < BWD_BM ? sLse0 : sDelta0) + stage * BWD_BM + r;
            asm volatile("cp.async.ca.shared.global [%0], [%1], 4, %2;\n" ::"r"(smem_addr(dst)), "l"(src),
                         "r"(valid ? 4 : 0));
        }
    };
    if (num_steps > 0) request(0);
    cp_async_commit();
    for (int step = 0; step < num_steps; ++step) {
        const int h = kvh * group + step / tiles_per_head, qs = (first_tile + step % tiles_per_head) * BWD_BM;
        const int stage = step & 1;
        if (step + 1 < num_steps) request(step + 1);
        cp_async_commit();  // (empty at the last step: the wait below stays uniform)
        cp_async_wait<1>();
        __syncthreads();
        const unsigned q_b = q_b0 + stage * STAGE_BYTES, do_b = do_b0 + stage * STAGE_BYTES;
        const unsigned q_t = q_t0 + stage * STAGE_BYTES, do_t = do_t0 + stage * STAGE_BYTES;
        const float* sLse = sLse0 + stage * BWD_BM;
        const float* sDelta = sDelta0 + stage * BWD_BM;
        {
            // S^T = K Q^T, then P^T (16 keys of this warp x BWD_BM queries)
            float p[BWD_BM / 8][4], dp[BWD_BM / 8][4];
#pragma unroll
            for (int i = 0; i < BWD_BM / 8; ++i)
#pragma unroll
                for (int e = 0; e < 4; ++e) p[i][e] = dp[i][e] = 0.0f;
#pragma unroll
            for (int kk = 0; kk < D / 16; ++kk) {
                unsigned a[4], av[4];
                ldsm_x4(a, k_a + kk * 16 * EL);
                ldsm_x4(av, v_a + kk * 16 * EL);
#pragma unroll
                for (int n = 0; n < BWD_BM / 16; ++n) {
                    unsigned b[4];
                    ldsm_x4(b, q_b + n * 16 * ROW + kk * 16 * EL);
                    mma(p[2 * n], a, b, scalar_t());
                    mma(p[2 * n + 1], a, b + 2, scalar_t());
                    ldsm_x4(b, do_b + n * 16 * ROW + kk * 16 * EL);
                    mma(dp[2 * n], av, b, scalar_t());  // dP^T = V dO^T
                    mma(dp[2 * n + 1], av, b + 2, scalar_t());
                }
            }
#pragma unroll
            for (int nt = 0; nt < BWD_BM / 8; ++nt) {
#pragma unroll
                for (int e = 0; e < 4; ++e) {
                    const int col = nt * 8 + 2 * t + (e & 1);
                    const int key = key_a + 8 * (e >> 1);
                    const bool visible = qs + col >= key && key < len && qs + col < len;
                    const float pv = visible ? fast_exp2(p[nt][e] * scale_log2 - sLse[col] * LOG2E) : 0.0f;
                    p[nt][e] = pv;
                    dp[nt][e] = pv * (dp[nt][e] - sDelta[col]);  // dS^T (scale applied at the end)
                }
            }
            // dV += P^T dO;  dK += dS^T Q
#pragma unroll
            for (int kk = 0; kk < BWD_BM / 16; ++kk) {
                const unsigned ap[4] = {pack2(p[2 * kk][0], p[2 * kk][1], scalar_t()),
                                        pack2(p[2 * kk][2], p[2 * kk][3], scalar_t()),
                                        pack2(p[2 * kk + 1][0], p[2 * kk + 1][1], scalar_t()),
                                        pack2(p[2 * kk + 1][2], p[2 * kk + 1][3], scalar_t())};
                const unsigned as[4] = {pack2(dp[2 * kk][0], dp[2 * kk][1], scalar_t()),
                                        pack2(dp[2 * kk][2], dp[2 * kk][3], scalar_t()),
                                        pack2(dp[2 * kk + 1][0], dp[2 * kk + 1][1], scalar_t()),
                                        pack2(dp[2 * kk + 1][2], dp[2 * kk + 1][3], scalar_t())};
#pragma unroll
                for (int n = 0; n < D / 16; ++n) {
                    unsigned b[4];
                    const unsigned off = kk * 16 * ROW + n * 16 * EL;
                    ldsm_x4_trans(b, do_t + off);
                    mma(dv_acc[2 * n], ap, b, scalar_t());
                    mma(dv_acc[2 * n + 1], ap, b + 2, scalar_t());
                    ldsm_x4_trans(b, q_t + off);
                    mma(dk_acc[2 * n], as, b, scalar_t());
                    mma(dk_acc[2 * n + 1], as, b + 2, scalar_t());
                }
                // dS^T rows of this warp into shared memory for the dQ product
                const int key_row = warp * 16 + g;
                *reinterpret_cast<unsigned*>(sdS + key_row * LDS + kk * 16 + 2 * t) = as[0];
                *reinterpret_cast<unsigned*>(sdS + (key_row + 8) * LDS + kk * 16 + 2 * t) = as[1];
                *reinterpret_cast<unsigned*>(sdS + key_row * LDS + kk * 16 + 8 + 2 * t) = as[2];
                *reinterpret_cast<unsigned*>(sdS + (key_row + 8) * LDS + kk * 16 + 8 + 2 * t) = as[3];
            }
            __syncthreads();

            // dQ (BWD_BM x D) += dS K * scale: warp w takes queries (w % 2) * 16.. and dims (w / 2) * DQ_COLS..
            float dq[DQ_COLS / 8][4];
#pragma unroll
            for (int i = 0; i < DQ_COLS / 8; ++i) dq[i][0] = dq[i][1] = dq[i][2] = dq[i][3] = 0.0f;
#pragma unroll
            for (int kk = 0; kk < BWD_BN / 16; ++kk) {
                unsigned a[4];
                ldsm_x4_trans(a, ds_t + kk * 16 * LDS * EL);
#pragma unroll
                for (int n = 0; n < DQ_COLS / 16; ++n) {
                    unsigned b[4];
                    ldsm_x4_trans(b, k_t + kk * 16 * ROW + n * 16 * EL);
                    mma(dq[2 * n], a, b, scalar_t());
                    mma(dq[2 * n + 1], a, b + 2, scalar_t());
                }
            }
#ifndef SKIP_DQ_ATOMICS  // defined only by the benchmark, to time the rest of the kernel
            // Quad neighbours swap half their values so that each thread holds 4 consecutive columns of one
            // row (even t: row g, odd t: row g + 8): one 16-byte atomic add instead of four.
            const bool odd = t & 1;
            const int qq = qs + qrow0 + g + (odd ? 8 : 0);
            float* dst = dq_accum + ((long long)(start + qq) * num_heads + h) * D + dcol0 + 2 * (t & ~1);
#pragma unroll
            for (int nt = 0; nt < DQ_COLS / 8; ++nt) {
                const float r0 = __shfl_xor_sync(0xffffffffu, odd ? dq[nt][0] : dq[nt][2], 1);
                const float r1 = __shfl_xor_sync(0xffffffffu, odd ? dq[nt][1] : dq[nt][3], 1);
                const float4 val = odd ? make_float4(r0 * scale, r1 * scale, dq[nt][2] * scale, dq[nt][3] * scale)
                                       : make_float4(dq[nt][0] * scale, dq[nt][1] * scale, r0 * scale, r1 * scale);
                if (qq < len) atomic_add4(dst + nt * 8, val);
            }
#endif
            __syncthreads();  // sQ, sdO, sdS are refilled next
        }
    }

#pragma unroll
    for (int r = 0; r < 2; ++r) {
        const int key = key_a + 8 * r;
        if (key >= len) continue;
        const long long row = (long long)(start + key) * dkv_stride + kvh * D + 2 * t;
#pragma unroll
        for (int nt = 0; nt < D / 8; ++nt) {
            *reinterpret_cast<unsigned*>(dk + row + nt * 8) =
                pack2(dk_acc[nt][2 * r] * scale, dk_acc[nt][2 * r + 1] * scale, scalar_t());
            *reinterpret_cast<unsigned*>(dv + row + nt * 8) = pack2(dv_acc[nt][2 * r], dv_acc[nt][2 * r + 1], scalar_t());
        }
    }
}
