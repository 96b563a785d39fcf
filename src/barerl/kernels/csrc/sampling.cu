// sample: one token per row of fp32 logits, with temperature, top-k, top-p, min-p, a counter-based hash as
// the random source, and the log-prob of the sampled token. The contract is backend/ref/sampling.py's
// `sample`; every float operation that decides the token is the reference's own fp32 operation, in the same
// order, so the tokens are identical (not merely close): z = logits / T, u, g = -log(-log(u)), z + g, first
// argmax.
//
// Three launches (all graph-capturable, no host sync):
// 1. sample_thresholds, grid (B,), 512 threads. Rows with T != 0 and a truncation compute z_max and the
//    smallest kept key `thr` (keys: order-preserving uint32 images of z) by radix select over the row, one
//    8-bit digit per pass, never sorting: top-k counts tokens per bin; top-p sums exp(z - z_max) per bin in
//    64-bit fixed point (deterministic, no float atomics) over the top-k set, and finds the largest key whose
//    tokens at or above it carry >= top_p of that mass, which is the reference's "mass of the strictly more
//    probable tokens < top_p" with boundary ties kept. Other rows write thr = 0 (keep all). min-p is not a
//    threshold here: the partial pass tests the reference's own predicate exp(z - z_max) >= min_p.
// 2. sample_partials, grid (C, B), 256 threads: chunk c of row b (CHUNK tokens). Over the kept tokens
//    (key >= thr, min-p predicate): running max and sum of exp for the log-sum-exp, and the best candidate:
//    greedy rows (T == 0) maximise the logit, others z + g; ties go to the lower index. One pass.
// 3. sample_finalize, grid (B,), 32 threads: merges the row's C partials; token = best index,
//    logprob = z_token - (max + log(sum)) (greedy rows: log_softmax of the raw logits).
// Shapes:  logits (B, V) fp32 dense; temperature, top_p, min_p (B,) fp32; top_k (B,) int32 (<= 0, >= V: off);
//          seeds (B,) uint64; counters (B,) int64; thr (B,) uint32 and row_max (B,) fp32 scratch;
//          part_max, part_sum, part_score (B, C) fp32 and part_index (B, C) int32 scratch;
//          tokens (B,) int32; logprobs (B,) fp32.
#include "common.cuh"

constexpr int SELECT_THREADS = 512;
constexpr int SELECT_WARPS = SELECT_THREADS / 32;
constexpr int PARTIAL_THREADS = 256;
constexpr int CHUNK = 4096;                  // tokens per sample_partials CTA
constexpr double MASS_SCALE = 4398046511104.0;  // 2^42: fixed-point mass, exact sums for V < 2^21
constexpr u64 HALF_MASK = (1ull << 21) - 1;

__device__ __forceinline__ unsigned int order_key(float z) {
    const unsigned int bits = __float_as_uint(z == 0.0f ? 0.0f : z);  // -0 and +0 compare equal: one key
    return (bits & 0x80000000u) ? ~bits : (bits | 0x80000000u);
}

// u[b, v] of the reference's uniform_noise, with its fp32 rounding: ((z >> 41) as fp32 + 0.5) * 2^-23 (exact, < 1).
__device__ __forceinline__ float uniform_noise(u64 seed, long long counter, int v) {
    const u64 z = splitmix64(seed, ((u64)counter << 32) + (u64)v + 1ull);
    return ((float)(z >> 41) + 0.5f) * 1.1920928955078125e-07f;
}

__device__ __forceinline__ bool truncates(int top_k, float top_p, float min_p, int vocab) {
    return (top_k > 0 && top_k < vocab) || top_p < 1.0f || min_p > 0.0f;
}

// Shared-memory histogram scan by warp 0: the bin b (255 = highest keys) where the running total from the
// top first reaches `target`; `*above` gets the total of the bins above b. Called by all threads.
__device__ __forceinline__ int select_bin(const u64* hist, u64 target, u64* above) {
    __shared__ int chosen;
    __shared__ u64 chosen_above;
    if (threadIdx.x < 32) {
        const int lane = threadIdx.x;
        u64 local = 0;
        for (int i = 0; i < 8; ++i) local += hist[255 - lane * 8 - i];
        u64 inclusive = local;
        for (int o = 1; o < 32; o <<= 1) {
            const u64 other = __shfl_up_sync(0xffffffffu, inclusive, o);
            if (lane >= o) inclusive += other;
        }
        const unsigned int hit = __ballot_sync(0xffffffffu, inclusive >= target);
        const int first = hit ? __ffs(hit) - 1 : 31;  // target over the total (rounding): lowest bin
        if (lane == first) {
            u64 run = inclusive - local;
            int bin = 255 - lane * 8 - 7;
            for (int i = 0; i < 8; ++i) {
                const int b = 255 - lane * 8 - i;
                if (run + hist[b] >= target) { bin = b; break; }
                run += hist[b];
            }
            chosen = bin;
            chosen_above = run;
        }
    }
    __syncthreads();
    *above = chosen_above;
    return chosen;
}

