// sample: one token per row of fp32 logits, with temperature, top-k, top-p, min-p, a counter-based hash as
// the random source, and the log-prob of the sampled token. The contract is backend/ref/sampling.py's
// `sample`: inverse-CDF sampling over exact fixed-point masses with one random draw per row,
//   z = logits / T;  m = max z;  p_v = expf(z_v - m) for kept v;  mass_v = rint(p_v * 2^42) (u64);
//   target = floor(splitmix64(seed, counter) * total / 2^64) < total;
//   token = the first v with mass_0 + ... + mass_v > target;  logprob = z_token - (m + log(sum of p_v)).
// Why: the former Gumbel-max drew a 64-bit hash and took two logs per vocabulary element; here an element
// costs a load, an IEEE division, one expf, a float -> u64 conversion and a few compares and adds (~40
// instructions in sample_chunk_mass, ~8 in sample_chunk_max), so the sampler runs near the speed of
// reading the logits twice. Why fixed point: integer sums are exact in any order, so the chunks and trees
// below pick the very same token as the reference, not merely a close one; only the fp32 sum of p behind the
// log-prob differs from the reference's in its last bits. The floats that decide the token (z, m, p_v) are
// the reference's own fp32 operations: IEEE division and expf, which is what CuPy's exp runs. NumPy's float32
// exp on the CPU may differ from expf by an ulp for some inputs; that moves a mass by ~6e-8 of itself and
// changes the token only when the target falls within that distance of a boundary (~1e-7 per draw).
// Boundaries: target < total, so a token always exists; a kept token whose mass rounds to 0 (p_v < 2^-43)
// shares its predecessor's prefix, so it never exceeds the target first and is never drawn; token v is
// drawn with probability mass_v / total up to 2^-64. The kept set always holds the row's maximum
// (top-k >= 1, top_p > 0, min_p <= 1), so total >= 2^42, except in a row without a finite maximum (all
// -inf): total 0, token 0, logprob NaN. Sums stay below 2^64 for V < 2^21 (the launcher checks).
//
// Four launches (graph-capturable: every shape depends only on (B, V), no host sync):
// 1. sample_thresholds, grid (B,), 512 threads. Rows with T != 0 and a truncation compute z_max and the
//    smallest kept key `thr` (keys: order-preserving uint32 images of z) by radix select over the row, one
//    8-bit digit per pass, never sorting: top-k counts tokens per bin; top-p sums exp(z - z_max) per bin in
//    64-bit fixed point (deterministic, no float atomics) over the top-k set, and finds the largest key whose
//    tokens at or above it carry >= top_p of that mass, which is the reference's "mass of the strictly more
//    probable tokens < top_p" with boundary ties kept. Other rows (greedy ones too) write thr = 0 (keep
//    all). min-p is not a threshold here: the mass passes test the reference's own predicate p_v >= min_p.
// 2. sample_chunk_max, grid (C, B), 256 threads: chunk c of row b (CHUNK tokens): the max raw logit and its
//    lowest index. max(logits) / T is the row's max z (division by T > 0 is monotone, rounding included),
//    which is also the max over the kept set; greedy rows take the index as their token.
// 3. sample_chunk_mass, grid (C, B), 256 threads: m from the row's C chunk maxima, then over the chunk's
//    kept tokens the u64 sum of mass_v and the fp32 sum of p_v. Greedy rows run with T = 1 and keep all,
//    which gives log_softmax's sum.
// 4. sample_finalize, grid (B,), 256 threads. Warp 0 merges the row's chunk partials (greedy token, sum of
//    p, total mass), draws the target (__umul64hi) and finds the chunk whose mass range holds it. The CTA
//    then recomputes that one chunk's masses, 16 consecutive tokens per thread; an exclusive block scan of the
//    per-thread sums finds the one thread whose range holds the rest of the target, and it walks its tokens
//    to the first whose running mass exceeds it and writes the token and log-prob.
// Shapes:  logits (B, V) fp32 dense; temperature, top_p, min_p (B,) fp32; top_k (B,) int32 (<= 0, >= V: off);
//          seeds (B,) uint64; counters (B,) int64; thr (B,) uint32 scratch; part_max, part_sum (B, C) fp32,
//          part_index (B, C) int32 and part_mass (B, C) uint64 scratch, C = ceil(V / CHUNK), every entry
//          written before it is read; tokens (B,) int32; logprobs (B,) fp32.
#include "common.cuh"

