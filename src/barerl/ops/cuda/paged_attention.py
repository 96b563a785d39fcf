"""paged_attention on the GPU: split-KV ("flash-decoding") decode attention over the paged KV cache, its
batch-invariant variant, and tiled prefill against the cache.

Kernels: csrc/paged_attention.cu (split-KV); the batch-invariant decode kernel and the tiled prefill kernel are
in csrc/attention.cu, beside the training forward's tile code that they run (a query row goes through the same
operations in all three).

Design decisions:
- Decode (T == S, known from shapes alone, so no host sync) takes the split-KV kernel, or with `batch_invariant`
  the invariant one: a warp per (sequence, kv head), or where those pairs are too few to fill the GPU (a few
  long sequences), four warps sharing each pair's tiles (keys split for the scores, columns for P V, the same
  bits). A CTA of the split-KV kernel takes one query token, the GROUP query heads of one kv head
  (so each K/V byte is read once per query token) and one of `num_splits` even parts of the keys it sees.
- Anything else (chunked prefill, prefix-cache hits, continued conversations, decode rows mixed in) runs as
  training does, in either setting: sequences with several new tokens through paged_prefill_attention (tiles
  of query rows at training's positions, so each key is read once per tile and a row is bitwise its training
  row), single new tokens through the invariant decode kernel. The split-KV kernel read a sequence's keys once
  per query token: a 64-token turn after 1,088 cached tokens cost 94.4 ms against 16.6 ms fresh (docs/LOG.md).
- num_splits depends only on shapes (T, K, the block table's width), never on context_lens' values, so a
  launch is the same in every replay of a CUDA graph: enough CTAs to give every SM several, each part at
  least _MIN_SPLIT_TOKENS long for the widest possible context. Parts past a short context are empty.
- The split kernel's cache geometry (kv heads, block size) is compiled in, one build per model and block size,
  so a key's address costs no division: the loop was issue-bound as much as memory-bound (docs/LOG.md, 1648e5b).
- Shapes the kernels do not cover (head_dim not a multiple of 16 bytes / over 32 vectors, more than 16 query
  heads per kv head; fp32 for the tensor-core kernels) run the split kernel, else the reference code on the same
  CuPy arrays.
"""

from __future__ import annotations

import math

import numpy as np

from barerl.ops import ref
from barerl.ops.cuda.attention import CONFIG as ATTENTION_CONFIG
from barerl.ops.cuda.attention import (
    LOG2E,
    attention_defines,
    forward_block_rows,
    forward_shared_bytes,
    tensor_cores_cover,
)
from barerl.ops.cuda.build import ctype, load_kernel
from barerl.ops.cuda.kv_cache import token_stride
from barerl.ops.cuda.launch import contiguous, multiprocessors, require, reserve_shared_memory

_THREADS = 128
_CTAS_PER_SM = 4  # split target, measured on the H200: 4 beats 2, 8 and 16 on 1 sequence x 32k
# no split once T x K gives each SM this many: G1 (64 x 8) 44.8 us unsplit, 54.0 in 2 (4feb27a), 50.4 in 2 with
# the UNROLL 2 ring that fits them in one wave (f01d4a1)
_UNSPLIT_CTAS_PER_SM = 2
_MIN_SPLIT_TOKENS = 128
# the kernel's cp.async pipeline: tokens per token group and round, and rounds in its shared-memory ring
# (STAGES - 1 in flight; STAGES x UNROLL <= 10 fits the 48 KB of static shared memory at head_dim 128)
_UNROLL, _STAGES = 4, 2
# the invariant decode: one warp a (sequence, kv head) pair while the pairs give every SM this many (G1's 64 x 8 on
# 132 SMs: four one-warp CTAs an SM, one wave), else INV_WARPS warps a pair (csrc/attention.cu; L1's 16 x 8)
_INVARIANT_PAIRS_PER_SM = 2
MAX_QUERY_TOKENS = 65535  # a grid's y and z extents: one CTA row per query token (engine steps hold 8,192)


