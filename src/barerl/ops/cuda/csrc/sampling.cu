// sample: one token per row of fp32 logits, with temperature, top-k, top-p, min-p, a counter-based hash as
// Reference twin: ops/ref/sampling.py (sample).
// Launchers: ops/cuda/sampling.py; tests: tests/ops/test_sampling.py.
// the random source, and the log-prob of the sampled token. The contract is ops/ref/sampling.py's
// `sample`: inverse-CDF sampling over exact fixed-point masses with one random draw per row,
//   z = logits / T;  m = max z;  p_v = expf(z_v - m) for kept v;  mass_v = rint(p_v * 2^42) (u64);
//   target = floor(splitmix64(seed, counter) * total / 2^64) < total;
//   token = the first v with mass_0 + ... + mass_v > target;  logprob = z_token - (m + log(sum of p_v)).
// Why: the former Gumbel-max drew a 64-bit hash and took two logs per vocabulary element; here an element
// costs a load, an IEEE division (none at T = 1), one expf, a float -> u64 conversion and a few compares and
// adds (~40 instructions in sample_chunk_mass, ~8 in sample_chunk_max), so the sampler runs near the speed
// of reading the logits twice. Why fixed point: integer sums are exact in any order, so the chunks and trees
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
// Truncation threshold thr: the smallest kept key (keys: order-preserving uint32 images of z); 0, keep all,
// in rows with T = 0 or neither top-k nor top-p. top-k: thr_k = the k-th largest key. top-p over the top-k
// set: w_v = floor(expf(z_v - m) * 2^42) for keys >= thr_k, W = sum, target = max(ceil(top_p * W), 1) in
// double, thr = the largest key K with sum(w, keys >= K) >= target (0 if W = 0): the reference's top-p set
// in its own fixed point (the most probable tokens down to the first whose running mass reaches the target,
// ties kept). min-p is no threshold: the mass passes test the reference's own p_v >= min_p. Both are radix selects over digits of 11, 11 and 10 key bits: a digit is
// the bin where the histogram's running total from the top first reaches the target, which then loses the
// bins above. Why this layout: one CTA per row ran every digit over the whole row (1.2 ms for 64 rows on 64
// SMs). Here C CTAs per row add shared-memory histograms to the row's global one and the last to finish (an
// arrival count) picks the digit, so digits need no launches of their own; rows are read whole only where
// nothing smaller holds the answer, and each select's last digit, left with few tokens, is one CTA's sweep
// over the row's candidate list (keys). Top-k reads the row once, in sample_chunk_max: a chunk holds k tokens
// from its own k-th largest first digit b_c up, so the row's digit is >= every b_c and only the chunk's
// tokens from b_c up (~k, plus a bin) join the candidates and the row's histogram. Top-p alone reads the row
// twice more (its first digit needs m, its second the first). Shared-memory masses are two u32 words, the
// low one's carry counted by the atomic that wraps it (a u64 shared atomic is a CAS loop); sums in any order
// are exact, so thr has the same bits as the former one-CTA select's, whatever the order of the CTAs.
//
// Five launches after the launcher's memset of the select scratch (graph-capturable: every shape depends
// only on (B, V), no host sync, per-row settings read on the device):
// 1. sample_chunk_max, grid (C, B), 256 threads: chunk c of row b (CHUNK tokens): the max raw logit and its
//    lowest index. max(logits) / T is the row's max z (division by T > 0 is monotone, rounding included),
//    which is also the max over the kept set; greedy rows take the index as their token. Top-k rows: the
//    first count digit; rows that do not select: thr = 0.
// 2, 3. sample_select passes 1 and 2, grid (G, B), 256 threads, G <= C set by the launcher so that the
//    whole grid is about one wave (most of its CTAs return at once: rows with nothing to do, and all but
//    ceil(candidates / CHUNK) of a top-k row's); CTA c takes chunks, or CHUNK candidates, c, c + G, ... Pass 1: top-k's second digit, then the last
//    CTA sweeps its third (thr_k; thr without top-p) and top-p's first over the top-k set; top-p alone: its
//    first digit over the whole row. Pass 2, top-p: the second digit (over the candidates, or the whole row,
//    whose tokens inside the first digit become the candidates), then the last CTA sweeps the third: thr.
// 4. sample_chunk_mass, grid (C, B), 256 threads: m from the row's C chunk maxima, then over the chunk's
//    kept tokens the u64 sum of mass_v and the fp32 sum of p_v. Greedy rows run with T = 1 and keep all,
//    which gives log_softmax's sum.
// 5. sample_finalize, grid (B,), 256 threads. Warp 0 merges the row's chunk partials (greedy token, sum of
//    p, total mass), draws the target (__umul64hi) and finds the chunk whose mass range holds it. The CTA
//    then recomputes that one chunk's masses, 16 consecutive tokens per thread; an exclusive block scan of the
//    per-thread sums finds the one thread whose range holds the rest of the target, and it walks its tokens
//    to the first whose running mass exceeds it and writes the token and log-prob.
// Shapes:  logits (B, V) fp32 dense; temperature (>= 0), top_p, min_p (B,) fp32; top_k (B,) int32 (<= 0,
//          >= V: off); seeds (B,) uint64; counters (B,) int64; thr (B,) uint32; part_max, part_sum (B, C)
//          fp32, part_index (B, C) int32 and part_mass (B, C) uint64 scratch, C = ceil(V / CHUNK), every
//          entry written before it is read; candidate lists cand (B, V) uint32 scratch (keys, at most V a
//          row); row_hists (B, BINS) uint64 and rows (B,) RowSelect scratch, zeroed by the caller (the
//          kernels leave row_hists zeroed again); tokens (B,) int32; logprobs (B,) fp32.
#include "common.cuh"

