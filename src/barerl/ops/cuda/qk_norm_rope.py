"""Fused per-head q/k RMSNorm + NeoX rotary launchers (csrc/qk_norm_rope.cu), compiled per head_dim.

`qk_norm_rope_store` is the engine's variant: the same forward kernel, given the layer's KV caches, also
writes each token's rotated k and its v into its cache slot, sparing the decode step a store_kv per layer.
"""

from __future__ import annotations

import numpy as np

from barerl.ops import ref
from barerl.ops.cuda.build import ctype, load_kernel
from barerl.ops.cuda.kv_cache import store_kv
from barerl.ops.cuda.launch import (
    contiguous,
    finish_accumulation,
    fp32_accumulator,
    multiprocessors,
    ptr,
    require,
)

_WARPS = 4


def _setup(qkv, num_heads, num_kv_heads, cos, kernel_name, cache_dtype=None):
    heads = num_heads + 2 * num_kv_heads
    head_dim = qkv.shape[1] // heads
    require(
        qkv.ndim == 2 and head_dim * heads == qkv.shape[1],
        f"qk_norm_rope: qkv shape {qkv.shape} is not (T, ({num_heads} + 2 x {num_kv_heads}) x head_dim)",
    )
    require(
        cos.shape[-1] == head_dim // 2, f"qk_norm_rope: cos/sin last axis {cos.shape[-1]} != {head_dim // 2}"
    )
    cache_dtype = qkv.dtype if cache_dtype is None else cache_dtype  # a dtype is falsy: no `or`
    defines = {"DTYPE": ctype(qkv.dtype), "HEAD_DIM": head_dim, "CACHE_T": ctype(cache_dtype)}
    kernel = load_kernel("qk_norm_rope.cu", kernel_name, defines)
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
    if not _kernel_handles(qkv, num_heads, num_kv_heads):
        return ref.qk_norm_rope(qkv, positions, cos, sin, num_heads, num_kv_heads, q_norm, k_norm, eps)
    return _forward(qkv, positions, cos, sin, num_heads, num_kv_heads, q_norm, k_norm, eps)


def qk_norm_rope_store(
    qkv, positions, cos, sin, num_heads, num_kv_heads, q_norm, k_norm, eps, k_cache, v_cache, slot_mapping
):
    """`qk_norm_rope`, and each token's rotated k and its v written into the caches (num_blocks, block_size,
    K, D) at its flat slot (slot -1 skips), in the cache dtype, as `store_kv` would from out. Returns as
    `qk_norm_rope`."""
    import cupy

    head_dim = qkv.shape[1] // (num_heads + 2 * num_kv_heads)
    if not _kernel_handles(qkv, num_heads, num_kv_heads):  # then the store_kv kernel: ref's store would sync
        # with the host, and decode steps are captured in CUDA graphs
        rotated = qk_norm_rope(qkv, positions, cos, sin, num_heads, num_kv_heads, q_norm, k_norm, eps)
        kv = rotated[0][:, num_heads * head_dim :].reshape(-1, 2, num_kv_heads, head_dim)
        store_kv(kv[:, 0], kv[:, 1], k_cache, v_cache, slot_mapping)
        return rotated
    require(k_cache.shape == v_cache.shape and k_cache.dtype == v_cache.dtype
            and k_cache.shape[2:] == (num_kv_heads, head_dim),
            f"qk_norm_rope_store: caches {k_cache.shape} {k_cache.dtype} / {v_cache.shape} {v_cache.dtype} "
            f"are not (num_blocks, block_size, {num_kv_heads}, {head_dim}) of one dtype")
    require(k_cache.flags.c_contiguous and v_cache.flags.c_contiguous,
            "qk_norm_rope_store: caches must be contiguous")
    slots = cupy.asarray(slot_mapping).astype(np.int32, copy=False)  # no copy (CUDA-graph capture) when int32
    require(slots.shape == qkv.shape[:1], f"qk_norm_rope_store: {slots.shape} slots, {qkv.shape[0]} tokens")
    return _forward(qkv, positions, cos, sin, num_heads, num_kv_heads, q_norm, k_norm, eps,
                    (k_cache, v_cache, contiguous(slots)))


def _forward(qkv, positions, cos, sin, num_heads, num_kv_heads, q_norm, k_norm, eps, caches=None):
    """The forward kernel's launch; caches = (k_cache, v_cache, slot_mapping) also stores k and v."""
    import cupy

    qkv = contiguous(qkv)
    tokens = qkv.shape[0]
    k_cache, v_cache, slots = caches or (None, None, None)
    cache_dtype = None if k_cache is None else k_cache.dtype
    kernel, grid, block = _setup(qkv, num_heads, num_kv_heads, cos, "qk_norm_rope_forward", cache_dtype)
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
                ptr(k_cache),
                ptr(v_cache),
                ptr(slots),
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
    """Gradient of `qk_norm_rope` with respect to qkv; dq_norm, dk_norm (D,) are accumulated (None: frozen)."""
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
    acc_q = fp32_accumulator(dq_norm, like=q_norm) if has_norm else None
    acc_k = fp32_accumulator(dk_norm, like=k_norm) if has_norm else None
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
