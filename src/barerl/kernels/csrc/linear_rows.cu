// linear_rows: y = x @ w.T (+ bias + residual) for a decode step's few rows (M <= 64), one launch.
// Dtypes: __nv_bfloat16 __half
// Also built with: SPLITS=3 SPLITS=8
//
// Why: with 64 rows a product is a stream of the weight (N x K) past 64 activation rows that L2 holds; cuBLAS
//      gives such shapes few CTAs (or a split-K that needs a second kernel to sum the parts). Here the K
//      range is split across the SPLITS CTAs of a thread-block cluster (sm_90), so that every SM streams
//      weight tiles. Each CTA leaves its fp32 part of the 64 x 64 output tile in its shared memory; after a
//      cluster barrier CTA r sums every CTA's part of a 1 / SPLITS slice of the tile through distributed
//      shared memory, in split order, adds bias and residual and rounds once: deterministic, no scratch in
//      global memory, no second kernel. (A first version let the last CTA to finish sum parts from global
//      memory: that serial tail made a 64-row product 4x slower than cuBLAS on the H200.)
//
// Math:    out[m, n] = bias[n] + residual[m, n] + sum_s sum_{k in part s} x[m, k] w[n, k]
// Shapes:  x (M, K) DTYPE, rows ld_x apart; w (N, K) DTYPE, rows ld_w apart; out and residual (M, N) DTYPE
//          dense; bias (N,) DTYPE; bias / residual may be null. M <= 64, N % 64 == 0, K % (64 SPLITS) == 0,
//          rows 16-byte aligned. SPLITS (compile time, 1..8) > 1 needs sm_90 (clusters).
// Launch:  grid (N / 64, SPLITS), cluster (1, SPLITS) (compile time), 128 threads (4 warps), dynamic shared
//          memory STAGES x 2 x 64 x LD x 2 bytes. Warp w computes the 64 rows x columns 16 w .. 16 w + 15 of
//          the CTA's tile with mma.sync m16n8k16 (x: A operand, w's rows: B operand, as Q and K in
//          flash_attention.cu); K tiles of 64 stream through a STAGES-deep cp.async ring.
#include "mma.cuh"

#ifndef SPLITS
#define SPLITS 1
#endif
constexpr int BM = 64, BN = 64, BK = 64, THREADS = 128, STAGES = 4;
constexpr int LD = BK + 8;  // shared-memory row pitch: 16 bytes of padding keeps ldmatrix conflict-free
constexpr int TILE = BM * LD;  // elements of one x or w tile in shared memory (BM == BN)
constexpr int PART_LD = BN + 4;  // fp32 pitch of the part tile (float4 rows stay 16-byte aligned)
constexpr unsigned EL_BYTES = sizeof(scalar_t);
static_assert(BM * PART_LD * 4 <= STAGES * 2 * TILE * (int)EL_BYTES, "the part tile reuses the ring");

#if SPLITS > 1 && __CUDA_ARCH__ >= 900
#define CLUSTER_DIMS __cluster_dims__(1, SPLITS, 1)
#else
#define CLUSTER_DIMS
#endif

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

#if SPLITS > 1
// Every CTA of the cluster has arrived (its shared-memory writes visible to the others) before any goes on.
__device__ __forceinline__ void cluster_sync() {
#if __CUDA_ARCH__ >= 900
    asm volatile("barrier.cluster.arrive.release.aligned;\nbarrier.cluster.wait.acquire.aligned;\n" ::: "memory");
#else
    __trap();  // clusters need sm_90: the launcher never picks SPLITS > 1 below it
#endif
}