constexpr int CHUNK_THREADS = 256;                 // sample_chunk_max / sample_select / sample_chunk_mass
constexpr int CHUNK = 4096;                        // tokens per chunk CTA
constexpr int CHUNK_PER_THREAD = CHUNK / CHUNK_THREADS;
constexpr int FINAL_THREADS = 256;
constexpr int PER_THREAD = CHUNK / FINAL_THREADS;  // consecutive tokens per sample_finalize thread
constexpr double MASS_SCALE = 4398046511104.0;     // 2^42: fixed-point mass, exact sums for V < 2^21
constexpr int BINS = 2048;                         // radix digits of 11, 11 and 10 key bits, highest first
constexpr int BINS_PER_THREAD = BINS / CHUNK_THREADS;

// A row's select between launches; all zero (the launcher's memset) is "nothing chosen, no candidates".
struct RowSelect {
    u64 target;                   // weight still to reach inside prefix: tokens, or fixed-point mass
    unsigned int prefix;          // the digits the current select has chosen
    unsigned int floor_key;       // top-p's lowest key: the top-k threshold (0 without top-k)
    unsigned int num_candidates;  // keys in the row's candidate list
    unsigned int arrived;         // the row's CTAs done with the current launch
};
static_assert(sizeof(RowSelect) == 24, "the launcher allocates 3 u64 per row");

__device__ __forceinline__ unsigned int order_key(float z) {
    const unsigned int bits = __float_as_uint(z == 0.0f ? 0.0f : z);  // -0 and +0 compare equal: one key
    return (bits & 0x80000000u) ? ~bits : (bits | 0x80000000u);
}

// z from its key, exactly (-0 comes back as +0, which gives the same expf(z - m)).
__device__ __forceinline__ float key_value(unsigned int key) {
    return __uint_as_float((key & 0x80000000u) ? key & 0x7fffffffu : ~key);
}

__device__ __forceinline__ bool has_top_k(int top_k, int vocab) { return top_k > 0 && top_k < vocab; }

// The threshold's weight floor(expf(z - m) * 2^42): it truncates where the token's mass rounds, as the former
// (u64)((double)p * 2^42) did; the same number, since p * 2^42 is exact in fp32. NaN weighs 0.
__device__ __forceinline__ u64 select_weight(float z, float m) {
    return __float2ull_rz(expf(z - m) * (float)MASS_SCALE);
}

// ceil(top_p * total) in double, at least 1: the former kernel's target, bit for bit.
__device__ __forceinline__ u64 top_p_target(float top_p, u64 total) {
    return (u64)fmax(ceil((double)top_p * (double)total), 1.0);
}

