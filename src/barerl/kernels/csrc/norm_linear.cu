// norm_linear: a decode step's RMSNorm and the product after it (and, for the MLP, the SwiGLU after that),
// one launch.
// Dtypes: __nv_bfloat16 __half
//
// Why: a decode step multiplies a few rows by each weight. The norm before qkv and gate_up and the SwiGLU
//      after gate_up were kernels of their own, each ~3 us of a G1 layer's ~38 us outside attention, mostly
//      launch boundary and one dependent round trip to memory. Here every CTA holds the x tile (<= 64 rows,
//      all of K) and its WROWS rows of the weight (all of K) in shared memory at once, every byte requested
//      at the start, row after row: on the H200 a tile read in K-stripes (an eighth of every row, then the
//      next) took 30% longer for a CTA's own weight rows and 2.3x longer for the x rows that every CTA reads
//      (bench/RESULTS.md, session 10). So the pipeline runs over weight rows instead: 16 rows (two 8-column
//      products) per cp.async group, each multiplied once it lands. The norm needs the whole row before it
//      can scale it, so it is factored: the x tile is turned into round(x * g) in place while its sums of
//      squares are taken, and the epilogue multiplies by rstd. That rounds x * g instead of x * rstd * g: a
//      difference at the dtype's rounding level, which the trainer's unfused path does not share (so the
//      engine takes this op only with batch invariance off).
//
// Math:    rstd[m] = 1 / sqrt(mean_k x[m,k]^2 + eps);   p[m, n] = rstd[m] * sum_k round(x[m,k] g[k]) w[n,k]
//          SWIGLU 0: out[m, n] = p[m, n] + bias[n]                           out (M, N)
//          SWIGLU 1: out[m, j] = silu(round(p[m, j])) * round(p[m, I + j])    out (M, I), N = 2 I, no bias
// Shapes:  x (M, K), w (N, K), out: dense rows, DTYPE; g (K,), bias (N,) or null. K % 128 == 0; plain:
//          N % WROWS == 0; SWIGLU: I % (WROWS / 2) == 0. Any M: row tiles of 64 in turn, the weight tile
//          staying in shared memory (meant for few rows; the launcher takes cuBLAS above a bound).
// Launch:  grid (N / WROWS) or (I / (WROWS / 2)), 128 KSPLIT threads, dynamic shared memory
//          (64 + WROWS + 1) * K * sizeof(DTYPE). Warp w takes rows 16 (w % 4) .. + 15 of the tile and every
//          KSPLIT-th 16-wide k step (w / 4 picks which), with mma.sync m16n8k16 (x: A operand, the weight's
//          rows: B operand, as Q and K in flash_attention.cu); the parts' sums meet in shared memory. Rows of
//          K elements lie in shared memory with their 16-byte units XOR-swizzled by row % 8, so ldmatrix reads
//          8 rows of one column without bank conflicts.
#include "mma.cuh"

#ifndef WROWS
#define WROWS 32
#endif
#ifndef SWIGLU
#define SWIGLU 0
#endif
#ifndef KSPLIT
#define KSPLIT 2
#endif
constexpr int BM = 64, THREADS = 128 * KSPLIT, NT = WROWS / 8, GROUPS = WROWS / 16;
static_assert(WROWS % 16 == 0 && WROWS <= 64, "WROWS: a multiple of 16, at most 64");
static_assert(!SWIGLU || NT % 2 == 0, "SWIGLU: gate and up take half the weight rows each");

// Byte offset of 16-byte unit `unit` of row `row` in a tile of rows `row_bytes` long.
__device__ __forceinline__ unsigned swizzled(int row, int unit, int row_bytes) {
    return row * row_bytes + ((unit ^ (row & 7)) << 4);
}

// The weight row that the tile's shared-memory row r holds: WROWS consecutive rows, or with SWIGLU the
// tile's WROWS / 2 gate rows then the matching up rows (I further on).
__device__ __forceinline__ long long weight_row(int r, int tile, int inter) {
#if SWIGLU
    constexpr int HALF = WROWS / 2;
    return (long long)tile * HALF + (r < HALF ? r : inter + r - HALF);
#else
    return (long long)tile * WROWS + r;
#endif
}

// `count` rows of K elements, row after row, from src_row(r) into the swizzled tile at `tile`; one group.
template <typename SrcRow>
__device__ __forceinline__ void load_rows(unsigned char* tile, int count, int k_dim, SrcRow src_row) {
    const int units = k_dim / 8, row_bytes = k_dim * (int)sizeof(scalar_t);
    for (int i = threadIdx.x; i < count * units; i += THREADS) {
        const int r = i / units, unit = i % units;
        cp_async16(tile + swizzled(r, unit, row_bytes), src_row(r) + unit * 8, 16);
    }
    cp_async_commit();
}

