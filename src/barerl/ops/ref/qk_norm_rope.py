"""Per-head q/k RMSNorm (Qwen3) and the rotary embedding (NeoX half-split), fused; the engine's variant also
writes the rotated keys and the values into the paged KV cache.

The conventions every op follows (packing, fp32 arithmetic, accumulated gradients) are `barerl.ops.ref`'s.
"""

from __future__ import annotations

import numpy as np

from barerl.ops.common import as_f32, xp_of
from barerl.ops.ref.kv_cache import store_kv
from barerl.ops.ref.rmsnorm import rmsnorm, rmsnorm_backward

__all__ = ["qk_norm_rope", "qk_norm_rope_backward", "qk_norm_rope_store"]


def _heads(qkv, num_heads, num_kv_heads):
    """Split (T, (H + 2K) * D) into q (T, H, D), k (T, K, D), v (T, K, D) fp32 copies."""
    T = qkv.shape[0]
    D = qkv.shape[1] // (num_heads + 2 * num_kv_heads)
    x = as_f32(qkv).reshape(T, num_heads + 2 * num_kv_heads, D)
    return x[:, :num_heads], x[:, num_heads : num_heads + num_kv_heads], x[:, num_heads + num_kv_heads :]


def _rotate(x, cos, sin):
    """NeoX rotation of x (T, H, D) by angle tables cos/sin (T, D/2)."""
    h = x.shape[-1] // 2
    c, s = cos[:, None, :], sin[:, None, :]
    x1, x2 = x[..., :h], x[..., h:]
    return x1 * c - x2 * s, x2 * c + x1 * s


def _unrotate(dy, cos, sin):
    """Transpose of `_rotate` (its gradient)."""
    h = dy.shape[-1] // 2
    c, s = cos[:, None, :], sin[:, None, :]
    d1, d2 = dy[..., :h], dy[..., h:]
    return d1 * c + d2 * s, d2 * c - d1 * s


def qk_norm_rope(qkv, positions, cos, sin, num_heads, num_kv_heads, q_norm=None, k_norm=None, eps=1e-6):
    """Normalise each q and k head (when q_norm/k_norm are given), then rotate q and k; v passes through.

    qkv (T, (H + 2K) * D); positions (T,) int32; cos, sin (P, D/2) fp32 tables; q_norm, k_norm (D,) or None.
    Returns out (T, (H + 2K) * D) in qkv's dtype, q_rstd (T, H) and k_rstd (T, K) fp32 (empty without norm).
    """
    xp = xp_of(qkv)
    q, k, v = _heads(qkv, num_heads, num_kv_heads)
    c, s = cos[positions], sin[positions]
    q_rstd = xp.zeros((qkv.shape[0], 0), np.float32)
    k_rstd = q_rstd
    if q_norm is not None:
        q, q_rstd = rmsnorm(q, q_norm, eps)
        k, k_rstd = rmsnorm(k, k_norm, eps)
    q = xp.concatenate(_rotate(q, c, s), axis=-1)
    k = xp.concatenate(_rotate(k, c, s), axis=-1)
    out = xp.concatenate([q, k, v], axis=1).reshape(qkv.shape)
    return out.astype(qkv.dtype, copy=False), q_rstd, k_rstd


def qk_norm_rope_backward(
    dout, qkv, positions, cos, sin, num_heads, num_kv_heads, q_norm, k_norm, q_rstd, k_rstd, dq_norm, dk_norm
):
    """Gradient of `qk_norm_rope` with respect to qkv; dq_norm, dk_norm (D,) are accumulated (None: frozen)."""
    xp = xp_of(dout)
    dq, dk, dv = _heads(dout, num_heads, num_kv_heads)
    c, s = cos[positions], sin[positions]
    dq = xp.concatenate(_unrotate(dq, c, s), axis=-1)
    dk = xp.concatenate(_unrotate(dk, c, s), axis=-1)
    if q_norm is not None:
        q, k, _ = _heads(qkv, num_heads, num_kv_heads)
        dq = rmsnorm_backward(dq, q, q_norm, q_rstd, dq_norm)
        dk = rmsnorm_backward(dk, k, k_norm, k_rstd, dk_norm)
    return xp.concatenate([dq, dk, dv], axis=1).reshape(qkv.shape).astype(qkv.dtype, copy=False)


def qk_norm_rope_store(
    qkv, positions, cos, sin, num_heads, num_kv_heads, q_norm, k_norm, eps, k_cache, v_cache, slot_mapping
):
    """`qk_norm_rope`, then `store_kv` of its rotated k and its v (the engine's decode path: one kernel on
    the GPU). Returns what `qk_norm_rope` returns."""
    out, q_rstd, k_rstd = qk_norm_rope(qkv, positions, cos, sin, num_heads, num_kv_heads, q_norm, k_norm, eps)
    T, D = out.shape[0], out.shape[1] // (num_heads + 2 * num_kv_heads)
    kv = out[:, num_heads * D :].reshape(T, 2, num_kv_heads, D)
    store_kv(kv[:, 0], kv[:, 1], k_cache, v_cache, slot_mapping)
    return out, q_rstd, k_rstd