constexpr int SELECT_THREADS = 512;
constexpr int SELECT_WARPS = SELECT_THREADS / 32;
constexpr int CHUNK_THREADS = 256;                 // sample_chunk_max / sample_chunk_mass
constexpr int CHUNK = 4096;                        // tokens per chunk CTA
constexpr int FINAL_THREADS = 256;
constexpr int PER_THREAD = CHUNK / FINAL_THREADS;  // consecutive tokens per sample_finalize thread
constexpr double MASS_SCALE = 4398046511104.0;     // 2^42: fixed-point mass, exact sums for V < 2^21
constexpr u64 HALF_MASK = (1ull << 21) - 1;

__device__ __forceinline__ unsigned int order_key(float z) {
    const unsigned int bits = __float_as_uint(z == 0.0f ? 0.0f : z);  // -0 and +0 compare equal: one key
    return (bits & 0x80000000u) ? ~bits : (bits | 0x80000000u);
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
        unsigned int* __restrict__ thr, int vocab) {
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
    if (threadIdx.x == 0) thr[b] = key;
}

__device__ __forceinline__ u64 warp_inclusive_sum_u64(u64 v) {
    const int lane = threadIdx.x % 32;
#pragma unroll
    for (int o = 1; o < 32; o <<= 1) {
        const u64 other = __shfl_up_sync(0xffffffffu, v, o);
        if (lane >= o) v += other;
    }
    return v;
}

// Sum over the block, valid in thread 0; all threads call it.
__device__ __forceinline__ u64 block_sum_u64(u64 v) {
    __shared__ u64 partial[32];
    const int warp = threadIdx.x / 32;
    v = warp_sum_u64(v);
    if (threadIdx.x % 32 == 0) partial[warp] = v;
    __syncthreads();
    if (threadIdx.x == 0)
        for (int w = 1; w < (int)blockDim.x / 32; ++w) v += partial[w];
    return v;
}

// Sum of v over the threads before this one (sample_finalize's block); all threads call it.
__device__ __forceinline__ u64 block_exclusive_sum_u64(u64 v) {
    __shared__ u64 warp_total[FINAL_THREADS / 32];
    const int warp = threadIdx.x / 32;
    const u64 inclusive = warp_inclusive_sum_u64(v);
    if (threadIdx.x % 32 == 31) warp_total[warp] = inclusive;
    __syncthreads();
    u64 before = inclusive - v;
    for (int w = 0; w < warp; ++w) before += warp_total[w];
    return before;
}

struct Candidate {
    float score;
    int index;
};

__device__ __forceinline__ Candidate better(Candidate a, Candidate b) {
    return (b.score > a.score || (b.score == a.score && b.index < a.index)) ? b : a;
}

__device__ __forceinline__ Candidate warp_best(Candidate best) {
#pragma unroll
    for (int o = 16; o > 0; o >>= 1)
        best = better(best, {__shfl_xor_sync(0xffffffffu, best.score, o),
                             __shfl_xor_sync(0xffffffffu, best.index, o)});
    return best;
}

// What the mass passes need of row b. Greedy rows run with T = 1 (x / 1 = x exactly) and no min-p, so their
// sum of p is log_softmax's; sample_thresholds gave them thr = 0 already.
struct RowSetup {
    float t, min_p, m;  // m = max z = max(logits) / t
    unsigned int floor_key;
};

__device__ __forceinline__ RowSetup row_setup(const float* temperature, const float* min_p,
                                              const unsigned int* thr, float max_logit, int b) {
    const float t = temperature[b];
    const bool greedy = t == 0.0f;
    RowSetup r;
    r.t = greedy ? 1.0f : t;
    r.min_p = greedy ? 0.0f : min_p[b];
    r.m = max_logit / r.t;
    r.floor_key = thr[b];
    return r;
}