def _supported(head_dim: int, group: int, cache_dtype) -> bool:
    vec = 16 // np.dtype(cache_dtype).itemsize
    per_row = head_dim // vec
    return head_dim % vec == 0 and per_row <= 32 and per_row & (per_row - 1) == 0 and 1 <= group <= 16


def num_splits(num_tokens: int, num_kv_heads: int, max_context: int) -> int:
    """Parts per query token: fill the GPU when T x K alone does not, never parts under _MIN_SPLIT_TOKENS.
    A split costs a combine pass and a second wave of short CTAs, so T x K of a couple of CTAs per SM stays
    whole (docs/LOG.md, 4feb27a)."""
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


def paged_attention(q, k_cache, v_cache, block_tables, context_lens, cu_seqlens_q, scale, batch_invariant=False):
    """Causal attention of new query tokens against each sequence's cached keys and values.

    q (T, H, D) packed by cu_seqlens_q (S+1,); caches (num_blocks, block_size, K, D); block_tables
    (S, max_blocks) int32; context_lens (S,) counts cached tokens including the new ones. Returns o (T, H, D)
    in q's dtype (the contract of ops.ref.paged_attention). `batch_invariant`: a token's output is bitwise
    the one `attention` gives it in its packed sequence, whatever else is in the batch; so is every output of a
    step that is not pure decode, in either setting (the kernels of attention.cu that share the training
    forward's tile code). Pure decode without it takes the split-KV kernel of paged_attention.cu.
    """
    decode = q.shape[0] == cu_seqlens_q.shape[0] - 1
    if not _tiles_cover(q, k_cache) or (decode and not batch_invariant):
        return _paged_attention_split(q, k_cache, v_cache, block_tables, context_lens, cu_seqlens_q, scale)
    return _paged_attention_tiled(q, k_cache, v_cache, block_tables, context_lens, cu_seqlens_q, scale)


def _tiles_cover(q, k_cache) -> bool:
    """Whether the tensor-core kernels of attention.cu take these inputs (16 query heads per kv head at most)."""
    H, K = q.shape[1], k_cache.shape[2]
    return tensor_cores_cover(q) and k_cache.dtype == q.dtype and H % K == 0 and H // K <= 16


def _paged_attention_split(q, k_cache, v_cache, block_tables, context_lens, cu_seqlens_q, scale):
    """The split-KV kernel (csrc/paged_attention.cu): fast, its sums' order depends on the split."""
    import cupy

    T, H, D = q.shape
    _, block_size, K, Dc = k_cache.shape
    require(Dc == D and H % K == 0 and v_cache.shape == k_cache.shape,
            f"paged_attention: q {q.shape} does not fit caches {k_cache.shape} / {v_cache.shape}")
    group = H // K
    if T == 0 or not _supported(D, group, k_cache.dtype):
        return ref.paged_attention(q, k_cache, v_cache, block_tables, context_lens, cu_seqlens_q, scale)
    i32 = np.int32
    q, q_stride, block_tables, context_lens, cu_seqlens_q = paged_inputs(q, block_tables, context_lens,
                                                                         cu_seqlens_q)
    S, max_blocks = block_tables.shape
    require(T <= MAX_QUERY_TOKENS, f"paged_attention: {T} query tokens in one call, more than a grid holds "
            f"({MAX_QUERY_TOKENS}): lower the engine's max_num_batched_tokens")
    splits = num_splits(T, K, max_blocks * block_size)
    defines = {"DTYPE": ctype(k_cache.dtype), "Q_T": ctype(q.dtype), "HEAD_DIM": D, "GROUP": group,
               "KV_HEADS": K, "BLOCK_SIZE": block_size, "UNROLL": _UNROLL, "STAGES": _STAGES}
    out = cupy.empty((T, H, D), q.dtype)
    o_part = cupy.empty((T, H, splits, D), np.float32) if splits > 1 else out
    lse_part = cupy.empty((T, H, splits), np.float32) if splits > 1 else out
    kernel = load_kernel("paged_attention.cu", "paged_attention_split", defines)
    kernel((splits, K, T), (_THREADS,),
           (q, k_cache, v_cache, block_tables, context_lens, cu_seqlens_q, out, o_part, lse_part, i32(S),
            i32(max_blocks), i32(splits), i32(T == S),
            np.float32(scale * math.log2(math.e)), np.int64(q_stride)))
    if splits > 1:
        combine = load_kernel("paged_attention.cu", "paged_attention_combine", defines)
        combine((T * H,), (64 if D <= 64 else 128,), (o_part, lse_part, out, i32(splits)))
    return out


