// gate_up_swiglu: a = swiglu(x @ w_gate_up.T) for a decode step's few rows (<= 64), in one launch whose every
// byte (x and the CTA's weight rows) is requested at its start.
// Dtypes: __nv_bfloat16 __half
//
// Why: in a G1 step the gate_up product (cuBLASLt) and swiglu take 5.8 + 2.3 us per layer for 12.6 MB of
//      weight. With each CTA's loads all in flight at once, one CTA per SM, 128 CTAs moved the MLP's 18.9 MB
//      of weights and their x in 6.3 us (bench/RESULTS.md, session 13); the product's output needs no second
//      launch to become the activation.
//
// Math:    g|u = x @ w_gate_up.T in fp32, each rounded to DTYPE (the product's output rounding); then
//          a = g * sigmoid(g) * u in fp32, rounded to DTYPE: swiglu_forward's numbers.
// Layout:  CTA b owns features [FT b, FT (b + 1)) (FT = 24 for Qwen3-0.6B): its tile holds their gate and up
//          weight rows interleaved by 8 (gate 0-7, up 0-7, gate 8-15, ...) so that a thread's accumulators
//          of gate tile j and up tile j are the same (row, feature). Warps 0-3 load and multiply the first half
//          of K, warps 4-7 the second (each group waits for its own copies only); warp w takes rows
//          16 (w % 4) .. + 15. The second group's fp32 sums go through shared memory to the first, which adds
//          them (half 0 + half 1), applies SwiGLU and stores. Tiles are XOR-swizzled by row % 8.
// Shapes:  x (M, HIDDEN), w_gate_up (2 INTER, HIDDEN) = [gate rows | up rows], a (M, INTER): dense rows, DTYPE.
// Launch:  grid (INTER / FT,), 256 threads, dynamic shared memory SMEM_BYTES (the launcher raises the limit).
// Macros:  HIDDEN (% 128 == 0), FT (% 8 == 0); the launcher checks that SMEM_BYTES fits.
#include "mma.cuh"

#ifndef HIDDEN
#define HIDDEN 1024
#endif
#ifndef FT
#define FT 24
#endif
constexpr int THREADS = 256, GROUP_THREADS = 128, ROWS = 64;
constexpr int K_HALF = HIDDEN / 2, W_ROWS = 2 * FT, TILES = W_ROWS / 8;
constexpr int ROW_BYTES = K_HALF * 2;  // a tile row: one half of K
constexpr int X_BYTES = ROWS * ROW_BYTES, W_BYTES = W_ROWS * ROW_BYTES;
constexpr int SMEM_BYTES = 2 * (X_BYTES + W_BYTES);  // per half of K: x rows, then weight rows
constexpr int PART_LD = W_ROWS + 4;                   // the second half's fp32 sums, over its x rows
// HIDDEN % 128: a tile row (half of K) is whole groups of 8 units, which the swizzle permutes within
static_assert(HIDDEN % 128 == 0 && FT % 8 == 0, "gate_up_swiglu: HIDDEN % 128 and FT % 8 must be 0");
static_assert(ROWS * PART_LD * 4 <= X_BYTES, "gate_up_swiglu: the second half's sums fit its x tile");
static_assert(SMEM_BYTES <= 227 * 1024, "gate_up_swiglu: the tiles exceed an SM's shared memory");

__device__ __forceinline__ unsigned swizzled(int row, int unit) {
    return row * ROW_BYTES + ((unit ^ (row & 7)) << 4);
}

// bar.sync on a named barrier for the 128 threads of one warp group (id 1 + group; 0 is __syncthreads').
__device__ __forceinline__ void group_sync(int group) {
    if (group == 0)
        asm volatile("bar.sync 1, %0;\n" ::"n"(GROUP_THREADS) : "memory");
    else
        asm volatile("bar.sync 2, %0;\n" ::"n"(GROUP_THREADS) : "memory");
}

__device__ __forceinline__ float rounded(float v) { return to_float(from_float<scalar_t>(v)); }
__device__ __forceinline__ float sigmoid(float g) { return 1.0f / (1.0f + __expf(-g)); }  // swiglu.cu's

