"""Causal attention over packed variable-length sequences with grouped-query heads, forward and backward.

The conventions every op follows (packing, fp32 arithmetic, accumulated gradients) are `barerl.ops.ref`'s.
"""

from __future__ import annotations

import itertools

import numpy as np

from barerl.ops.common import as_f32, xp_of

__all__ = ["attention", "attention_backward"]

QUERY_CHUNK = 1024  # query rows per pass of the attention ops: bounds their scores to (H, chunk, L)


def segments(cu_seqlens):
    """[(start, end)] of each packed sequence, on the host."""
    cu = [int(c) for c in (cu_seqlens.get() if hasattr(cu_seqlens, "get") else cu_seqlens)]
    return list(itertools.pairwise(cu))


def expand_kv(x, group):
    """(L, K, D) -> (K*group, L, D): each kv head repeated for the `group` query heads that share it."""
    return x.transpose(1, 0, 2).repeat(group, axis=0)


def query_chunks(length: int):
    """(first, stop) rows of a sequence's query chunks: a chunk's scores are (H, rows, stop) fp32, so a 16K-token
    sequence never needs its whole (H, L, L) (34 GB at 32 heads)."""
    return [(q0, min(q0 + QUERY_CHUNK, length)) for q0 in range(0, length, QUERY_CHUNK)]


def causal(xp, q0: int, q1: int):
    """(q1 - q0, q1) mask: query row q0 + i sees keys 0 .. q0 + i."""
    return xp.arange(q1)[None, :] <= xp.arange(q0, q1)[:, None]


def attention(q, k, v, cu_seqlens, scale):
    """Causal softmax(q k^T * scale) v within each sequence.

    q (T, H, D), k and v (T, K, D) with H % K == 0, cu_seqlens (S+1,) int32.
    Returns o (T, H, D) in q's dtype and lse (H, T) fp32, the log-sum-exp of each row's scaled scores.
    """
    xp = xp_of(q)
    T, H, D = q.shape
    group = H // k.shape[1]
    o = xp.zeros((T, H, D), np.float32)
    lse = xp.zeros((H, T), np.float32)
    for a, b in segments(cu_seqlens):
        ks, vs = expand_kv(as_f32(k[a:b]), group), expand_kv(as_f32(v[a:b]), group)  # (H, L, D)
        for q0, q1 in query_chunks(b - a):
            qs = as_f32(q[a + q0 : a + q1]).transpose(1, 0, 2)  # (H, rows, D)
            scores = (qs @ ks[:, :q1].transpose(0, 2, 1)) * np.float32(scale)  # (H, rows, q1)
            scores = xp.where(causal(xp, q0, q1), scores, -np.inf)
            m = scores.max(axis=-1, keepdims=True)
            p = xp.exp(scores - m)
            denom = p.sum(axis=-1, keepdims=True)
            o[a + q0 : a + q1] = ((p / denom) @ vs[:, :q1]).transpose(1, 0, 2)
            lse[:, a + q0 : a + q1] = (m + xp.log(denom))[..., 0]
    return o.astype(q.dtype, copy=False), lse


def attention_backward(do, q, k, v, o, lse, cu_seqlens, scale):
    """Gradient of `attention`, recomputing the probabilities from lse. Returns dqkv (T, (H + 2K) D) in q's
    dtype: dq, dk and dv side by side per token, the layout of the fused qkv rows that q, k, v are views of."""
    xp = xp_of(q)
    T, H, D = q.shape
    K = k.shape[1]
    group = H // K
    dq = xp.zeros((T, H, D), np.float32)
    dk = xp.zeros((T, K, D), np.float32)
    dv = xp.zeros((T, K, D), np.float32)
    for a, b in segments(cu_seqlens):
        L = b - a
        ks, vs = expand_kv(as_f32(k[a:b]), group), expand_kv(as_f32(v[a:b]), group)
        dks, dvs = xp.zeros((H, L, D), np.float32), xp.zeros((H, L, D), np.float32)
        for q0, q1 in query_chunks(L):
            rows = slice(a + q0, a + q1)
            qs = as_f32(q[rows]).transpose(1, 0, 2)
            dos, os_ = as_f32(do[rows]).transpose(1, 0, 2), as_f32(o[rows]).transpose(1, 0, 2)
            scores = (qs @ ks[:, :q1].transpose(0, 2, 1)) * np.float32(scale)
            p = xp.where(causal(xp, q0, q1), xp.exp(scores - lse[:, rows, None]), 0.0)
            dvs[:, :q1] += p.transpose(0, 2, 1) @ dos  # (H, q1, D)
            dp = dos @ vs[:, :q1].transpose(0, 2, 1)
            delta = (dos * os_).sum(axis=-1, keepdims=True)
            ds = p * (dp - delta) * np.float32(scale)
            dq[rows] = (ds @ ks[:, :q1]).transpose(1, 0, 2)
            dks[:, :q1] += ds.transpose(0, 2, 1) @ qs
        dk[a:b] = dks.reshape(K, group, L, D).sum(axis=1).transpose(1, 0, 2)
        dv[a:b] = dvs.reshape(K, group, L, D).sum(axis=1).transpose(1, 0, 2)
    return xp.concatenate([dq.reshape(T, -1), dk.reshape(T, -1), dv.reshape(T, -1)], axis=1).astype(q.dtype)
