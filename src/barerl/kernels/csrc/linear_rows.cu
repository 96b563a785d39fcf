// linear_rows: y = x @ w.T (+ bias + residual) for a decode step's few rows (M <= 64), one launch.
// Dtypes: __nv_bfloat16 __half
//
// Why: with 64 rows a product is a stream of the weight (N x K) past 64 activation rows that L2 holds; cuBLAS
//      gives such shapes few CTAs (or a split-K that needs a second kernel to sum the parts). Here the K
//      range is split across CTAs so that every SM streams weight tiles; each CTA writes its fp32 part and
//      the last CTA of each column tile to finish (a counter) sums the parts in split order, adds bias and
//      residual and rounds once: deterministic, no second kernel.
//
// Math:    out[m, n] = bias[n] + residual[m, n] + sum_s sum_{k in part s} x[m, k] w[n, k]
// Shapes:  x (M, K) DTYPE, rows ld_x apart; w (N, K) DTYPE, rows ld_w apart; out and residual (M, N) DTYPE
//          dense; bias (N,) DTYPE; bias / residual may be null. M <= 64, N % 64 == 0, K % (64 splits) == 0,
//          rows 16-byte aligned. parts (splits, M, N) fp32 scratch (unused with one split); counters
//          (N / 64,) int32: zero before the launch, and the launch leaves them zero.
// Launch:  grid (N / 64, splits), 128 threads (4 warps), dynamic shared memory STAGES x 2 x 64 x LD x 2 bytes.
//          Warp w computes the 64 rows x columns 16 w .. 16 w + 15 of the CTA's tile with mma.sync m16n8k16
//          (x: A operand, w's rows: B operand, as Q and K in flash_attention.cu); K tiles of 64 stream through
//          a STAGES-deep cp.async ring.
#include "mma.cuh"

constexpr int BM = 64, BN = 64, BK = 64, THREADS = 128, STAGES = 4;
constexpr int LD = BK + 8;  // shared-memory row pitch: 16 bytes of padding keeps ldmatrix conflict-free
constexpr int TILE = BM * LD;  // elements of one x or w tile in shared memory (BM == BN)
constexpr unsigned EL_BYTES = sizeof(scalar_t);

// One K tile: rows [0, rows) of x and the CTA's BN rows of w, columns k0 .. k0 + BK, into one ring stage.
__device__ __forceinline__ void load_stage(scalar_t* sx, scalar_t* sw, const scalar_t* x, long long ld_x,
                                           const scalar_t* w, long long ld_w, int rows, int k0) {
    constexpr int CHUNKS = BK / 8;  // 16-byte chunks per tile row
    for (int c = threadIdx.x; c < BM * CHUNKS; c += THREADS) {
        const int r = c / CHUNKS, col = (c % CHUNKS) * 8;
        const bool valid = r < rows;  // rows past M are zeros: their products are zeros
        cp_async16(sx + r * LD + col, x + (valid ? r * ld_x : 0) + k0 + col, valid ? 16 : 0);
        cp_async16(sw + r * LD + col, w + r * ld_w + k0 + col, 16);
    }
}

__device__ __forceinline__ float epilogue(float v, const scalar_t* bias, const scalar_t* residual, int m, int n,
                                          int cols) {
    if (bias != nullptr) v += to_float(bias[n]);
    if (residual != nullptr) v += to_float(residual[(long long)m * cols + n]);
    return v;
}