// p = expf(z - m) when logit x is kept (0 otherwise) and its mass rint(p * 2^42), both bit for bit the
// reference's: x / t is IEEE division (no fast math), p * 2^42 is exact in fp32, __float2ull_rn rounds half
// to even like rint. The min-p predicate reuses p: the reference's exp(z - z_max) is the same number. A NaN
// p (z - m = -inf - -inf, a row without a finite maximum) weighs 0.
__device__ __forceinline__ float kept_mass(float x, const RowSetup& r, u64& mass) {
    const float z = x / r.t;
    const float p = expf(z - r.m);
    const bool kept = order_key(z) >= r.floor_key && (r.min_p == 0.0f || p >= r.min_p);
    mass = kept && p > 0.0f ? __float2ull_rn(p * (float)MASS_SCALE) : 0ull;
    return kept ? p : 0.0f;
}

extern "C" __global__ void __launch_bounds__(CHUNK_THREADS) sample_chunk_max(
        const float* __restrict__ logits, float* __restrict__ part_max, int* __restrict__ part_index,
        int vocab) {
    const int c = blockIdx.x, b = blockIdx.y;
    const float* row = logits + (long long)b * vocab;
    // better() sends a tie with the initial -inf to the token, so a row of -inf only still gets index 0
    Candidate best = {NEG_INF, 0x7fffffff};
    const int end = min(vocab, (c + 1) * CHUNK);
    for (int v = c * CHUNK + threadIdx.x; v < end; v += CHUNK_THREADS) best = better(best, {row[v], v});
    __shared__ float scores[CHUNK_THREADS / 32];
    __shared__ int indices[CHUNK_THREADS / 32];
    best = warp_best(best);
    if (threadIdx.x % 32 == 0) {
        scores[threadIdx.x / 32] = best.score;
        indices[threadIdx.x / 32] = best.index;
    }
    __syncthreads();
    if (threadIdx.x == 0) {
        for (int w = 1; w < CHUNK_THREADS / 32; ++w) best = better(best, {scores[w], indices[w]});
        const long long out = (long long)b * gridDim.x + c;
        part_max[out] = best.score;
        part_index[out] = best.index;
    }
}

extern "C" __global__ void __launch_bounds__(CHUNK_THREADS) sample_chunk_mass(
        const float* __restrict__ logits, const float* __restrict__ temperature,
        const float* __restrict__ min_p, const unsigned int* __restrict__ thr,
        const float* __restrict__ part_max, u64* __restrict__ part_mass, float* __restrict__ part_sum,
        int vocab) {
    const int c = blockIdx.x, b = blockIdx.y, num_chunks = gridDim.x;
    const long long base = (long long)b * num_chunks;
    // every CTA of the row merges the C chunk maxima itself (C^2 small reads per row) instead of a launch
    float max_logit = NEG_INF;
    for (int i = threadIdx.x; i < num_chunks; i += CHUNK_THREADS)
        max_logit = fmaxf(max_logit, part_max[base + i]);
    const RowSetup r = row_setup(temperature, min_p, thr, block_max(max_logit), b);
    const float* row = logits + (long long)b * vocab;
    u64 mass = 0;
    float s = 0.0f;
    const int end = min(vocab, (c + 1) * CHUNK);
    for (int v = c * CHUNK + threadIdx.x; v < end; v += CHUNK_THREADS) {
        u64 w;
        s += kept_mass(row[v], r, w);
        mass += w;
    }
    s = block_sum(s);
    mass = block_sum_u64(mass);
    if (threadIdx.x == 0) {
        part_mass[base + c] = mass;
        part_sum[base + c] = s;
    }
}

