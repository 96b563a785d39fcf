// norm_linear: a decode step's RMSNorm and the product after it (and, for the MLP, the SwiGLU after that),
// one launch.
// Dtypes: __nv_bfloat16 __half
//
// Why: a decode step multiplies a few rows by each weight. The norm before qkv and gate_up and the SwiGLU
//      after gate_up were kernels of their own, each ~3 us of a G1 layer's ~38 us outside attention, mostly
//      launch boundary and one dependent round trip to memory. Here every CTA holds the x tile (<= 64 rows,
//      all of K) and its WROWS rows of the weight (all of K) in shared memory at once: every byte is
//      requested at the start (one cp.async group per eighth of K, so the products of an eighth start as
//      soon as it lands) and nothing waits on a ring slot. The norm needs the whole row before it can scale
//      it, so it is factored: the A operand is round(x * g), the row's sum of squares accumulates from the
//      same registers, and the epilogue multiplies by rstd. That rounds x * g instead of x * rstd * g: a
//      difference at the dtype's rounding level, which the trainer's unfused path does not share (so the
//      engine takes this op only with batch invariance off).
//
// Math:    rstd[m] = 1 / sqrt(mean_k x[m,k]^2 + eps);   p[m, n] = rstd[m] * sum_k round(x[m,k] g[k]) w[n,k]
//          SWIGLU 0: out[m, n] = p[m, n] + bias[n]                           out (M, N)
//          SWIGLU 1: out[m, j] = silu(round(p[m, j])) * round(p[m, I + j])    out (M, I), N = 2 I, no bias
// Shapes:  x (M, K), w (N, K), out: dense rows, DTYPE; g (K,), bias (N,) or null. K % 128 == 0; plain:
//          N % WROWS == 0; SWIGLU: I % (WROWS / 2) == 0. Any M: row tiles of 64 in turn, the weight tile
//          staying in shared memory (meant for few rows; the launcher takes cuBLAS above a bound).
// Launch:  grid (N / WROWS) or (I / (WROWS / 2)), 256 threads (8 warps), dynamic shared memory
//          (64 + WROWS + 1) * K * sizeof(DTYPE). Warp w takes rows 16 (w % 4) .. + 15 of the tile and every
//          other 16-wide k step of each eighth (w / 4 picks which), with mma.sync m16n8k16 (x: A operand,
//          the weight's rows: B operand, as Q and K in flash_attention.cu); the two halves' sums meet in
//          shared memory. Rows of K elements lie in shared memory with their 16-byte units XOR-swizzled by
//          row % 8, so ldmatrix reads 8 rows of one column without bank conflicts.
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
constexpr int BM = 64, THREADS = 128 * KSPLIT, CHUNKS = 8, NT = WROWS / 8;
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

// Eighth c of K: the x tile's rows m0.. that exist, and on the first row tile the weight tile's and g's; one
// cp.async group. Rows past `rows` are left as they are: a row of the product depends on its own row of x
// only, and those rows are never stored. Every CTA reads the same x rows, so each starts at its own row (all
// SMs asking one L2 slice for one line at once would queue there).
__device__ __forceinline__ void load_eighth(unsigned char* smem, const scalar_t* x, const scalar_t* w,
                                            const scalar_t* g, int c, int m0, int rows, int k_dim, int inter,
                                            bool with_weight) {
    const int units = k_dim / 8, per = units / CHUNKS, row_bytes = k_dim * (int)sizeof(scalar_t);
    const int x_rows = min(BM, rows - m0), tile_rows = with_weight ? x_rows + WROWS : x_rows;
    for (int i = threadIdx.x; i < tile_rows * per; i += THREADS) {
        const int q = i / per, unit = c * per + i % per;
        if (q < x_rows) {
            const int r = (q + blockIdx.x) % x_rows;
            cp_async16(smem + swizzled(r, unit, row_bytes), x + (long long)(m0 + r) * k_dim + unit * 8, 16);
        } else {
            const int wr = q - x_rows;
            cp_async16(smem + BM * row_bytes + swizzled(wr, unit, row_bytes),
                       w + weight_row(wr, blockIdx.x, inter) * k_dim + unit * 8, 16);
        }
    }
    if (with_weight)
        for (int i = threadIdx.x; i < per; i += THREADS)
            cp_async16(smem + (BM + WROWS) * row_bytes + (c * per + i) * 16, g + (c * per + i) * 8, 16);
    cp_async_commit();
}

// The eighth of K that this CTA loads (and multiplies) c-th. CTAs start at different eighths: a weight row is
// 2 KB, so all CTAs reading the same eighth of theirs at once would ask for one 256-byte stripe of every 2 KB
// and load some DRAM channels far more than others.
__device__ __forceinline__ int eighth(int c) {
#ifdef PROBE_NO_ROTATE
    return c;
#else
    return (c + blockIdx.x) % CHUNKS;
#endif
}