extern "C" __global__ void __launch_bounds__(THREADS) linear_rows(
    scalar_t* __restrict__ out, const scalar_t* __restrict__ x, const scalar_t* __restrict__ w,
    const scalar_t* __restrict__ bias, const scalar_t* __restrict__ residual, float* __restrict__ parts,
    int* __restrict__ counters, int rows, int cols, int k_per_split, long long ld_x, long long ld_w) {
    extern __shared__ __align__(16) unsigned char smem[];
    scalar_t* sx = reinterpret_cast<scalar_t*>(smem);  // STAGES x tiles
    scalar_t* sw = sx + STAGES * TILE;
    const int tile = blockIdx.x, splits = gridDim.y, n0 = tile * BN, k_begin = blockIdx.y * k_per_split;
    const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31, g = lane >> 2, t = lane & 3;
    const scalar_t* wt = w + (long long)n0 * ld_w;
    const int num_k = k_per_split / BK;

#pragma unroll
    for (int s = 0; s < STAGES - 1; ++s) {
        if (s < num_k) load_stage(sx + s * TILE, sw + s * TILE, x, ld_x, wt, ld_w, rows, k_begin + s * BK);
        cp_async_commit();
    }
    float c[BM / 16][2][4];
#pragma unroll
    for (int m = 0; m < BM / 16; ++m)
#pragma unroll
        for (int j = 0; j < 2; ++j) c[m][j][0] = c[m][j][1] = c[m][j][2] = c[m][j][3] = 0.0f;
    const unsigned x_lane = lane_offset_a(lane, LD), w_lane = warp * 16 * LD * EL_BYTES + lane_offset_b(lane, LD);

    for (int i = 0; i < num_k; ++i) {
        cp_async_wait<STAGES - 2>();
        __syncthreads();  // stage i landed for every thread; stage i - 1 is no longer read by anyone
        const int next = i + STAGES - 1;
        if (next < num_k) {
            const int s = next % STAGES;
            load_stage(sx + s * TILE, sw + s * TILE, x, ld_x, wt, ld_w, rows, k_begin + next * BK);
        }
        cp_async_commit();
        const unsigned x_base = smem_addr(sx + (i % STAGES) * TILE) + x_lane;
        const unsigned w_base = smem_addr(sw + (i % STAGES) * TILE) + w_lane;
#pragma unroll
        for (int kk = 0; kk < BK / 16; ++kk) {
            unsigned b[4];
            ldsm_x4(b, w_base + kk * 16 * EL_BYTES);
#pragma unroll
            for (int m = 0; m < BM / 16; ++m) {
                unsigned a[4];
                ldsm_x4(a, x_base + m * 16 * LD * EL_BYTES + kk * 16 * EL_BYTES);
                mma(c[m][0], a, b, scalar_t());
                mma(c[m][1], a, b + 2, scalar_t());
            }
        }
    }
    cp_async_wait<0>();

    // This thread's values, in pairs: rows 16 m + g (+ 8), columns n0 + 16 warp + 8 j + 2 t (and + 1).
    auto for_each_pair = [&](auto body) {
#pragma unroll
        for (int m = 0; m < BM / 16; ++m)
#pragma unroll
            for (int j = 0; j < 2; ++j)
#pragma unroll
                for (int h = 0; h < 2; ++h) {
                    const int row = 16 * m + g + 8 * h, col = n0 + 16 * warp + 8 * j + 2 * t;
                    if (row < rows) body(row, col, c[m][j][2 * h], c[m][j][2 * h + 1]);
                }
    };
    if (splits == 1) {
        for_each_pair([&](int row, int col, float a, float b) {
            scalar_t* dst = out + (long long)row * cols + col;
            dst[0] = from_float<scalar_t>(epilogue(a, bias, residual, row, col, cols));
            dst[1] = from_float<scalar_t>(epilogue(b, bias, residual, row, col + 1, cols));
        });
        return;
    }
    float* part = parts + (long long)blockIdx.y * rows * cols;
    for_each_pair([&](int row, int col, float a, float b) {
        *reinterpret_cast<float2*>(part + (long long)row * cols + col) = make_float2(a, b);
    });
    // The last CTA of this column tile to arrive finishes it (the CUDA samples' threadfence reduction).
    __shared__ bool last;
    __threadfence();
    __syncthreads();
    if (threadIdx.x == 0) last = atomicAdd(counters + tile, 1) == splits - 1;
    __syncthreads();
    if (!last) return;
    __threadfence();
    for (int e = threadIdx.x; e < rows * BN; e += THREADS) {
        const int row = e / BN, col = n0 + e % BN;
        const long long i = (long long)row * cols + col;
        float v = 0.0f;
        for (int s = 0; s < splits; ++s) v += __ldcg(parts + s * (long long)rows * cols + i);  // in split order
        out[i] = from_float<scalar_t>(epilogue(v, bias, residual, row, col, cols));
    }
    if (threadIdx.x == 0) counters[tile] = 0;  // zero again for the next launch
}