// Radix select over the row's keys >= floor_key: the largest key K with weight(keys >= K) >= target, where a
// token weighs 1 (BY_MASS false) or its fixed-point exp(z - z_max). Each warp fills a private histogram;
// lanes of a warp that hit the same bin are summed by warp reductions first (fp32 exponents cluster into a
// few bins, and contended shared-memory atomics, 64-bit ones above all, would serialise the pass). The
// 42-bit weights are reduced as two 21-bit halves, so 32 lanes never overflow 32 bits.
template <bool BY_MASS>
__device__ unsigned int radix_select(const float* row, int vocab, float t, float z_max,
                                     unsigned int floor_key, u64 target, u64 (*hist)[256], u64* merged) {
    const int lane = threadIdx.x % 32, warp = threadIdx.x / 32;
    unsigned int prefix = 0, mask = 0;
    for (int shift = 24; shift >= 0; shift -= 8) {
        for (int i = lane; i < 256; i += 32) hist[warp][i] = 0;
        for (int v0 = warp * 32; v0 < vocab; v0 += SELECT_THREADS) {  // whole warps iterate together
            const int v = v0 + lane;
            unsigned int bin = 0;
            u64 w = 0;
            bool in = false;
            if (v < vocab) {
                const float z = row[v] / t;
                const unsigned int key = order_key(z);
                in = key >= floor_key && (key & mask) == prefix;
                bin = (key >> shift) & 255u;
                w = BY_MASS ? (u64)((double)expf(z - z_max) * MASS_SCALE) : 1ull;
            }
            unsigned int pending = __ballot_sync(0xffffffffu, in);
            while (pending) {
                const int leader = __ffs(pending) - 1;
                const unsigned int leader_bin = __shfl_sync(0xffffffffu, bin, leader);
                const bool same = in && bin == leader_bin;
                const unsigned int members = __ballot_sync(0xffffffffu, same);
                const unsigned int lo_w = same ? (unsigned int)(w & HALF_MASK) : 0u;
                const unsigned int hi_w = same ? (unsigned int)(w >> 21) : 0u;
                const unsigned int lo = __reduce_add_sync(0xffffffffu, lo_w);
                const unsigned int hi = BY_MASS ? __reduce_add_sync(0xffffffffu, hi_w) : 0u;
                if (lane == leader) hist[warp][leader_bin] += ((u64)hi << 21) + lo;
                pending &= ~members;
            }
        }
        __syncthreads();
        for (int i = threadIdx.x; i < 256; i += SELECT_THREADS) {
            u64 sum = 0;
            for (int w = 0; w < SELECT_WARPS; ++w) sum += hist[w][i];
            merged[i] = sum;
        }
        __syncthreads();
        u64 above;
        const int bin = select_bin(merged, target, &above);
        target -= above;
        prefix |= (unsigned int)bin << shift;
        mask |= 255u << shift;
        __syncthreads();  // merged is rewritten by the next digit
    }
    return prefix;
}

__device__ __forceinline__ u64 warp_sum_u64(u64 v) {
#pragma unroll
    for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
    return v;
}

extern "C" __global__ void __launch_bounds__(SELECT_THREADS) sample_thresholds(
        const float* __restrict__ logits, const float* __restrict__ temperature,
        const int* __restrict__ top_k, const float* __restrict__ top_p, const float* __restrict__ min_p,
        unsigned int* __restrict__ thr, float* __restrict__ row_max, int vocab) {
    __shared__ u64 hist[SELECT_WARPS][256], merged[256], total;
    const int b = blockIdx.x;
    const float t = temperature[b];
    const int k = top_k[b];
    const float p = top_p[b];
    if (t == 0.0f || !truncates(k, p, min_p[b], vocab)) {
        if (threadIdx.x == 0) thr[b] = 0u;
        return;
    }
    const float* row = logits + (long long)b * vocab;
    float m = NEG_INF;
    for (int v = threadIdx.x; v < vocab; v += SELECT_THREADS) m = fmaxf(m, row[v] / t);
    m = block_max(m);
    unsigned int key = 0;
    if (k > 0 && k < vocab) key = radix_select<false>(row, vocab, t, m, 0u, (u64)k, hist, merged);
    if (p < 1.0f) {
        u64 local = 0;
        for (int v = threadIdx.x; v < vocab; v += SELECT_THREADS) {
            const float z = row[v] / t;
            if (order_key(z) >= key) local += (u64)((double)expf(z - m) * MASS_SCALE);
        }
        if (threadIdx.x == 0) total = 0;
        __syncthreads();
        local = warp_sum_u64(local);
        if (threadIdx.x % 32 == 0) atomicAdd(&total, local);
        __syncthreads();
        const double target = ceil((double)p * (double)total);
        key = radix_select<true>(row, vocab, t, m, key, (u64)fmax(target, 1.0), hist, merged);
    }
    if (threadIdx.x == 0) {
        thr[b] = key;
        row_max[b] = m;
    }
}

struct Candidate {
    float score;
    int index;
};