// Warp-wide: the first chunk whose cumulative mass exceeds *target, which becomes the offset within it.
__device__ __forceinline__ int find_chunk(const u64* mass, int num_chunks, u64* target) {
    const int lane = threadIdx.x % 32;
    u64 before = 0;  // mass of the chunks before this group of 32
    for (int c0 = 0; c0 < num_chunks; c0 += 32) {
        const u64 own = c0 + lane < num_chunks ? mass[c0 + lane] : 0ull;
        const u64 inclusive = warp_inclusive_sum_u64(own);
        const unsigned int hit = __ballot_sync(0xffffffffu, before + inclusive > *target);
        if (hit) {
            const int first = __ffs(hit) - 1;
            *target -= before + __shfl_sync(0xffffffffu, inclusive - own, first);
            return c0 + first;
        }
        before += __shfl_sync(0xffffffffu, inclusive, 31);
    }
    return -1;  // not reached: the caller's target is below the total
}

extern "C" __global__ void __launch_bounds__(FINAL_THREADS) sample_finalize(
        const float* __restrict__ logits, const float* __restrict__ temperature,
        const float* __restrict__ min_p, const unsigned int* __restrict__ thr, const u64* __restrict__ seeds,
        const long long* __restrict__ counters, const float* __restrict__ part_max,
        const int* __restrict__ part_index, const u64* __restrict__ part_mass,
        const float* __restrict__ part_sum, int* __restrict__ tokens, float* __restrict__ logprobs,
        int vocab, int num_chunks) {
    const int b = blockIdx.x, lane = threadIdx.x % 32;
    const long long base = (long long)b * num_chunks;
    const float* row = logits + (long long)b * vocab;
    __shared__ float row_max_logit, row_lse;
    __shared__ int chosen_chunk;  // -1: no draw (greedy row, or total 0)
    __shared__ u64 chunk_target;
    if (threadIdx.x < 32) {
        Candidate best = {NEG_INF, 0x7fffffff};
        float s = 0.0f;
        u64 total = 0;
        for (int c = lane; c < num_chunks; c += 32) {
            best = better(best, {part_max[base + c], part_index[base + c]});
            s += part_sum[base + c];
            total += part_mass[base + c];
        }
        best = warp_best(best);
        s = warp_sum(s);
        total = warp_sum_u64(total);
        const float t = temperature[b];
        const float lse = (t == 0.0f ? best.score : best.score / t) + logf(s);
        u64 target = 0;
        int chunk = -1;
        if (t != 0.0f && total > 0) {
            // floor(r * total / 2^64) < total: a uniform 64-bit r scaled exactly, no rejection loop
            target = __umul64hi(splitmix64(seeds[b], (u64)counters[b]), total);
            chunk = find_chunk(part_mass + base, num_chunks, &target);
        }
        if (lane == 0) {
            row_max_logit = best.score;
            row_lse = lse;
            chosen_chunk = chunk;
            chunk_target = target;
            if (chunk < 0) {  // greedy: the argmax (token 0 in a row of NaN); total 0: token 0, logprob NaN
                const int token = t == 0.0f && best.index < vocab ? best.index : 0;
                tokens[b] = token;
                logprobs[b] = (t == 0.0f ? row[token] : row[token] / t) - lse;
            }
        }
    }
    __syncthreads();
    if (chosen_chunk < 0) return;  // block-uniform
    const RowSetup r = row_setup(temperature, min_p, thr, row_max_logit, b);
    const int first = chosen_chunk * CHUNK + threadIdx.x * PER_THREAD;
    u64 mass[PER_THREAD];
    u64 local = 0;
#pragma unroll
    for (int i = 0; i < PER_THREAD; ++i) {
        mass[i] = 0;
        if (first + i < vocab) kept_mass(row[first + i], r, mass[i]);
        local += mass[i];
    }
    // exactly one thread holds the target: the chunk's masses are sample_chunk_mass's, summed exactly
    const u64 before = block_exclusive_sum_u64(local);
    const u64 target = chunk_target;
    if (target < before || target - before >= local) return;
    u64 running = before;
    int token = first;
#pragma unroll
    for (int i = 0; i < PER_THREAD; ++i) {
        running += mass[i];
        if (running > target) {
            token = first + i;
            break;
        }
    }
    tokens[b] = token;
    logprobs[b] = row[token] / r.t - row_lse;
}
