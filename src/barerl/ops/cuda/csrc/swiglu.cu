// SwiGLU activation of the MLP, forward and backward.
// Reference twin: ops/ref/swiglu.py (swiglu, swiglu_backward).
// Launchers: ops/cuda/swiglu.py; tests: tests/ops/test_swiglu.py.
//
// Math:    gate_up = [g | u] per row;  a = silu(g) * u = g * sigmoid(g) * u
//          backward: dg = da * u * s * (1 + g * (1 - s)),  du = da * g * s,  with s = sigmoid(g)
// Shapes:  gate_up, dgate_up (T, 2I) DTYPE; a, da (T, I) DTYPE; all rows contiguous; I % VEC == 0.
// Launch:  grid-stride over T * I / VEC vectors, 256 threads per block; each thread moves VEC outputs with
//          16-byte accesses.
#include "common.cuh"

__device__ __forceinline__ float sigmoid(float g) { return 1.0f / (1.0f + __expf(-g)); }

extern "C" __global__ void swiglu_forward(scalar_t* __restrict__ a, const scalar_t* __restrict__ gate_up,
                                          long long rows, int inter) {
    for_each_row_vector(rows, inter, [&](long long row, int col) {
        float g[VEC], u[VEC];
        load_vec(gate_up + row * 2 * inter + col, g);
        load_vec(gate_up + row * 2 * inter + inter + col, u);
#pragma unroll
        for (int k = 0; k < VEC; ++k) g[k] = g[k] * sigmoid(g[k]) * u[k];
        store_vec(a + row * inter + col, g);
    });
}

extern "C" __global__ void swiglu_backward(scalar_t* __restrict__ dgate_up, const scalar_t* __restrict__ da,
                                           const scalar_t* __restrict__ gate_up, long long rows, int inter) {
    for_each_row_vector(rows, inter, [&](long long row, int col) {
        float g[VEC], u[VEC], d[VEC];
        load_vec(gate_up + row * 2 * inter + col, g);
        load_vec(gate_up + row * 2 * inter + inter + col, u);
        load_vec(da + row * inter + col, d);
#pragma unroll
        for (int k = 0; k < VEC; ++k) {
            const float s = sigmoid(g[k]);
            const float dg = d[k] * u[k] * s * (1.0f + g[k] * (1.0f - s));
            u[k] = d[k] * g[k] * s;
            g[k] = dg;
        }
        store_vec(dgate_up + row * 2 * inter + col, g);
        store_vec(dgate_up + row * 2 * inter + inter + col, u);
    });
}
