// mlp_decode: a decode step's MLP for up to 64 rows, gate_up -> SwiGLU -> down, in one launch whose every
// weight byte is requested at its start, then a small sum of the down product's parts (mlp_decode_sum).
// Dtypes: __nv_bfloat16 __half
//
// Why: in a G1 step (64 rows, Qwen3-0.6B) the three kernels take 15.4 us per layer for 18.9 MB of weights,
//      which the HBM moves in 4.5 us: each launch waits for the one before it, then for its first weight
//      bytes. Here all of a CTA's weights (gate_up's and down's) are in flight before any product starts.
//
// Math:    g|u = x @ w_gate_up.T (fp32, rounded to DTYPE as the separate product rounds its output);
//          a = g * sigmoid(g) * u (fp32, rounded to DTYPE as swiglu_forward does); out = residual + a @ w_down.T
//          (fp32 parts, summed in a fixed order, rounded once).
// Layout:  128 CTAs in 16 clusters of 8. Cluster c owns intermediate features F = [c * FC, (c + 1) * FC),
//          FC = INTER / 16, which are the K range of its part of the down product. CTA rank r = 2 q + s
//          computes gate_up for the 2 * FT features [c * FC + 2 FT q, + 2 FT) (FT = FC / 8) over the half s
//          of HIDDEN; the pair (q, 0), (q, 1) adds its fp32 halves through distributed shared memory, CTA r
//          finishing features [c * FC + FT r, + FT) into its slot of a; after a cluster barrier every CTA
//          gathers the cluster's FC features of a and computes outputs [r * HIDDEN / 8, + HIDDEN / 8) over them:
//          part c of the down product, written as fp32 to parts[c]. mlp_decode_sum adds the 16 parts in order
//          and the residual. Tiles lie in shared memory with 16-byte units XOR-swizzled by row % 8 (conflict-
//          free ldmatrix); 8 warps of mma.sync m16n8k16, warp w on rows 16 (w % 4) .. + 15.
// Shapes:  x (M, HIDDEN), w_gate_up (2 INTER, HIDDEN) = [gate rows | up rows], w_down (HIDDEN, INTER), residual
//          and out (M, HIDDEN): dense rows, DTYPE; parts (16, M, HIDDEN) fp32 scratch. M <= 64.
// Launch:  mlp_decode: grid (128,), cluster (8, 1, 1) (compile time), 256 threads, dynamic shared memory
//          SMEM_BYTES (the launcher raises the limit). mlp_decode_sum: grid-stride over M * HIDDEN / 4.
// Macros:  HIDDEN (% 512 == 0), INTER (% 1024 == 0); the launcher checks SMEM_BYTES fits. Needs sm_90.
#include "mma.cuh"

#ifndef HIDDEN
#define HIDDEN 1024
#endif
#ifndef INTER
#define INTER 3072
#endif
constexpr int CLUSTER = 8, CLUSTERS = 16, THREADS = 256, ROWS = 64;
constexpr int FC = INTER / CLUSTERS;    // a cluster's features: the K range of its down part
constexpr int FT = FC / CLUSTER;        // features a CTA finishes
constexpr int GU_ROWS = 4 * FT;         // gate_up weight rows of a pair: 2 FT gate, then 2 FT up
constexpr int K_HALF = HIDDEN / 2;      // gate_up's K range of a CTA
constexpr int K_GROUP = K_HALF / 2;     // gate_up's loads come in two groups along K
constexpr int OUT_CTA = HIDDEN / CLUSTER;  // down outputs of a CTA
static_assert(HIDDEN % 512 == 0 && INTER % 1024 == 0, "mlp_decode: HIDDEN % 512 and INTER % 1024 must be 0");

