"""Fused per-head q/k RMSNorm + NeoX rotary launchers (csrc/qk_norm_rope.cu), compiled per head_dim."""

from __future__ import annotations

import numpy as np

from barerl.backend import ref
from barerl.kernels.build import ctype, load_kernel
from barerl.kernels.launch import (
    contiguous,
    finish_accumulation,
    fp32_accumulator,
    multiprocessors,
    ptr,
    require,
)

_WARPS = 4


def _setup(qkv, num_heads, num_kv_heads, cos, kernel_name):
    heads = num_heads + 2 * num_kv_heads
    head_dim = qkv.shape[1] // heads
    require(
        qkv.ndim == 2 and head_dim * heads == qkv.shape[1],
        f"qk_norm_rope: qkv shape {qkv.shape} is not (T, ({num_heads} + 2 x {num_kv_heads}) x head_dim)",
    )
    require(
        cos.shape[-1] == head_dim // 2, f"qk_norm_rope: cos/sin last axis {cos.shape[-1]} != {head_dim // 2}"
    )
    kernel = load_kernel("qk_norm_rope.cu", kernel_name, {"DTYPE": ctype(qkv.dtype), "HEAD_DIM": head_dim})
    warp_items = qkv.shape[0] * (heads if kernel_name == "qk_norm_rope_forward" else 1)  # see the .cu Launch
    grid = max(1, min(-(-warp_items // _WARPS), multiprocessors() * 16))
    return kernel, (grid,), (32 * _WARPS,)


def _kernel_handles(qkv, num_heads, num_kv_heads) -> bool:
    """The kernel's lanes cover head_dim in steps of 64; other head sizes run the reference on CuPy."""
    return (qkv.shape[1] // (num_heads + 2 * num_kv_heads)) % 64 == 0


def _table(x):
    return contiguous(x.astype(np.float32, copy=False))


def qk_norm_rope(qkv, positions, cos, sin, num_heads, num_kv_heads, q_norm=None, k_norm=None, eps=1e-6):
    """Normalise each q and k head (when q_norm/k_norm are given), then rotate q and k; v passes through.

    Returns out (T, (H + 2K) * D) in qkv's dtype, q_rstd (T, H) and k_rstd (T, K) fp32 (empty without norm).
    """
    import cupy

    if not _kernel_handles(qkv, num_heads, num_kv_heads):
        return ref.qk_norm_rope(qkv, positions, cos, sin, num_heads, num_kv_heads, q_norm, k_norm, eps)
    qkv = contiguous(qkv)
    tokens = qkv.shape[0]
    kernel, grid, block = _setup(qkv, num_heads, num_kv_heads, cos, "qk_norm_rope_forward")
    has_norm = q_norm is not None
    q_rstd = cupy.empty((tokens, num_heads if has_norm else 0), np.float32)
    k_rstd = cupy.empty((tokens, num_kv_heads if has_norm else 0), np.float32)
    out = cupy.empty_like(qkv)
    norms = [contiguous(n.astype(qkv.dtype, copy=False)) if has_norm else None for n in (q_norm, k_norm)]
    if tokens:
        kernel(
            grid,
            block,
            (
                out,
                q_rstd,
                k_rstd,
                qkv,
                contiguous(positions.astype(np.int32, copy=False)),
                _table(cos),
                _table(sin),
                ptr(norms[0]),
                ptr(norms[1]),
                np.int32(tokens),
                np.int32(num_heads),
                np.int32(num_kv_heads),
                np.float32(eps),
            ),
        )
    return out, q_rstd, k_rstd


def qk_norm_rope_backward(
    dout, qkv, positions, cos, sin, num_heads, num_kv_heads, q_norm, k_norm, q_rstd, k_rstd, dq_norm, dk_norm
):
    """Gradient of `qk_norm_rope` with respect to qkv; dq_norm, dk_norm (D,) are accumulated."""
    import cupy

    if not _kernel_handles(qkv, num_heads, num_kv_heads):
        return ref.qk_norm_rope_backward(dout, qkv, positions, cos, sin, num_heads, num_kv_heads, q_norm, k_norm,
                                         q_rstd, k_rstd, dq_norm, dk_norm)
    qkv = contiguous(qkv)
    dout = contiguous(dout.astype(qkv.dtype, copy=False))
    tokens = qkv.shape[0]
    kernel, grid, block = _setup(qkv, num_heads, num_kv_heads, cos, "qk_norm_rope_backward")
    has_norm = q_norm is not None
    dqkv = cupy.empty_like(qkv)
    acc_q = fp32_accumulator(dq_norm) if has_norm else None
    acc_k = fp32_accumulator(dk_norm) if has_norm else None
    norms = [contiguous(n.astype(qkv.dtype, copy=False)) if has_norm else None for n in (q_norm, k_norm)]
    if tokens:
        kernel(
            grid,
            block,
            (
                dqkv,
                ptr(acc_q),
                ptr(acc_k),
                dout,
                qkv,
                contiguous(positions.astype(np.int32, copy=False)),
                _table(cos),
                _table(sin),
                ptr(norms[0]),
                ptr(norms[1]),
                ptr(contiguous(q_rstd) if has_norm else None),
                ptr(contiguous(k_rstd) if has_norm else None),
                np.int32(tokens),
                np.int32(num_heads),
                np.int32(num_kv_heads),
            ),
        )
    if has_norm:
        finish_accumulation(dq_norm, acc_q)
        finish_accumulation(dk_norm, acc_k)
    return dqkv