// Wait until at most n cp.async groups are pending (wait_group takes an immediate), then for the whole CTA.
__device__ __forceinline__ void wait_pending(int n) {
    switch (n) {
        case 0: cp_async_wait<0>(); break;
        case 1: cp_async_wait<1>(); break;
        case 2: cp_async_wait<2>(); break;
        case 3: cp_async_wait<3>(); break;
        default: cp_async_wait<GROUPS>(); break;
    }
    __syncthreads();
}

__device__ __forceinline__ float2 unpack2(unsigned v) {
    const scalar_t* e = reinterpret_cast<const scalar_t*>(&v);
    return make_float2(to_float(e[0]), to_float(e[1]));
}

// The x tile's rows 16 wr .. + 15, k part `part` of KSPLIT, turned into round(x * g) in place; each row's
// sum of x^2 over the part goes to row_ss[part]. Lanes l and l + 16 share row l % 16, each half of the part's
// units (eight consecutive lanes read eight rows: distinct swizzled banks).
__device__ __forceinline__ void scale_x(unsigned char* smem, const unsigned char* g_tile,
                                        float (*row_ss)[BM], int wr, int part, int lane, int k_dim) {
    const int units = k_dim / 8, per = units / (2 * KSPLIT), row_bytes = k_dim * (int)sizeof(scalar_t);
    const int row = 16 * wr + lane % 16, first = (2 * part + lane / 16) * per;
    float ss = 0.0f;
    for (int unit = first; unit < first + per; ++unit) {
        uint4* p = reinterpret_cast<uint4*>(smem + swizzled(row, unit, row_bytes));
        uint4 v = *p;
        const uint4 gv = *reinterpret_cast<const uint4*>(g_tile + unit * 16);
        unsigned* e = reinterpret_cast<unsigned*>(&v);
        const unsigned* ge = reinterpret_cast<const unsigned*>(&gv);
#pragma unroll
        for (int i = 0; i < 4; ++i) {
            const float2 xv = unpack2(e[i]), gs = unpack2(ge[i]);
            ss += xv.x * xv.x + xv.y * xv.y;
            e[i] = pack2(xv.x * gs.x, xv.y * gs.y, scalar_t());
        }
        *p = v;
    }
    ss += __shfl_xor_sync(0xffffffffu, ss, 16);
    if (lane < 16) row_ss[part][row] = ss;
}

// This warp's share of one weight group's two 8-column products: every KSPLIT-th k step from `part`.
// a_row / w_row: shared addresses of the lane's ldmatrix rows (A: its x row; B: its row of the group).
__device__ __forceinline__ void multiply_group(float (&acc)[NT][4], int p, unsigned a_row, unsigned w_row,
                                               int row_bytes, int k_dim, int part, int lane) {
    const int swz = lane & 7;
    for (int s = part; s < k_dim / 16; s += KSPLIT) {
        unsigned a[4], b[4];
        ldsm_x4(a, a_row + (((2 * s + (lane >> 4)) ^ swz) << 4));
        ldsm_x4(b, w_row + p * 16 * row_bytes + (((2 * s + ((lane >> 3) & 1)) ^ swz) << 4));
        mma(acc[2 * p], a, b, scalar_t());
        mma(acc[2 * p + 1], a, b + 2, scalar_t());
    }
}