__device__ __forceinline__ float2 unpack2(unsigned v) {
    const scalar_t* e = reinterpret_cast<const scalar_t*>(&v);
    return make_float2(to_float(e[0]), to_float(e[1]));
}

// One 16-wide k step at k0: A = round(x * g) from the raw x fragment (adding x^2 to the sums of the lane's two
// rows), then this warp's NT products. a_row / w_row: shared addresses of the lane's ldmatrix rows (A: the
// lane's x row; B: its row of the first 16 weight rows); `swz` = the lane's row % 8.
__device__ __forceinline__ void k_step(float (&acc)[NT][4], float (&ss)[2], unsigned a_row, unsigned w_row,
                                       int row_bytes, const unsigned* g_pairs, int k0, int lane) {
    const int swz = lane & 7, t = lane & 3;
    unsigned a[4];
    ldsm_x4(a, a_row + ((((k0 >> 3) + (lane >> 4)) ^ swz) << 4));
    const float2 g_lo = unpack2(g_pairs[k0 / 2 + t]), g_hi = unpack2(g_pairs[k0 / 2 + 4 + t]);
#ifndef PROBE_NO_NORM
#pragma unroll
    for (int i = 0; i < 4; ++i) {  // regs 0, 2: row g; 1, 3: row g + 8; regs 2, 3: k + 8
        const float2 v = unpack2(a[i]);
        const float2 s = i < 2 ? g_lo : g_hi;
        ss[i & 1] += v.x * v.x + v.y * v.y;
        a[i] = pack2(v.x * s.x, v.y * s.y, scalar_t());
    }
#endif
    const unsigned w_unit = (((k0 >> 3) + ((lane >> 3) & 1)) ^ swz) << 4;
#pragma unroll
    for (int p = 0; p < NT / 2; ++p) {
        unsigned b[4];
        ldsm_x4(b, w_row + p * 16 * row_bytes + w_unit);
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
    const int row_bytes = k_dim * (int)sizeof(scalar_t), steps = k_dim / (16 * CHUNKS);
    const unsigned base = smem_addr(smem);
    const unsigned a_row = base + (16 * wr + (lane & 7) + 8 * ((lane >> 3) & 1)) * row_bytes;
    const unsigned w_row = base + (BM + (lane & 7) + 8 * (lane >> 4)) * row_bytes;
    const unsigned* g_pairs = reinterpret_cast<const unsigned*>(smem + (BM + WROWS) * row_bytes);
    float* partial = reinterpret_cast<float*>(smem);  // parts 1..'s sums, over the spent x tile

    for (int m0 = 0; m0 < rows; m0 += BM) {
        const bool first = m0 == 0;
#pragma unroll
        for (int c = 0; c < CHUNKS; ++c) load_eighth(smem, x, w, g, eighth(c), m0, rows, k_dim, inter, first);
        float acc[NT][4] = {}, ss[2] = {0.0f, 0.0f};
#pragma unroll
        for (int c = 0; c < CHUNKS; ++c) {
            switch (c) {  // wait_group takes an immediate: eighth c has landed once CHUNKS - 1 - c remain
                case 0: cp_async_wait<CHUNKS - 1>(); break;
                case 1: cp_async_wait<CHUNKS - 2>(); break;
                case 2: cp_async_wait<CHUNKS - 3>(); break;
                case 3: cp_async_wait<CHUNKS - 4>(); break;
                case 4: cp_async_wait<CHUNKS - 5>(); break;
                case 5: cp_async_wait<CHUNKS - 6>(); break;
                case 6: cp_async_wait<CHUNKS - 7>(); break;
                default: cp_async_wait<0>(); break;
            }
            __syncthreads();
#ifndef PROBE_NO_MMA
            for (int s = part; s < steps; s += KSPLIT)
                k_step(acc, ss, a_row, w_row, row_bytes, g_pairs, 16 * (eighth(c) * steps + s), lane);
#endif
        }
#pragma unroll
        for (int h = 0; h < 2; ++h) {  // the row's sum over the quad's lanes (their k columns)
            ss[h] += __shfl_xor_sync(0xffffffffu, ss[h], 1);
            ss[h] += __shfl_xor_sync(0xffffffffu, ss[h], 2);
        }
        __syncthreads();  // every warp is done with the x tile: the partial sums take its place
        const int r_lo = 16 * wr + gq;
        if (t == 0) {
            row_ss[part][r_lo] = ss[0];
            row_ss[part][r_lo + 8] = ss[1];
        }
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
