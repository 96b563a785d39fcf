"""Attention of new query tokens against each sequence's paged KV cache (the engine's decode and prefill).

The conventions every op follows (packing, fp32 arithmetic, accumulated gradients) are `barerl.ops.ref`'s.
"""

from __future__ import annotations

import numpy as np

from barerl.ops.common import as_f32, xp_of
from barerl.ops.ref.attention import expand_kv, segments

__all__ = ["paged_attention"]


def paged_attention(q, k_cache, v_cache, block_tables, context_lens, cu_seqlens_q, scale, batch_invariant=False):
    """Causal attention of new query tokens against each sequence's cached keys and values.

    q (T, H, D): the new tokens of S sequences, packed by cu_seqlens_q (S+1,). Their keys and values are
    already in the caches (num_blocks, block_size, K, D). block_tables (S, max_blocks) int32 maps each
    sequence's logical blocks to physical ones; context_lens (S,) counts its cached tokens including the
    new ones. Query i of a sequence with n new tokens sits at position context_len - n + i and sees keys
    0..that position. Returns o (T, H, D) in q's dtype.

    batch_invariant: the CUDA twin then gives a token bitwise the output `attention` gives it in its packed
    sequence, whatever else is in the batch; the reference is that math already.
    """
    xp = xp_of(q)
    T, H, D = q.shape
    block_size, K = k_cache.shape[1], k_cache.shape[2]
    group = H // K
    o = xp.zeros((T, H, D), np.float32)
    tables = block_tables.get() if hasattr(block_tables, "get") else np.asarray(block_tables)
    lens = context_lens.get() if hasattr(context_lens, "get") else np.asarray(context_lens)
    for s, (a, b) in enumerate(segments(cu_seqlens_q)):
        ctx = int(lens[s])
        nblocks = -(-ctx // block_size)
        blocks = xp.asarray(tables[s, :nblocks])
        ks = k_cache[blocks].reshape(-1, K, D)[:ctx]
        vs = v_cache[blocks].reshape(-1, K, D)[:ctx]
        qs = as_f32(q[a:b]).transpose(1, 0, 2)  # (H, n, D)
        scores = (qs @ expand_kv(as_f32(ks), group).transpose(0, 2, 1)) * np.float32(scale)  # (H, n, ctx)
        qpos = ctx - (b - a) + xp.arange(b - a)
        scores = xp.where(xp.arange(ctx)[None, :] <= qpos[:, None], scores, -np.inf)
        p = xp.exp(scores - scores.max(axis=-1, keepdims=True))
        p /= p.sum(axis=-1, keepdims=True)
        o[a:b] = (p @ expand_kv(as_f32(vs), group)).transpose(1, 0, 2)
    return o.astype(q.dtype, copy=False)