def _paged_attention_tiled(q, k_cache, v_cache, block_tables, context_lens, cu_seqlens_q, scale):
    """`paged_attention` (same contract) whose output for a query token is bitwise the one `attention` gives
    that token in its packed sequence, whatever else is in the batch: engine and trainer compute the same
    log-probs. Sequences with one new token: one warp per (sequence, kv head) walks all the token's keys (no
    split), suited to many sequences (rollouts), not one long one. Sequences with several (unless the step is
    pure decode): tiles of query rows as in training (paged_prefill_attention)."""
    import cupy

    T, H, D = q.shape
    _, block_size, K, _ = k_cache.shape
    require(k_cache.shape[3] == D and v_cache.shape == k_cache.shape,
            f"paged_attention: q {q.shape} does not fit caches {k_cache.shape} / {v_cache.shape}")
    i32 = np.int32
    q, q_stride, block_tables, context_lens, cu_seqlens_q = paged_inputs(q, block_tables, context_lens,
                                                                         cu_seqlens_q)
    out = cupy.empty((T, H, D), q.dtype)
    if T == 0:
        return out
    S, max_blocks = block_tables.shape
    decode = T == S
    defines = attention_defines(q.dtype, D)
    tables = (out, q, k_cache, v_cache, block_tables, context_lens, cu_seqlens_q)
    geometry = (i32(H), i32(K), i32(block_size), i32(max_blocks))
    if not decode:
        prefill = load_kernel("attention.cu", "paged_prefill_attention", defines)
        smem = reserve_shared_memory(prefill, forward_shared_bytes(D, q.dtype))
        prefill((-(-T // forward_block_rows()) + 2 * S, H), (32 * ATTENTION_CONFIG["fwd_warps"],),
                (*tables, i32(S), *geometry, np.int64(q_stride), np.float32(scale * LOG2E)), shared_mem=smem)
    name, threads, smem = _invariant_decode(S * K, D, q.dtype)
    single = load_kernel("attention.cu", name, defines)
    single((K, S), (threads,), (*tables, *geometry, i32(decode), np.int64(q_stride), np.float32(scale * LOG2E)),
           shared_mem=reserve_shared_memory(single, smem))
    return out


def _invariant_decode(pairs: int, head_dim: int, dtype) -> tuple[str, int, int]:
    """The invariant decode kernel for this many (sequence, kv head) pairs: its name, threads and dynamic shared
    memory. One warp a pair while the pairs give every SM _INVARIANT_PAIRS_PER_SM; fewer pairs (a few long
    sequences) share each pair's tiles among INV_WARPS warps, with the same bits."""
    row_bytes, keys = (head_dim + 8) * np.dtype(dtype).itemsize, ATTENTION_CONFIG["fwd_bn"]
    if pairs >= _INVARIANT_PAIRS_PER_SM * multiprocessors():
        return "paged_attention_invariant", 32, (16 + 3 * keys) * row_bytes  # Q and a ring of 3 K or V tiles
    warps = min(4, keys // 16)  # csrc/attention.cu's INV_WARPS
    # Q, INV_STAGES = 3 stages of K and V tiles, a tile's fp32 scores
    return "paged_attention_invariant_warps", 32 * warps, (16 + 6 * keys) * row_bytes + keys * 16 * 4