__device__ __forceinline__ Candidate better(Candidate a, Candidate b) {
    return (b.score > a.score || (b.score == a.score && b.index < a.index)) ? b : a;
}

// Online log-sum-exp state (m, s): s = sum exp(x - m) over the values seen.
__device__ __forceinline__ void lse_merge(float& m, float& s, float m2, float s2) {
    const float mn = fmaxf(m, m2);
    if (mn == NEG_INF) return;
    s = s * expf(m - mn) + s2 * expf(m2 - mn);
    m = mn;
}

extern "C" __global__ void __launch_bounds__(PARTIAL_THREADS) sample_partials(
        const float* __restrict__ logits, const float* __restrict__ temperature,
        const float* __restrict__ min_p, const u64* __restrict__ seeds,
        const long long* __restrict__ counters,
        const unsigned int* __restrict__ thr, const float* __restrict__ row_max, float* __restrict__ part_max,
        float* __restrict__ part_sum, float* __restrict__ part_score, int* __restrict__ part_index,
        int vocab) {
    const int c = blockIdx.x, b = blockIdx.y, num_chunks = gridDim.x;
    const float t = temperature[b];
    const bool greedy = t == 0.0f;
    const unsigned int floor_key = greedy ? 0u : thr[b];
    const float mp = greedy ? 0.0f : min_p[b];
    const float z_max = mp > 0.0f ? row_max[b] : 0.0f;
    const u64 seed = seeds[b];
    const long long counter = counters[b];
    const float* row = logits + (long long)b * vocab;

    float m = NEG_INF, s = 0.0f;
    Candidate best = {NEG_INF, 0x7fffffff};
    const int end = min(vocab, (c + 1) * CHUNK);
    for (int v = c * CHUNK + threadIdx.x; v < end; v += PARTIAL_THREADS) {
        const float z = greedy ? row[v] : row[v] / t;
        // -inf (banned tokens) has no mass and never wins; skipping it keeps exp(z - m) off -inf - -inf
        if (z == NEG_INF || order_key(z) < floor_key || (mp > 0.0f && !(expf(z - z_max) >= mp))) continue;
        if (z > m) {
            s = s * expf(m - z) + 1.0f;
            m = z;
        } else {
            s += expf(z - m);
        }
        const float score = greedy ? z : z + -logf(-logf(uniform_noise(seed, counter, v)));
        best = better(best, {score, v});
    }
    __shared__ float sm[PARTIAL_THREADS / 32], ss[PARTIAL_THREADS / 32], sc[PARTIAL_THREADS / 32];
    __shared__ int si[PARTIAL_THREADS / 32];
    for (int o = 16; o > 0; o >>= 1) {
        lse_merge(m, s, __shfl_xor_sync(0xffffffffu, m, o), __shfl_xor_sync(0xffffffffu, s, o));
        best = better(best, {__shfl_xor_sync(0xffffffffu, best.score, o),
                             __shfl_xor_sync(0xffffffffu, best.index, o)});
    }
    const int warp = threadIdx.x / 32;
    if (threadIdx.x % 32 == 0) {
        sm[warp] = m; ss[warp] = s; sc[warp] = best.score; si[warp] = best.index;
    }
    __syncthreads();
    if (threadIdx.x == 0) {
        for (int w = 1; w < PARTIAL_THREADS / 32; ++w) {
            lse_merge(m, s, sm[w], ss[w]);
            best = better(best, {sc[w], si[w]});
        }
        const long long out = (long long)b * num_chunks + c;
        part_max[out] = m; part_sum[out] = s; part_score[out] = best.score; part_index[out] = best.index;
    }
}

extern "C" __global__ void sample_finalize(
        const float* __restrict__ logits, const float* __restrict__ temperature,
        const float* __restrict__ part_max, const float* __restrict__ part_sum,
        const float* __restrict__ part_score, const int* __restrict__ part_index, int* __restrict__ tokens,
        float* __restrict__ logprobs, int vocab, int num_chunks) {
    const int b = blockIdx.x, lane = threadIdx.x;
    float m = NEG_INF, s = 0.0f;
    Candidate best = {NEG_INF, 0x7fffffff};
    for (int c = lane; c < num_chunks; c += 32) {
        const long long i = (long long)b * num_chunks + c;
        lse_merge(m, s, part_max[i], part_sum[i]);
        best = better(best, {part_score[i], part_index[i]});
    }
    for (int o = 16; o > 0; o >>= 1) {
        lse_merge(m, s, __shfl_xor_sync(0xffffffffu, m, o), __shfl_xor_sync(0xffffffffu, s, o));
        best = better(best, {__shfl_xor_sync(0xffffffffu, best.score, o),
                             __shfl_xor_sync(0xffffffffu, best.index, o)});
    }
    if (lane == 0) {
        const int token = best.index < vocab ? best.index : 0;  // a row of -inf only: token 0, logprob NaN
        const float t = temperature[b];
        const float logit = logits[(long long)b * vocab + token];
        const float z = t == 0.0f ? logit : logit / t;
        tokens[b] = token;
        logprobs[b] = z - (m + logf(s));
    }
}