// Shared memory: the x half, gate_up's weight rows, down's weight rows, this CTA's slot of a. After gate_up
// the x region holds the fp32 gate_up part (PART_LD columns a row) and the gate_up region the gathered a.
constexpr int X_BYTES = ROWS * K_HALF * 2, GU_BYTES = GU_ROWS * K_HALF * 2, WD_BYTES = OUT_CTA * FC * 2;
constexpr int SLOT_BYTES = ROWS * FT * 2, PART_LD = GU_ROWS + 4;
constexpr int SMEM_BYTES = X_BYTES + GU_BYTES + WD_BYTES + SLOT_BYTES;
static_assert(ROWS * PART_LD * 4 <= X_BYTES && ROWS * FC * 2 <= GU_BYTES, "mlp_decode: reused regions");
static_assert(SMEM_BYTES <= 227 * 1024, "mlp_decode: the tiles exceed an SM's shared memory (the launcher checks)");

#if __CUDA_ARCH__ >= 900
#define MLP_CLUSTER __cluster_dims__(CLUSTER, 1, 1)
#else
#define MLP_CLUSTER
#endif

__device__ __forceinline__ void cluster_arrive() {
#if __CUDA_ARCH__ >= 900
    asm volatile("barrier.cluster.arrive.release.aligned;\n" ::: "memory");
#endif
}
__device__ __forceinline__ void cluster_wait() {
#if __CUDA_ARCH__ >= 900
    asm volatile("barrier.cluster.wait.acquire.aligned;\n" ::: "memory");
#endif
}
__device__ __forceinline__ void cluster_sync() {
    cluster_arrive();
    cluster_wait();
}

// `local`'s address in CTA `rank` of this cluster (a generic pointer: plain loads read the other CTA's shared
// memory, and the compiler schedules them like any other load).
template <typename T>
__device__ __forceinline__ const T* in_cta(const T* local, int rank) {
    const T* remote = local;
#if __CUDA_ARCH__ >= 900
    asm("mapa.u64 %0, %1, %2;\n" : "=l"(remote) : "l"(local), "r"(rank));
#endif
    return remote;
}

__device__ __forceinline__ unsigned swizzled(int row, int unit, int row_bytes) {
    return row * row_bytes + ((unit ^ (row & 7)) << 4);
}

// Rows [0, count) of a tile, `units` 16-byte units each from src_row(row) + unit * 8 elements, row after row;
// rows at or past `valid` are zero-filled (cp.async reads nothing there).
template <typename SrcRow>
__device__ __forceinline__ void load_tile(unsigned char* tile, int row_bytes, int count, int units, int unit0,
                                          int valid, SrcRow src_row) {
    for (int i = threadIdx.x; i < count * units; i += THREADS) {
        const int row = i / units, unit = unit0 + i % units;
        const bool live = row < valid;
        cp_async16(tile + swizzled(row, unit, row_bytes), live ? src_row(row) + unit * 8 : src_row(0), live ? 16 : 0);
    }
}

// acc[j] (n-tile j of this warp's N tiles) += A rows 16 mt.. (row_bytes a_bytes) x B rows n0 + 8 j.., over
// k-steps [ks0, ks1) of 16; both tiles swizzled. N_TILES is even: B rows come two n-tiles per ldmatrix.
template <int N_TILES>
__device__ __forceinline__ void mma_steps(float (&acc)[N_TILES][4], unsigned a_base, int a_bytes, unsigned b_base,
                                          int b_bytes, int mt, int n0, int ks0, int ks1) {
    const int lane = threadIdx.x & 31, swz = lane & 7;
    const unsigned a_row = a_base + (16 * mt + (lane & 7) + 8 * ((lane >> 3) & 1)) * a_bytes;
    const unsigned b_row = b_base + (n0 + (lane & 7) + 8 * (lane >> 4)) * b_bytes;
    for (int ks = ks0; ks < ks1; ++ks) {
        unsigned a[4];
        ldsm_x4(a, a_row + (((2 * ks + (lane >> 4)) ^ swz) << 4));
#pragma unroll
        for (int p = 0; p < N_TILES / 2; ++p) {
            unsigned b[4];
            ldsm_x4(b, b_row + p * 16 * b_bytes + (((2 * ks + ((lane >> 3) & 1)) ^ swz) << 4));
            mma(acc[2 * p], a, b, scalar_t());
            mma(acc[2 * p + 1], a, b + 2, scalar_t());
        }
    }
}

