"""Causal attention over packed variable-length sequences with grouped-query heads, forward and backward.

The conventions every op follows (packing, fp32 arithmetic, accumulated gradients) are `barerl.ops.ref`'s.
"""

from __future__ import annotations

import itertools

import numpy as np

from barerl.ops.common import as_f32, xp_of

__all__ = ["attention", "attention_backward"]


def segments(cu_seqlens):
    """[(start, end)] of each packed sequence, on the host."""
    cu = [int(c) for c in (cu_seqlens.get() if hasattr(cu_seqlens, "get") else cu_seqlens)]
    return list(itertools.pairwise(cu))


def expand_kv(x, group):
    """(L, K, D) -> (K*group, L, D): each kv head repeated for the `group` query heads that share it."""
    return x.transpose(1, 0, 2).repeat(group, axis=0)


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
        qs = as_f32(q[a:b]).transpose(1, 0, 2)  # (H, L, D)
        ks, vs = expand_kv(as_f32(k[a:b]), group), expand_kv(as_f32(v[a:b]), group)
        scores = (qs @ ks.transpose(0, 2, 1)) * np.float32(scale)  # (H, L, L)
        L = b - a
        scores = xp.where(xp.tril(xp.ones((L, L), dtype=bool)), scores, -np.inf)
        m = scores.max(axis=-1, keepdims=True)
        p = xp.exp(scores - m)
        denom = p.sum(axis=-1, keepdims=True)
        o[a:b] = ((p / denom) @ vs).transpose(1, 0, 2)
        lse[:, a:b] = (m + xp.log(denom))[..., 0]
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
        qs = as_f32(q[a:b]).transpose(1, 0, 2)
        ks, vs = expand_kv(as_f32(k[a:b]), group), expand_kv(as_f32(v[a:b]), group)
        dos, os_ = as_f32(do[a:b]).transpose(1, 0, 2), as_f32(o[a:b]).transpose(1, 0, 2)
        scores = (qs @ ks.transpose(0, 2, 1)) * np.float32(scale)
        p = xp.where(xp.tril(xp.ones((L, L), dtype=bool)), xp.exp(scores - lse[:, a:b, None]), 0.0)
        dvs = p.transpose(0, 2, 1) @ dos  # (H, L, D)
        dp = dos @ vs.transpose(0, 2, 1)
        delta = (dos * os_).sum(axis=-1, keepdims=True)
        ds = p * (dp - delta) * np.float32(scale)
        dq[a:b] = (ds @ ks).transpose(1, 0, 2)
        dks = ds.transpose(0, 2, 1) @ qs  # (H, L, D)
        dk[a:b] = dks.reshape(K, group, L, D).sum(axis=1).transpose(1, 0, 2)
        dv[a:b] = dvs.reshape(K, group, L, D).sum(axis=1).transpose(1, 0, 2)
    return xp.concatenate([dq.reshape(T, -1), dk.reshape(T, -1), dv.reshape(T, -1)], axis=1).astype(q.dtype)
