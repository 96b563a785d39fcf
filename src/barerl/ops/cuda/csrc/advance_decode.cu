// advance_decode: one decode step's inputs become the next step's, on the device (inside a CUDA graph that
// Reference twin: ops/ref/advance_decode.py (advance_decode).
// Launchers: ops/cuda/advance_decode.py; tests: tests/ops/test_advance_decode.py.
// holds several decode steps), in one kernel instead of the reference's dozen elementwise CuPy ones.
//
// Math:    for each row r with slot_mapping[r] >= 0 (padding rows, slot -1, stay as they are):
//            next = positions[r] + 1
//            input_ids[r] = tokens[r];  positions[r] = next;  context_lens[r] += 1;  counters[r] += 1
//            slot_mapping[r] = block_tables[r, next / BS] * BS + next % BS
// Shapes:  tokens, input_ids, positions, context_lens, slot_mapping (rows,) int32; counters (rows,) int64;
//          block_tables (rows, max_blocks) int32 (the block of position `next` must already be there).
// Launch:  one thread per row, any block size.
#include "common.cuh"

extern "C" __global__ void advance_decode(const int* __restrict__ tokens, int* __restrict__ input_ids,
                                          int* __restrict__ positions, int* __restrict__ context_lens,
                                          int* __restrict__ slot_mapping, long long* __restrict__ counters,
                                          const int* __restrict__ block_tables, int max_blocks, int block_size,
                                          int rows) {
    const int r = blockIdx.x * blockDim.x + threadIdx.x;
    if (r >= rows || slot_mapping[r] < 0) return;
    const int next = positions[r] + 1;
    const int block = block_tables[(long long)r * max_blocks + next / block_size];
    input_ids[r] = tokens[r];
    slot_mapping[r] = block * block_size + next % block_size;
    positions[r] = next;
    context_lens[r] += 1;
    counters[r] += 1;
}