__device__ __forceinline__ u64 warp_sum_u64(u64 v) {
#pragma unroll
    for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
    return v;
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

// Sum of v over the threads before this one; *total gets the block's sum. All threads call it.
__device__ __forceinline__ u64 block_scan_u64(u64 v, u64* total) {
    __shared__ u64 warp_total[32];
    const int warp = threadIdx.x / 32;
    const u64 inclusive = warp_inclusive_sum_u64(v);
    __syncthreads();  // warp_total may still be read by a previous call
    if (threadIdx.x % 32 == 31) warp_total[warp] = inclusive;
    __syncthreads();
    u64 before = inclusive - v, all = 0;
    for (int w = 0; w < (int)blockDim.x / 32; ++w) {
        if (w < warp) before += warp_total[w];
        all += warp_total[w];
    }
    *total = all;
    return before;
}

// ------------------------------------------------------------------------------------------------------
// Radix select. A CTA of CHUNK_THREADS gathers a digit's histogram in shared memory, thread i then holds the
// bins BINS-1-8i .. BINS-8-8i (highest first) in registers: owned_bin(j).

struct BlockHist {
    unsigned int lo[BINS], hi[BINS];  // bin weight = hi * 2^32 + lo
};

// Which tokens a pass weighs: key >= floor_key with the bits under mask (those above the digit) = prefix.
struct Filter {
    unsigned int floor_key, prefix, mask;
    int shift;     // the digit of a key: (key & ~mask) >> shift
    bool by_mass;  // weigh by select_weight (else count)
    float m;       // the row's max z
};

__device__ __forceinline__ Filter digit_filter(int digit, unsigned int prefix, unsigned int floor_key,
                                               bool by_mass, float m) {
    const int shift = digit == 0 ? 21 : digit == 1 ? 10 : 0;
    const unsigned int mask = digit == 0 ? 0u : 0xffffffffu << (digit == 1 ? 21 : 10);
    return {floor_key, prefix, mask, shift, by_mass, m};
}

__device__ __forceinline__ bool inside(const Filter& f, unsigned int key) {
    return key >= f.floor_key && (key & f.mask) == f.prefix;
}

__device__ __forceinline__ int owned_bin(int j) { return BINS - 1 - BINS_PER_THREAD * threadIdx.x - j; }

__device__ __forceinline__ void zero_hist(BlockHist& h) {
    for (int i = threadIdx.x; i < BINS; i += CHUNK_THREADS) h.lo[i] = h.hi[i] = 0u;
    __syncthreads();
}

// Adds key's weight to its bin. The low word's atomicAdd returns the old value, so each wrap past 2^32 is seen
// by exactly one thread, which carries it to the high word: the sum is exact (the high word stays below
// V * 2^42 / 2^32 < 2^31).
__device__ __forceinline__ void hist_add(BlockHist& h, const Filter& f, unsigned int key) {
    const int bin = (key & ~f.mask) >> f.shift;
    const u64 w = f.by_mass ? select_weight(key_value(key), f.m) : 1ull;
    const unsigned int lo = (unsigned int)w, old = atomicAdd(&h.lo[bin], lo);
    const unsigned int up = (unsigned int)(w >> 32) + (old + lo < old ? 1u : 0u);
    if (up) atomicAdd(&h.hi[bin], up);
}

__device__ __forceinline__ void shared_bins(const BlockHist& h, u64 (&vals)[BINS_PER_THREAD]) {
#pragma unroll
    for (int j = 0; j < BINS_PER_THREAD; ++j) {
        const int bin = owned_bin(j);
        vals[j] = ((u64)h.hi[bin] << 32) + h.lo[bin];
    }
}

// The row's histogram (global), zeroed behind for the next launch: the row's last CTA only.
__device__ __forceinline__ void take_row_bins(u64* row_hist, u64 (&vals)[BINS_PER_THREAD]) {
#pragma unroll
    for (int j = 0; j < BINS_PER_THREAD; ++j) {
        const int bin = owned_bin(j);
        vals[j] = __ldcg(row_hist + bin);
        row_hist[bin] = 0ull;
    }
}

__device__ __forceinline__ u64 block_total(const u64 (&vals)[BINS_PER_THREAD]) {
    u64 local = 0, total;
    for (int j = 0; j < BINS_PER_THREAD; ++j) local += vals[j];
    block_scan_u64(local, &total);
    return total;
}

// The bin where the running total from the highest bin first reaches target (>= 1); *above = the total of
// the bins above it, < target, so the next digit's target stays >= 1. A target over the total (top-p in a
// row whose weights are all 0) gives bin 0 and the total, as the former select did. All threads call it.
__device__ int block_select(const u64 (&vals)[BINS_PER_THREAD], u64 target, u64* above) {
    __shared__ int chosen;
    __shared__ u64 chosen_above;
    u64 local = 0, total;
    for (int j = 0; j < BINS_PER_THREAD; ++j) local += vals[j];
    const u64 before = block_scan_u64(local, &total);
    // exactly one thread: the first whose bins reach the target, or the last one (bin 0) if none does
    if (before < target && (before + local >= target || threadIdx.x == CHUNK_THREADS - 1)) {
        u64 run = before;
        int bin = owned_bin(BINS_PER_THREAD - 1);
        for (int j = 0; j < BINS_PER_THREAD; ++j) {
            if (run + vals[j] >= target) {
                bin = owned_bin(j);
                break;
            }
            run += vals[j];
        }
        chosen = bin;
        chosen_above = run;
    }
    __syncthreads();
    *above = chosen_above;
    return chosen;
}

__device__ __forceinline__ void flush_hist(const BlockHist& h, u64* row_hist) {
    for (int i = threadIdx.x; i < BINS; i += CHUNK_THREADS) {
        const u64 w = ((u64)h.hi[i] << 32) + h.lo[i];
        if (w) atomicAdd(row_hist + i, w);
    }
}

// True in the row's last CTA to get here in this launch, which then sees every other CTA's histogram adds
// and candidate writes (each thread fences its own before the count), and resets the count.
__device__ bool last_to_arrive(unsigned int* arrived, int num_ctas) {
    __shared__ bool last;
    __threadfence();
    __syncthreads();
    if (threadIdx.x == 0) {
        last = atomicAdd(arrived, 1u) == (unsigned int)num_ctas - 1;
        if (last) *arrived = 0u;
        __threadfence();
    }
    __syncthreads();
    return last;
}

// Appends the keys of this thread's tokens first + i * CHUNK_THREADS flagged in bit i of `take` to the row's
// candidate list (x / t again: cheaper than holding 16 keys in registers across the scan). The order across
// CTAs is arbitrary: every use of the list is a histogram. All threads call it.
__device__ void append_candidates(const float* row, int first, float t, unsigned int take, unsigned int* cand,
                                  unsigned int* num_candidates) {
    __shared__ unsigned int base;
    u64 total;
    unsigned int at = (unsigned int)block_scan_u64(__popc(take), &total);
    if (threadIdx.x == 0 && total) base = atomicAdd(num_candidates, (unsigned int)total);
    __syncthreads();
    at += base;
    for (; take; take &= take - 1) cand[at++] = order_key(row[first + (__ffs(take) - 1) * CHUNK_THREADS] / t);
}

// Histogram of the chunk's tokens first + i * CHUNK_THREADS (< end) inside f, keys of x / t; with append,
// their keys join the candidate list.
__device__ void hist_logits(BlockHist& h, const float* row, int first, int end, float t, const Filter& f,
                            bool append, unsigned int* cand, unsigned int* num_candidates) {
    unsigned int take = 0;
#pragma unroll 4
    for (int i = 0; i < CHUNK_PER_THREAD; ++i) {
        const int v = first + i * CHUNK_THREADS;
        const unsigned int key = v < end ? order_key(row[v] / t) : 0u;
        if (v < end && inside(f, key)) {
            take |= 1u << i;
            hist_add(h, f, key);
        }
    }
    if (append) append_candidates(row, first, t, take, cand, num_candidates);
}

// Histogram of the candidates cand[lo, hi) inside f; CHUNK keys per round, loaded before they are counted.
__device__ void hist_candidates(BlockHist& h, const unsigned int* cand, unsigned int lo, unsigned int hi,
                                const Filter& f) {
    for (unsigned int i0 = lo; i0 < hi; i0 += CHUNK) {
        unsigned int keys[CHUNK_PER_THREAD];
#pragma unroll
        for (int i = 0; i < CHUNK_PER_THREAD; ++i) {
            const unsigned int at = i0 + threadIdx.x + i * CHUNK_THREADS;
            keys[i] = at < hi ? __ldcg(cand + at) : 0u;
        }
#pragma unroll
        for (int i = 0; i < CHUNK_PER_THREAD; ++i)
            if (i0 + threadIdx.x + i * CHUNK_THREADS < hi && inside(f, keys[i])) hist_add(h, f, keys[i]);
    }
}

// This CTA alone: the histogram of all n candidates inside f, into vals.
__device__ void sweep_candidates(BlockHist& h, const unsigned int* cand, unsigned int n, const Filter& f,
                                 u64 (&vals)[BINS_PER_THREAD]) {
    zero_hist(h);
    hist_candidates(h, cand, 0u, n, f);
    __syncthreads();
    shared_bins(h, vals);
}

// Top-k's first digit, for a row with T != 0 and top-k, in sample_chunk_max (which has just read the chunk,
// so x / t is recomputed from L1 rather than held in registers through the scans).
__device__ void first_count_digit(const float* row, int first, int end, float t, int k, unsigned int* cand,
                                  u64* row_hist, RowSelect* row_select) {
    __shared__ BlockHist h;
    const Filter all = digit_filter(0, 0u, 0u, false, 0.0f);
    zero_hist(h);
    for (int v = first; v < end; v += CHUNK_THREADS) hist_add(h, all, order_key(row[v] / t));
    __syncthreads();
    u64 vals[BINS_PER_THREAD], above;
    shared_bins(h, vals);
    const int low_bin = block_select(vals, (u64)k, &above);  // the chunk's k-th digit; bin 0 under k tokens
#pragma unroll
    for (int j = 0; j < BINS_PER_THREAD; ++j)
        if (owned_bin(j) >= low_bin && vals[j]) atomicAdd(row_hist + owned_bin(j), vals[j]);
    unsigned int take = 0;
    for (int i = 0; first + i * CHUNK_THREADS < end; ++i)
        if ((int)(order_key(row[first + i * CHUNK_THREADS] / t) >> 21) >= low_bin) take |= 1u << i;
    append_candidates(row, first, t, take, cand, &row_select->num_candidates);
    if (!last_to_arrive(&row_select->arrived, gridDim.x)) return;
    take_row_bins(row_hist, vals);
    const int bin = block_select(vals, (u64)k, &above);
    if (threadIdx.x == 0) {
        row_select->prefix = (unsigned int)bin << 21;
        row_select->target = (u64)k - above;
    }
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

// The row's max logit from its C chunk maxima, merged by every CTA that needs it (C^2 small reads per row)
// instead of a launch. All threads call it.
__device__ __forceinline__ float merged_max_logit(const float* row_part_max, int num_chunks) {
    float max_logit = NEG_INF;
    for (int i = threadIdx.x; i < num_chunks; i += CHUNK_THREADS) max_logit = fmaxf(max_logit, row_part_max[i]);
    return block_max(max_logit);
}

// What the mass passes need of row b. Greedy rows run with T = 1 (x / 1 = x exactly) and no min-p, so their
// sum of p is log_softmax's; sample_chunk_max gave them thr = 0 already.
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
    const float z = r.t == 1.0f ? x : x / r.t;  // the same number: x / 1 is x, and the division is costly
    const float p = expf(z - r.m);
    const bool kept = order_key(z) >= r.floor_key && (r.min_p == 0.0f || p >= r.min_p);
    mass = kept && p > 0.0f ? __float2ull_rn(p * (float)MASS_SCALE) : 0ull;
    return kept ? p : 0.0f;
}

// 8 CTAs per SM (32 registers) as before the select moved in: this is the pass that reads every row.
extern "C" __global__ void __launch_bounds__(CHUNK_THREADS, 8) sample_chunk_max(
        const float* __restrict__ logits, const float* __restrict__ temperature,
        const int* __restrict__ top_k, const float* __restrict__ top_p, float* __restrict__ part_max,
        int* __restrict__ part_index, unsigned int* __restrict__ cand, u64* __restrict__ row_hists,
        RowSelect* __restrict__ rows, unsigned int* __restrict__ thr, int vocab) {
    const int c = blockIdx.x, b = blockIdx.y;
    const float* row = logits + (long long)b * vocab;
    const int first = c * CHUNK + threadIdx.x, end = min(vocab, (c + 1) * CHUNK);
    // better() sends a tie with the initial -inf to the token, so a row of -inf only still gets index 0
    Candidate best = {NEG_INF, 0x7fffffff};
    for (int v = first; v < end; v += CHUNK_THREADS) best = better(best, {row[v], v});
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
    const float t = temperature[b];
    const int k = top_k[b];
    if (t == 0.0f || !(has_top_k(k, vocab) || top_p[b] < 1.0f)) {  // no select: keep all
        if (c == 0 && threadIdx.x == 0) thr[b] = 0u;
        return;
    }
    if (has_top_k(k, vocab))  // block-uniform
        first_count_digit(row, first, end, t, k, cand + (long long)b * vocab, row_hists + (long long)b * BINS,
                          rows + b);
}

// pass 1 or 2 of the launch list in the header, for the rows that have one.
extern "C" __global__ void __launch_bounds__(CHUNK_THREADS) sample_select(
        const float* __restrict__ logits, const float* __restrict__ temperature,
        const int* __restrict__ top_k, const float* __restrict__ top_p, const float* __restrict__ part_max,
        unsigned int* __restrict__ cand, u64* __restrict__ row_hists, RowSelect* __restrict__ rows,
        unsigned int* __restrict__ thr, int vocab, int num_chunks, int pass) {
    __shared__ BlockHist h;
    const int c = blockIdx.x, b = blockIdx.y, stride = gridDim.x;  // CTA c takes units c, c + stride, ...
    const float t = temperature[b], p = top_p[b];
    const bool has_k = has_top_k(top_k[b], vocab), has_p = p < 1.0f;
    if (t == 0.0f || !(pass == 1 ? has_k || has_p : has_p)) return;  // block-uniform
    RowSelect* row = rows + b;
    // a unit: CHUNK of a top-k row's candidates (>= 1: every chunk adds some), else a chunk of the row; CTAs
    // without a unit leave at once and the arrival count waits for the others only
    const unsigned int n = has_k ? row->num_candidates : 0u;
    const int num_units = has_k ? (int)((n + CHUNK - 1) / CHUNK) : num_chunks;
    const int num_ctas = min(stride, num_units);
    if (c >= num_ctas) return;
    u64* row_hist = row_hists + (long long)b * BINS;
    unsigned int* row_cand = cand + (long long)b * vocab;
    const float m = merged_max_logit(part_max + (long long)b * num_chunks, num_chunks) / t;
    const bool by_mass = pass == 2 || !has_k;
    const int digit = pass == 2 || has_k ? 1 : 0;
    const Filter f = digit_filter(digit, row->prefix, row->floor_key, by_mass, m);
    zero_hist(h);
    for (int u = c; u < num_units; u += stride) {
        if (has_k)
            hist_candidates(h, row_cand, u * CHUNK, min(n, (unsigned int)(u + 1) * CHUNK), f);
        else
            hist_logits(h, logits + (long long)b * vocab, u * CHUNK + threadIdx.x, min(vocab, (u + 1) * CHUNK),
                        t, f, pass == 2, row_cand, &row->num_candidates);
    }
    __syncthreads();
    flush_hist(h, row_hist);
    if (!last_to_arrive(&row->arrived, num_ctas)) return;
    u64 vals[BINS_PER_THREAD], above;
    take_row_bins(row_hist, vals);
    u64 target = by_mass && digit == 0 ? top_p_target(p, block_total(vals)) : row->target;
    const unsigned int prefix = f.prefix | (unsigned int)block_select(vals, target, &above) << f.shift;
    target -= above;
    if (digit == 0) {
        if (threadIdx.x == 0) {
            row->prefix = prefix;
            row->target = target;
        }
        return;
    }
    // the last digit by this CTA alone, over the whole candidate list: few of its keys are inside the prefix
    const unsigned int num_candidates = __ldcg(&row->num_candidates);  // top-p alone: appended just now
    sweep_candidates(h, row_cand, num_candidates, digit_filter(2, prefix, f.floor_key, by_mass, m), vals);
    const unsigned int key = prefix | (unsigned int)block_select(vals, target, &above);
    if (by_mass || !has_p) {
        if (threadIdx.x == 0) thr[b] = key;
        return;
    }
    // top-k is done and top-p follows: its first digit over the top-k set, every token of it a candidate
    sweep_candidates(h, row_cand, num_candidates, digit_filter(0, 0u, key, true, m), vals);
    target = top_p_target(p, block_total(vals));
    const int bin = block_select(vals, target, &above);
    if (threadIdx.x == 0) {
        row->floor_key = key;
        row->prefix = (unsigned int)bin << 21;
        row->target = target - above;
    }
}

extern "C" __global__ void __launch_bounds__(CHUNK_THREADS) sample_chunk_mass(
        const float* __restrict__ logits, const float* __restrict__ temperature,
        const float* __restrict__ min_p, const unsigned int* __restrict__ thr,
        const float* __restrict__ part_max, u64* __restrict__ part_mass, float* __restrict__ part_sum,
        int vocab) {
    const int c = blockIdx.x, b = blockIdx.y, num_chunks = gridDim.x;
    const long long base = (long long)b * num_chunks;
    const RowSetup r = row_setup(temperature, min_p, thr, merged_max_logit(part_max + base, num_chunks), b);
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
    u64 chunk_mass;
    block_scan_u64(mass, &chunk_mass);
    if (threadIdx.x == 0) {
        part_mass[base + c] = chunk_mass;
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
    u64 unused;
    const u64 before = block_scan_u64(local, &unused);
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
