"""paged_attention on the GPU: split-KV ("flash-decoding") attention over the paged KV cache.

Kernels: csrc/paged_attention.cu.

Design decisions:
- One kernel serves decode and prefill: a CTA takes one query token, the GROUP query heads of one kv head (so
  each K/V byte is read once per query token) and one of `num_splits` even parts of the keys that token sees.
  Decode (T == S, known from shapes alone) skips the search for each token's sequence. Prefill re-reads a
  sequence's keys once per query token (from L2 mostly): correct and simple; a tiled tensor-core prefill
  kernel would read them once per tile.
- A query whose keys are in several parts (splits, or a shared prefix's part) has them merged by the last of
  its CTAs to finish (csrc/attention_parts.cuh): no combine launch. The arrival counts start and end at zero.
- Cascade decode attention (a SharedPrefix: GRPO's samples of one prompt) reads a group's shared keys once:
  the same launch holds _PREFIX_CHUNKS CTAs per group and kv head after the members' own CTAs, whose token
  groups are the members; they run side by side with the members' CTAs and merge. Why one launch: the shared pass as a
  tensor-core kernel on a second stream (one warp per group) did not overlap the split kernel in a CUDA
  graph, and alone took 14.8 us at G1's shape against 38.5 us for the members' own keys (bench/RESULTS.md).
- num_splits depends only on shapes (T, K, the block table's width), never on context_lens' values, so a
  launch is the same in every replay of a CUDA graph: enough CTAs to give every SM several, each part at
  least _MIN_SPLIT_TOKENS long for the widest possible context. Parts past a short context are empty.
- Shapes the kernel does not cover (head_dim not a multiple of 16 bytes / over 32 vectors, more than 16 query
  heads per kv head) run the reference code on the same CuPy arrays.
"""

from __future__ import annotations

import math

import numpy as np

from barerl.backend.ref import nn as ref
from barerl.kernels.build import ctype, load_kernel
from barerl.kernels.kv_cache import token_stride
from barerl.kernels.launch import contiguous, multiprocessors, ptr, require

_THREADS = 128
_CTAS_PER_SM = 4  # split target, measured on the H200: 4 beats 2, 8 and 16 on 1 sequence x 32k
_UNSPLIT_CTAS_PER_SM = 2  # no split once T x K gives each SM this many: G1 (64 x 8) 44.8 us unsplit, 54.0 in 2
_MIN_SPLIT_TOKENS = 128
# the kernel's cp.async pipeline: tokens per token group and round, and rounds in its shared-memory ring
# (STAGES - 1 in flight; STAGES x UNROLL <= 10 fits the 48 KB of static shared memory at head_dim 128)
_UNROLL, _STAGES = 4, 2
# CTAs per shared-prefix group and kv head, each reading an even share of the group's shared keys: each of its
# token groups does a member's math for every key, so one CTA alone would outlast the members' own CTAs
_PREFIX_CHUNKS = 2


def covers(head_dim: int, group: int, cache_dtype) -> bool:
    """Whether paged_attention_split runs these shapes (else the reference code runs on the CuPy arrays)."""
    vec = 16 // np.dtype(cache_dtype).itemsize
    per_row = head_dim // vec
    return head_dim % vec == 0 and per_row <= 32 and per_row & (per_row - 1) == 0 and 1 <= group <= 16


def num_splits(num_tokens: int, num_kv_heads: int, max_context: int) -> int:
    """Parts per query token: fill the GPU when T x K alone does not, never parts under _MIN_SPLIT_TOKENS.
    A split costs a merge of the parts and a second wave of short CTAs, so T x K of a couple of CTAs per SM
    stays whole (bench/RESULTS.md, session 4)."""
    work = num_tokens * num_kv_heads
    if work >= _UNSPLIT_CTAS_PER_SM * multiprocessors():
        return 1
    target = _CTAS_PER_SM * multiprocessors()
    return max(1, min(math.ceil(target / work), math.ceil(max_context / _MIN_SPLIT_TOKENS)))