__device__ __forceinline__ float rounded(float v) { return to_float(from_float<scalar_t>(v)); }
__device__ __forceinline__ float sigmoid(float g) { return 1.0f / (1.0f + __expf(-g)); }  // swiglu.cu's

extern "C" __global__ void MLP_CLUSTER __launch_bounds__(THREADS, 1) mlp_decode(
        float* __restrict__ parts, const scalar_t* __restrict__ x, const scalar_t* __restrict__ w_gate_up,
        const scalar_t* __restrict__ w_down, int rows) {
    extern __shared__ __align__(128) unsigned char smem[];
    unsigned char* x_tile = smem;
    unsigned char* gu_tile = smem + X_BYTES;
    unsigned char* wd_tile = gu_tile + GU_BYTES;
    scalar_t* slot = reinterpret_cast<scalar_t*>(wd_tile + WD_BYTES);
    const int c = blockIdx.x / CLUSTER, r = blockIdx.x % CLUSTER, q = r / 2, s = r % 2;
    const int f_pair = c * FC + 2 * FT * q;  // the pair's first gate_up feature
    const int k0 = s * K_HALF;
    constexpr int X_ROW = K_HALF * 2, WD_ROW = FC * 2;

    // Every load at once: gate_up's in two groups along K (x and weight rows), then down's weight rows.
    auto x_row = [&](int m) { return x + (long long)m * HIDDEN + k0; };
    auto gu_row = [&](int j) {
        const int feature = j < 2 * FT ? f_pair + j : INTER + f_pair + j - 2 * FT;
        return w_gate_up + (long long)feature * HIDDEN + k0;
    };
    for (int g = 0; g < 2; ++g) {
        load_tile(x_tile, X_ROW, ROWS, K_GROUP / 8, g * K_GROUP / 8, rows, x_row);
        load_tile(gu_tile, X_ROW, GU_ROWS, K_GROUP / 8, g * K_GROUP / 8, GU_ROWS, gu_row);
        cp_async_commit();
    }
    load_tile(wd_tile, WD_ROW, OUT_CTA, FC / 8, 0, OUT_CTA,
              [&](int n) { return w_down + (long long)(r * OUT_CTA + n) * INTER + c * FC; });
    cp_async_commit();

    // gate_up: warp w, rows 16 (w % 4).., columns 2 FT (w / 4).. (gate for w < 4, up for w >= 4)
    const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31, mt = warp % 4, half = warp / 4;
    constexpr int GU_TILES = 2 * FT / 8;
    float gu[GU_TILES][4] = {};
    cp_async_wait<2>();
    __syncthreads();
    mma_steps(gu, smem_addr(x_tile), X_ROW, smem_addr(gu_tile), X_ROW, mt, 2 * FT * half, 0, K_GROUP / 16);
    cp_async_wait<1>();
    __syncthreads();
    mma_steps(gu, smem_addr(x_tile), X_ROW, smem_addr(gu_tile), X_ROW, mt, 2 * FT * half, K_GROUP / 16,
              K_HALF / 16);
    __syncthreads();  // every warp is done with the x tile: the fp32 part takes its place
    float* part = reinterpret_cast<float*>(x_tile);
    const int g8 = lane >> 2, t4 = lane & 3;
#pragma unroll
    for (int j = 0; j < GU_TILES; ++j)
#pragma unroll
        for (int h = 0; h < 2; ++h)
            *reinterpret_cast<float2*>(part + (16 * mt + g8 + 8 * h) * PART_LD + 2 * FT * half + 8 * j + 2 * t4) =
                make_float2(gu[j][2 * h], gu[j][2 * h + 1]);
    cluster_sync();  // both halves of the pair's gate_up are in shared memory

    // This CTA's FT features: the pair's columns FT s.. of gate and of up, both halves added.
    const float* partner_part = in_cta(part, r ^ 1);
    static_assert(ROWS * FT % THREADS == 0, "mlp_decode: whole rounds of a's elements");
#pragma unroll
    for (int i = 0; i < ROWS * FT / THREADS; ++i) {
        const int e = threadIdx.x + i * THREADS, m = e / FT, f = e % FT;
        const int at = m * PART_LD + FT * s + f;
        const float g = rounded(part[at] + partner_part[at]);
        const float u = rounded(part[at + 2 * FT] + partner_part[at + 2 * FT]);
        slot[m * FT + f] = from_float<scalar_t>(g * sigmoid(g) * u);
    }
    cluster_sync();  // every slot of a is written, and no CTA reads a part any more

    // The cluster's FC features of a, from the 8 slots, into the gate_up region (row after row, swizzled).
    unsigned char* a_tile = gu_tile;
    constexpr int SLOT_UNITS = FT / 8;
    static_assert(CLUSTER * ROWS * SLOT_UNITS % THREADS == 0, "mlp_decode: whole rounds of the gather");
    uint4 gathered[CLUSTER * ROWS * SLOT_UNITS / THREADS];
#pragma unroll
    for (int i = 0; i < CLUSTER * ROWS * SLOT_UNITS / THREADS; ++i) {
        const int e = threadIdx.x + i * THREADS, src = e / (ROWS * SLOT_UNITS), within = e % (ROWS * SLOT_UNITS);
        gathered[i] = in_cta(reinterpret_cast<const uint4*>(slot), src)[within];
    }
#pragma unroll
    for (int i = 0; i < CLUSTER * ROWS * SLOT_UNITS / THREADS; ++i) {
        const int e = threadIdx.x + i * THREADS, src = e / (ROWS * SLOT_UNITS), within = e % (ROWS * SLOT_UNITS);
        const int m = within / SLOT_UNITS, unit = within % SLOT_UNITS;
        *reinterpret_cast<uint4*>(a_tile + swizzled(m, src * SLOT_UNITS + unit, WD_ROW)) = gathered[i];
    }
    cluster_arrive();  // done reading the other CTAs' slots; the wait before leaving pairs with this
    cp_async_wait<0>();
    __syncthreads();

    // down: warp w, rows 16 (w % 4).., outputs OUT_CTA / 2 * (w / 4)..
    constexpr int D_TILES = OUT_CTA / 2 / 8;
    float acc[D_TILES][4] = {};
    mma_steps(acc, smem_addr(a_tile), WD_ROW, smem_addr(wd_tile), WD_ROW, mt, OUT_CTA / 2 * half, 0, FC / 16);
    float* out = parts + (long long)c * rows * HIDDEN + r * OUT_CTA + OUT_CTA / 2 * half;
#pragma unroll
    for (int j = 0; j < D_TILES; ++j)
#pragma unroll
        for (int h = 0; h < 2; ++h) {
            const int m = 16 * mt + g8 + 8 * h;
            if (m < rows)
                *reinterpret_cast<float2*>(out + (long long)m * HIDDEN + 8 * j + 2 * t4) =
                    make_float2(acc[j][2 * h], acc[j][2 * h + 1]);
        }
    cluster_wait();
}

