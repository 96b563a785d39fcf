// Embedding gather (forward) and scatter-add (backward).
// Reference twin: ops/ref/embedding.py (embedding, embedding_backward).
// Launchers: ops/cuda/embedding.py; tests: tests/ops/test_embedding.py.
//
// Math:    out[t, :] = table[ids[t], :];   dtable[ids[t], :] += dx[t, :]
// Shapes:  ids (T,) int32 in [0, V); table (V, C) DTYPE; out, dx (T, C) DTYPE; dtable (V, C) fp32,
//          accumulated with atomicAdd (repeated ids add up; order of additions is unspecified).
//          C % VEC == 0, rows contiguous.
// Launch:  grid-stride over T * C / VEC vectors, 256 threads per block.
#include "common.cuh"

extern "C" __global__ void embedding_forward(scalar_t* __restrict__ out, const int* __restrict__ ids,
                                             const scalar_t* __restrict__ table, long long rows, int cols) {
    for_each_row_vector(rows, cols, [&](long long row, int col) {
        const long long src = (long long)ids[row] * cols + col;
        *reinterpret_cast<uint4*>(out + row * cols + col) = *reinterpret_cast<const uint4*>(table + src);
    });
}

extern "C" __global__ void embedding_backward(float* __restrict__ dtable, const int* __restrict__ ids,
                                              const scalar_t* __restrict__ dx, long long rows, int cols) {
    for_each_row_vector(rows, cols, [&](long long row, int col) {
        float v[VEC];
        load_vec(dx + row * cols + col, v);
        float* dst = dtable + (long long)ids[row] * cols + col;
#pragma unroll
        for (int k = 0; k < VEC; ++k) atomicAdd(dst + k, v[k]);
    });
}
