// store_kv: write the new tokens' keys and values into the paged KV cache.
// Reference twin: ops/ref/kv_cache.py (store_kv).
// Launchers: ops/cuda/kv_cache.py; tests: tests/ops/test_kv_cache.py.
//
// Math:    k_cache[slot // BS, slot % BS, h, :] = k[t, h, :] (and the same for v) for slot = slot_mapping[t];
//          slot < 0 skips the token (padding). Rounded from SRC_T to the cache dtype once.
// Shapes:  k, v (T, K, D) SRC_T with heads and dims dense, token rows `k_stride` / `v_stride` elements apart
//          (views into a fused qkv buffer); k_cache, v_cache (num_blocks, BS, K, D) DTYPE, dense;
//          slot_mapping (T,) int32.
// Launch:  grid (T,), 128 threads; each thread copies elements kd, kd + 128, ... of the token's K*D row.
// Macros:  DTYPE = cache storage type, SRC_T = type of k and v (defaults to DTYPE).
#include "common.cuh"

#ifndef SRC_T
#define SRC_T DTYPE
#endif

extern "C" __global__ void store_kv(const SRC_T* __restrict__ k, const SRC_T* __restrict__ v,
                                    scalar_t* __restrict__ k_cache, scalar_t* __restrict__ v_cache,
                                    const int* __restrict__ slot_mapping, long long k_stride,
                                    long long v_stride, int row_size) {
    const int t = blockIdx.x;
    const int slot = slot_mapping[t];
    if (slot < 0) return;
    const SRC_T* k_row = k + t * k_stride;
    const SRC_T* v_row = v + t * v_stride;
    scalar_t* k_dst = k_cache + (long long)slot * row_size;
    scalar_t* v_dst = v_cache + (long long)slot * row_size;
    for (int i = threadIdx.x; i < row_size; i += blockDim.x) {
        k_dst[i] = from_float<scalar_t>(to_float(k_row[i]));
        v_dst[i] = from_float<scalar_t>(to_float(v_row[i]));
    }
}