// out = residual + parts[0] + ... + parts[15], in that order, rounded once; 4 elements a thread.
extern "C" __global__ void mlp_decode_sum(scalar_t* __restrict__ out, const float* __restrict__ parts,
                                          const scalar_t* __restrict__ residual, int rows) {
    const long long n = (long long)rows * HIDDEN, quads = n / 4;
    for (long long i = blockIdx.x * (long long)blockDim.x + threadIdx.x; i < quads;
         i += (long long)gridDim.x * blockDim.x) {
        float4 sum = reinterpret_cast<const float4*>(parts)[i];
#pragma unroll
        for (int p = 1; p < CLUSTERS; ++p) {
            const float4 v = reinterpret_cast<const float4*>(parts + p * n)[i];
            sum.x += v.x;
            sum.y += v.y;
            sum.z += v.z;
            sum.w += v.w;
        }
        const scalar_t* res = residual + 4 * i;
        scalar_t* o = out + 4 * i;
        o[0] = from_float<scalar_t>(to_float(res[0]) + sum.x);
        o[1] = from_float<scalar_t>(to_float(res[1]) + sum.y);
        o[2] = from_float<scalar_t>(to_float(res[2]) + sum.z);
        o[3] = from_float<scalar_t>(to_float(res[3]) + sum.w);
    }
}