def paged_inputs(q, block_tables, context_lens, cu_seqlens_q):
    """A paged-attention kernel's inputs: q (read in place when it is a row-strided view of the fused qkv, else
    a dense copy) with its token stride, and the int32 device tables -> (q, q_stride, tables, lens, cu)."""
    import cupy

    i32 = np.int32
    q_stride = token_stride(q)
    if q_stride is None:
        q = contiguous(q)
        q_stride = q.shape[1] * q.shape[2]
    return (q, q_stride, contiguous(cupy.asarray(block_tables).astype(i32, copy=False)),
            cupy.asarray(context_lens).astype(i32, copy=False), cupy.asarray(cu_seqlens_q).astype(i32, copy=False))


def shares_prefixes(head_dim: int, cache_dtype) -> bool:
    """Whether the kernel's CTA has a token group for each of a shared-prefix group's members (NTG = 128 threads
    over head_dim / (16 bytes) threads a row: 8 at head_dim 128 in bf16)."""
    threads_per_row = head_dim * np.dtype(cache_dtype).itemsize // 16
    return _THREADS // threads_per_row >= ref.MAX_SHARED_PREFIX_MEMBERS


def paged_attention(q, k_cache, v_cache, block_tables, context_lens, cu_seqlens_q, scale, shared_prefix=None):
    """Causal attention of new query tokens against each sequence's cached keys and values.

    q (T, H, D) packed by cu_seqlens_q (S+1,); caches (num_blocks, block_size, K, D); block_tables
    (S, max_blocks) int32; context_lens (S,) counts cached tokens including the new ones; shared_prefix
    (backend.ref.SharedPrefix, decode steps): groups whose shared keys are read once per group (cascade), not
    checked here (the reference checks it). Returns o (T, H, D) in q's dtype (backend.ref.paged_attention).
    """
    import cupy

    T, H, D = q.shape
    _, block_size, K, Dc = k_cache.shape
    require(Dc == D and H % K == 0 and v_cache.shape == k_cache.shape,
            f"paged_attention: q {q.shape} does not fit caches {k_cache.shape} / {v_cache.shape}")
    if T == 0 or not covers(D, H // K, k_cache.dtype):
        return ref.paged_attention(q, k_cache, v_cache, block_tables, context_lens, cu_seqlens_q, scale)
    q, q_stride, block_tables, context_lens, cu_seqlens_q = paged_inputs(q, block_tables, context_lens,
                                                                         cu_seqlens_q)
    S, max_blocks = block_tables.shape
    splits = num_splits(T, K, max_blocks * block_size)
    cascade = shared_prefix is not None and T == S and shares_prefixes(D, k_cache.dtype)
    first_keys = group_sizes = None
    if cascade:
        first_keys, group_sizes = (cupy.asarray(a).astype(np.int32, copy=False) for a in shared_prefix[:2])
    out = cupy.empty((T, H, D), q.dtype)
    chunks = _PREFIX_CHUNKS if cascade else 0
    stride = splits + chunks  # parts a query may have: the splits of its own keys, the shared keys' chunks
    o_part = lse_part = arrivals = None
    if stride > 1:
        o_part = cupy.empty((T, H, stride, D), np.float32)
        lse_part = cupy.empty((T, H, stride), np.float32)
        arrivals = _arrivals(None if shared_prefix is None else shared_prefix.arrivals, T * K)
    i32 = np.int32
    defines = {"DTYPE": ctype(k_cache.dtype), "Q_T": ctype(q.dtype), "HEAD_DIM": D, "GROUP": H // K,
               "UNROLL": _UNROLL, "STAGES": _STAGES}
    kernel = load_kernel("paged_attention.cu", "paged_attention_split", defines)
    kernel((splits, K, T + chunks * -(-S // 2)), (_THREADS,),
           (q, k_cache, v_cache, block_tables, context_lens, cu_seqlens_q, ptr(first_keys), ptr(group_sizes), out,
            ptr(o_part), ptr(lse_part), ptr(arrivals), i32(S), i32(K), i32(block_size), i32(max_blocks),
            i32(splits), i32(stride), i32(chunks), i32(T == S), np.float32(scale * math.log2(math.e)),
            np.int64(q_stride)))
    return out


def _arrivals(given, count: int):
    """The kernel's arrival counts: `given` (a persistent zeroed scratch) when there is one, else fresh zeros."""
    import cupy

    if given is None:
        return cupy.zeros(count, np.int32)
    require(given.dtype == np.int32 and given.size >= count,
            f"paged_attention: shared_prefix.arrivals must be >= {count} int32 zeros, got {given.size} {given.dtype}")
    return given