extern "C" __global__ void __launch_bounds__(THREADS, 1) gate_up_swiglu(
        scalar_t* __restrict__ a, const scalar_t* __restrict__ x, const scalar_t* __restrict__ w_gate_up,
        int rows, int inter) {
    extern __shared__ __align__(128) unsigned char smem[];
    const int group = threadIdx.x / GROUP_THREADS, tid = threadIdx.x % GROUP_THREADS;
    const int f0 = blockIdx.x * FT, k0 = group * K_HALF;
    unsigned char* x_tile = smem + group * (X_BYTES + W_BYTES);
    unsigned char* w_tile = x_tile + X_BYTES;

    // This group's half of K, row after row: x (rows past `rows` zero-filled), then the weight rows.
    constexpr int UNITS = K_HALF / 8;
    for (int i = tid; i < ROWS * UNITS; i += GROUP_THREADS) {
        const int m = i / UNITS, unit = i % UNITS;
        const bool live = m < rows;
        cp_async16(x_tile + swizzled(m, unit), x + (long long)(live ? m : 0) * HIDDEN + k0 + unit * 8, live ? 16 : 0);
    }
    for (int i = tid; i < W_ROWS * UNITS; i += GROUP_THREADS) {
        const int j = i / UNITS, unit = i % UNITS;  // tile row j: 8-row block j / 8, gate if even, up if odd
        const int feature = f0 + 8 * (j / 16) + j % 8, weight_row = (j / 8) % 2 ? inter + feature : feature;
        cp_async16(w_tile + swizzled(j, unit), w_gate_up + (long long)weight_row * HIDDEN + k0 + unit * 8, 16);
    }
    cp_async_commit();
    cp_async_wait<0>();
    group_sync(group);

    const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31, mt = warp % 4, swz = lane & 7;
    const unsigned a_row = smem_addr(x_tile) + (16 * mt + (lane & 7) + 8 * ((lane >> 3) & 1)) * ROW_BYTES;
    const unsigned b_row = smem_addr(w_tile) + ((lane & 7) + 8 * (lane >> 4)) * ROW_BYTES;
    float acc[TILES][4] = {};
#pragma unroll 4
    for (int ks = 0; ks < K_HALF / 16; ++ks) {
        unsigned frag_a[4];
        ldsm_x4(frag_a, a_row + (((2 * ks + (lane >> 4)) ^ swz) << 4));
#pragma unroll
        for (int p = 0; p < TILES / 2; ++p) {
            unsigned frag_b[4];
            ldsm_x4(frag_b, b_row + p * 16 * ROW_BYTES + (((2 * ks + ((lane >> 3) & 1)) ^ swz) << 4));
            mma(acc[2 * p], frag_a, frag_b, scalar_t());
            mma(acc[2 * p + 1], frag_a, frag_b + 2, scalar_t());
        }
    }

    // The second half's sums, into its own x tile (only its warps read that tile), then to the first half.
    const int g8 = lane >> 2, t4 = lane & 3;
    float* part = reinterpret_cast<float*>(smem + X_BYTES + W_BYTES);
    if (group == 1) {
        group_sync(1);  // every warp of the group is done with its x tile
#pragma unroll
        for (int j = 0; j < TILES; ++j)
#pragma unroll
            for (int h = 0; h < 2; ++h)
                *reinterpret_cast<float2*>(part + (16 * mt + g8 + 8 * h) * PART_LD + 8 * j + 2 * t4) =
                    make_float2(acc[j][2 * h], acc[j][2 * h + 1]);
    }
    __syncthreads();
    if (group == 1) return;
    // tile pair p: gate (2p) and up (2p + 1) of features f0 + 8p + 2 t4 (+1), rows g8 and g8 + 8
#pragma unroll
    for (int p = 0; p < TILES / 2; ++p)
#pragma unroll
        for (int h = 0; h < 2; ++h) {
            const int m = 16 * mt + g8 + 8 * h;
            const float2 g_half = *reinterpret_cast<const float2*>(part + m * PART_LD + 16 * p + 2 * t4);
            const float2 u_half = *reinterpret_cast<const float2*>(part + m * PART_LD + 16 * p + 8 + 2 * t4);
            const float g0 = rounded(acc[2 * p][2 * h] + g_half.x), g1 = rounded(acc[2 * p][2 * h + 1] + g_half.y);
            const float u0 = rounded(acc[2 * p + 1][2 * h] + u_half.x);
            const float u1 = rounded(acc[2 * p + 1][2 * h + 1] + u_half.y);
            if (m < rows)
                *reinterpret_cast<unsigned*>(a + (long long)m * inter + f0 + 8 * p + 2 * t4) =
                    pack2(g0 * sigmoid(g0) * u0, g1 * sigmoid(g1) * u1, scalar_t());
        }
}