extern "C" __global__ void __launch_bounds__(THREADS, 1) norm_linear(
    scalar_t* __restrict__ out, const scalar_t* __restrict__ x, const scalar_t* __restrict__ g,
    const scalar_t* __restrict__ w, const scalar_t* __restrict__ bias, int rows, int k_dim, int inter,
    float eps) {
    extern __shared__ __align__(128) unsigned char smem[];
    __shared__ float row_ss[KSPLIT][BM];  // each k part's sums of squares per tile row
    const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31, gq = lane >> 2, t = lane & 3;
    const int wr = warp % 4, part = warp / 4;  // rows 16 wr.., k steps part, part + KSPLIT, ...
    const int row_bytes = k_dim * (int)sizeof(scalar_t);
    unsigned char* w_tile = smem + BM * row_bytes;
    unsigned char* g_tile = w_tile + WROWS * row_bytes;
    const unsigned base = smem_addr(smem);
    const unsigned a_row = base + (16 * wr + (lane & 7) + 8 * ((lane >> 3) & 1)) * row_bytes;
    const unsigned w_row = base + (BM + (lane & 7) + 8 * (lane >> 4)) * row_bytes;
    float* partial = reinterpret_cast<float*>(smem);  // parts 1..'s sums, over the spent x tile

    for (int m0 = 0; m0 < rows; m0 += BM) {
        const bool first = m0 == 0;
        if (first)  // g first: 2 KB that every CTA reads, with its x rows
            for (int i = threadIdx.x; i < k_dim / 8; i += THREADS) cp_async16(g_tile + 16 * i, g + 8 * i, 16);
        load_rows(smem, min(BM, rows - m0), k_dim, [&](int r) { return x + (long long)(m0 + r) * k_dim; });
        if (first)
            for (int p = 0; p < GROUPS; ++p)
                load_rows(w_tile + p * 16 * row_bytes, 16, k_dim,
                          [&](int r) { return w + weight_row(16 * p + r, blockIdx.x, inter) * k_dim; });
        wait_pending(first ? GROUPS : 0);  // x (and g) have landed
        scale_x(smem, g_tile, row_ss, wr, part, lane, k_dim);
        __syncthreads();
        float acc[NT][4] = {};
        for (int p = 0; p < GROUPS; ++p) {
            if (first) wait_pending(GROUPS - 1 - p);
            multiply_group(acc, p, a_row, w_row, row_bytes, k_dim, part, lane);
        }
        __syncthreads();  // every warp is done with the x tile: the partial sums take its place
        const int r_lo = 16 * wr + gq;
        // This thread's values: rows r_lo (+ 8), tile columns 8 j + 2 t (and + 1).
        if (part > 0)
#pragma unroll
            for (int j = 0; j < NT; ++j)
#pragma unroll
                for (int h = 0; h < 2; ++h)
                    *reinterpret_cast<float2*>(partial + ((part - 1) * BM + r_lo + 8 * h) * WROWS + 8 * j + 2 * t) =
                        make_float2(acc[j][2 * h], acc[j][2 * h + 1]);
        __syncthreads();
        if (part == 0) {
#pragma unroll
            for (int h = 0; h < 2; ++h) {
                const int r = r_lo + 8 * h;
                if (m0 + r >= rows) continue;
                float ss_row = row_ss[0][r], p[NT][2];
#pragma unroll
                for (int j = 0; j < NT; ++j) {
                    p[j][0] = acc[j][2 * h];
                    p[j][1] = acc[j][2 * h + 1];
                }
#pragma unroll
                for (int q = 1; q < KSPLIT; ++q) {  // in part order
                    ss_row += row_ss[q][r];
#pragma unroll
                    for (int j = 0; j < NT; ++j) {
                        const float2 other =
                            *reinterpret_cast<const float2*>(partial + ((q - 1) * BM + r) * WROWS + 8 * j + 2 * t);
                        p[j][0] += other.x;
                        p[j][1] += other.y;
                    }
                }
                const float rstd = rsqrtf(ss_row / k_dim + eps);
#pragma unroll
                for (int j = 0; j < NT; ++j) {
                    p[j][0] *= rstd;
                    p[j][1] *= rstd;
                }
#if SWIGLU
                constexpr int HALF = WROWS / 2;
                scalar_t* dst = out + (long long)(m0 + r) * inter + blockIdx.x * HALF + 2 * t;
#pragma unroll
                for (int j = 0; j < NT / 2; ++j) {
                    float v[2];
#pragma unroll
                    for (int e = 0; e < 2; ++e) {
                        const float gate = to_float(from_float<scalar_t>(p[j][e]));
                        const float up = to_float(from_float<scalar_t>(p[j + NT / 2][e]));
                        v[e] = gate * (1.0f / (1.0f + __expf(-gate))) * up;  // as swiglu.cu
                    }
                    *reinterpret_cast<unsigned*>(dst + 8 * j) = pack2(v[0], v[1], scalar_t());
                }
#else
                const int n0 = blockIdx.x * WROWS, cols = gridDim.x * WROWS;
                scalar_t* dst = out + (long long)(m0 + r) * cols + n0 + 2 * t;
#pragma unroll
                for (int j = 0; j < NT; ++j) {
                    const int n = n0 + 8 * j + 2 * t;
                    const float b0 = bias ? to_float(bias[n]) : 0.0f, b1 = bias ? to_float(bias[n + 1]) : 0.0f;
                    *reinterpret_cast<unsigned*>(dst + 8 * j) = pack2(p[j][0] + b0, p[j][1] + b1, scalar_t());
                }
#endif
            }
        }
        __syncthreads();  // the partial sums are read before the next row tile's x lands on them
    }
}
