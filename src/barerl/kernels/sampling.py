"""sample on the GPU: temperature / top-k / top-p / min-p sampling with log-probs (csrc/sampling.cu).

Design decisions:
- Same tokens as backend.ref.sampling.sample, bit for bit: the kernel repeats the reference's fp32
  operations (z = logits / T, the hash's fp32 uniform, -log(-log(u)), z + g, first argmax); the log-probs
  differ only in summation order.
- One pass over the vocabulary for the token and its log-prob, split over many CTAs per row (CHUNK tokens
  each) so that a batch of 64 rows still fills the GPU; truncation thresholds come first from a radix select
  per row (no sort), which returns at once for rows without truncation.
- Every per-row setting is a device array and every launch's shape depends only on (B, V): the three
  launches can be captured in a CUDA graph.
"""

from __future__ import annotations

import numpy as np

from barerl.kernels.build import load_kernel

_CHUNK = 4096  # must equal CHUNK in sampling.cu
_SELECT_THREADS, _PARTIAL_THREADS = 512, 256  # must equal SELECT_THREADS / PARTIAL_THREADS in sampling.cu


def sample(logits, temperature, top_k, top_p, min_p, seeds, counters):
    """One token per row: logits (B, V) fp32, per-row settings (B,) -> tokens (B,) int32, logprobs (B,) fp32.

    The contract is backend.ref.sampling.sample's (temperature 0: greedy; top_k <= 0, top_p 1, min_p 0: off).
    """
    import cupy

    B, V = logits.shape
    logits = cupy.ascontiguousarray(logits, dtype=np.float32)
    temperature = cupy.asarray(temperature, dtype=np.float32)
    top_k = cupy.asarray(top_k, dtype=np.int32)
    top_p = cupy.asarray(top_p, dtype=np.float32)
    min_p = cupy.asarray(min_p, dtype=np.float32)
    seeds = cupy.asarray(seeds, dtype=np.uint64)
    counters = cupy.asarray(counters, dtype=np.int64)
    chunks = -(-V // _CHUNK)
    thr = cupy.empty(B, np.uint32)
    row_max = cupy.empty(B, np.float32)
    part_max, part_sum, part_score = (cupy.empty((B, chunks), np.float32) for _ in range(3))
    part_index = cupy.empty((B, chunks), np.int32)
    tokens = cupy.empty(B, np.int32)
    logprobs = cupy.empty(B, np.float32)
    if B == 0:
        return tokens, logprobs
    vocab = np.int32(V)
    load_kernel("sampling.cu", "sample_thresholds")(
        (B,), (_SELECT_THREADS,), (logits, temperature, top_k, top_p, min_p, thr, row_max, vocab))
    load_kernel("sampling.cu", "sample_partials")(
        (chunks, B), (_PARTIAL_THREADS,),
        (logits, temperature, min_p, seeds, counters, thr, row_max, part_max, part_sum, part_score,
         part_index, vocab))
    load_kernel("sampling.cu", "sample_finalize")(
        (B,), (32,), (logits, temperature, part_max, part_sum, part_score, part_index, tokens, logprobs,
                      vocab, np.int32(chunks)))
    return tokens, logprobs