// Four fp32 at a shared-memory address of the cluster's CTA `rank` (the same offset as in this CTA).
__device__ __forceinline__ float4 load_remote4(unsigned local_addr, int rank) {
    float4 v = make_float4(0.0f, 0.0f, 0.0f, 0.0f);
#if __CUDA_ARCH__ >= 900
    unsigned remote;
    asm volatile("mapa.shared::cluster.u32 %0, %1, %2;\n" : "=r"(remote) : "r"(local_addr), "r"(rank));
    asm volatile("ld.shared::cluster.v4.f32 {%0, %1, %2, %3}, [%4];\n"
                 : "=f"(v.x), "=f"(v.y), "=f"(v.z), "=f"(v.w) : "r"(remote) : "memory");
#endif
    return v;
}
#endif

extern "C" __global__ void CLUSTER_DIMS __launch_bounds__(THREADS) linear_rows(
    scalar_t* __restrict__ out, const scalar_t* __restrict__ x, const scalar_t* __restrict__ w,
    const scalar_t* __restrict__ bias, const scalar_t* __restrict__ residual, int rows, int cols,
    int k_per_split, long long ld_x, long long ld_w) {
    extern __shared__ __align__(16) unsigned char smem[];
    scalar_t* sx = reinterpret_cast<scalar_t*>(smem);  // STAGES x tiles
    scalar_t* sw = sx + STAGES * TILE;
    const int n0 = blockIdx.x * BN, k_begin = blockIdx.y * k_per_split;
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

    // This thread's values, in pairs: rows 16 m + g (+ 8), tile columns 16 warp + 8 j + 2 t (and + 1).
    auto for_each_pair = [&](auto body) {
#pragma unroll
        for (int m = 0; m < BM / 16; ++m)
#pragma unroll
            for (int j = 0; j < 2; ++j)
#pragma unroll
                for (int h = 0; h < 2; ++h) {
                    const int row = 16 * m + g + 8 * h, col = 16 * warp + 8 * j + 2 * t;
                    if (row < rows) body(row, col, c[m][j][2 * h], c[m][j][2 * h + 1]);
                }
    };
#if SPLITS == 1
    for_each_pair([&](int row, int col, float a, float b) {
        scalar_t* dst = out + (long long)row * cols + n0 + col;
        dst[0] = from_float<scalar_t>(epilogue(a, bias, residual, row, n0 + col, cols));
        dst[1] = from_float<scalar_t>(epilogue(b, bias, residual, row, n0 + col + 1, cols));
    });
#else
    __syncthreads();  // every warp is done with the ring: the part tile takes its place
    float* part = reinterpret_cast<float*>(smem);
    for_each_pair([&](int row, int col, float a, float b) {
        *reinterpret_cast<float2*>(part + row * PART_LD + col) = make_float2(a, b);
    });
    cluster_sync();
    // CTA `rank` of the cluster finishes every SPLITS-th float4 of the tile, summing the parts in split order.
    const int rank = blockIdx.y;  // the cluster spans the grid's y extent: rank == blockIdx.y
    constexpr int VECS = BM * BN / 4;
    for (int v = rank * THREADS + threadIdx.x; v < VECS; v += SPLITS * THREADS) {
        const int row = v / (BN / 4), col = (v % (BN / 4)) * 4;
        if (row >= rows) continue;
        const unsigned addr = smem_addr(part + row * PART_LD + col);
        float4 parts[SPLITS];
#pragma unroll
        for (int s = 0; s < SPLITS; ++s) parts[s] = load_remote4(addr, s);
        float sum[4] = {parts[0].x, parts[0].y, parts[0].z, parts[0].w};
#pragma unroll
        for (int s = 1; s < SPLITS; ++s) {
            sum[0] += parts[s].x;
            sum[1] += parts[s].y;
            sum[2] += parts[s].z;
            sum[3] += parts[s].w;
        }
        scalar_t* dst = out + (long long)row * cols + n0 + col;
#pragma unroll
        for (int e = 0; e < 4; ++e) dst[e] = from_float<scalar_t>(epilogue(sum[e], bias, residual, row, n0 + col + e, cols));
    }
    cluster_sync();  // no CTA leaves (freeing its shared memory) while another still reads its part
#endif
}
