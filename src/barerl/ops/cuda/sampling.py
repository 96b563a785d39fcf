"""sample on the GPU: temperature / top-k / top-p / min-p sampling with log-probs (csrc/sampling.cu).

Design decisions:
- Inverse-CDF sampling with one random draw per row instead of Gumbel-max (a 64-bit hash and two logs per
  vocabulary element): per element the kernel does one exp, a float -> u64 conversion and integer adds,
  so sampling costs about two reads of the logits.
- Same tokens as ops.ref.sampling.sample, bit for bit: each kept token's mass is rint(p * 2^42) in u64,
  and integer sums are exact in any order, so the chunked sums and the prefix search pick the reference's
  token; the floats behind a mass (z = logits / T, p = expf(z - m)) are the reference's own fp32
  operations. The log-probs differ only in the summation order of the fp32 sum of p.
- Split over many CTAs per row (CHUNK tokens each) so that a batch of 64 rows still fills the GPU: a pass
  for the row maximum, a pass for each chunk's masses, and a finalize per row that rescans only the chunk
  holding the target. Truncation thresholds come from radix selects (no sort) in between: C CTAs per row
  add shared-memory histograms to the row's, its last CTA picks the digit; top-k reads the row only in the
  maximum pass (each chunk keeps its own top-k candidates), top-p alone twice more. Rows without top-k or
  top-p return at once.
- Every per-row setting is a device array and every launch's shape depends only on (B, V): the memset of
  the select scratch and the five launches can be captured in a CUDA graph.
"""

from __future__ import annotations

import numpy as np

from barerl.ops.cuda.build import load_kernel
from barerl.ops.cuda.launch import require

_CHUNK, _BINS = 4096, 2048  # must equal CHUNK and BINS in sampling.cu
_CHUNK_THREADS, _FINAL_THREADS = 256, 256  # must equal CHUNK_THREADS / FINAL_THREADS in sampling.cu
_ROW_SELECT_WORDS = 3  # sizeof(RowSelect) / 8 in sampling.cu
# CTAs of a select pass over the whole batch: about one resident wave on an H200 (132 SMs x 4 CTAs of 61
# registers), since most of them return at once, while a pass over whole rows (top-p alone) keeps ~4 per SM
_SELECT_CTAS = 512
_MAX_VOCAB = 2**21  # fixed-point masses of 2^42 each sum exactly in u64 (and in the top-p histograms)


def sample(logits, temperature, top_k, top_p, min_p, seeds, counters):
    """One token per row: logits (B, V) fp32, per-row settings (B,) -> tokens (B,) int32, logprobs (B,) fp32.

    The contract is ops.ref.sampling.sample's (temperature 0: greedy; top_k <= 0, top_p 1, min_p 0: off).
    """
    import cupy

    B, V = logits.shape
    require(V < _MAX_VOCAB, f"sample: vocabulary {V} must be below {_MAX_VOCAB}")
    logits = cupy.ascontiguousarray(logits, dtype=np.float32)
    temperature = cupy.asarray(temperature, dtype=np.float32)
    top_k = cupy.asarray(top_k, dtype=np.int32)
    top_p = cupy.asarray(top_p, dtype=np.float32)
    min_p = cupy.asarray(min_p, dtype=np.float32)
    seeds = cupy.asarray(seeds, dtype=np.uint64)
    counters = cupy.asarray(counters, dtype=np.int64)
    chunks = -(-V // _CHUNK)
    thr = cupy.empty(B, np.uint32)
    part_max, part_sum = (cupy.empty((B, chunks), np.float32) for _ in range(2))
    part_index = cupy.empty((B, chunks), np.int32)
    part_mass = cupy.empty((B, chunks), np.uint64)
    cand = cupy.empty((B, V), np.uint32)  # per-row candidate keys of the selects
    # the selects' row histograms (B, BINS), then their RowSelect states: zero, as the kernels expect
    select = cupy.zeros(B * (_BINS + _ROW_SELECT_WORDS), np.uint64)
    row_hists, rows = select[: B * _BINS], select[B * _BINS :]
    tokens = cupy.empty(B, np.int32)
    logprobs = cupy.empty(B, np.float32)
    if B == 0:
        return tokens, logprobs
    vocab = np.int32(V)
    load_kernel("sampling.cu", "sample_chunk_max")(
        (chunks, B), (_CHUNK_THREADS,),
        (logits, temperature, top_k, top_p, part_max, part_index, cand, row_hists, rows, thr, vocab))
    select_ctas = min(chunks, -(-_SELECT_CTAS // B))  # per row
    for select_pass in (1, 2):
        load_kernel("sampling.cu", "sample_select")(
            (select_ctas, B), (_CHUNK_THREADS,),
            (logits, temperature, top_k, top_p, part_max, cand, row_hists, rows, thr, vocab, np.int32(chunks),
             np.int32(select_pass)))
    load_kernel("sampling.cu", "sample_chunk_mass")(
        (chunks, B), (_CHUNK_THREADS,),
        (logits, temperature, min_p, thr, part_max, part_mass, part_sum, vocab))
    load_kernel("sampling.cu", "sample_finalize")(
        (B,), (_FINAL_THREADS,),
        (logits, temperature, min_p, thr, seeds, counters, part_max, part_index, part_mass, part_sum,
         tokens, logprobs, vocab, np.int32(chunks)))
    return tokens, logprobs
