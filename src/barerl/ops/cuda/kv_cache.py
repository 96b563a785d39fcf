"""store_kv on the GPU: one CTA per new token copies its keys and values into their cache slots.

Design: k and v may be row-strided views (the k and v parts of a fused qkv) read in place; other layouts are
copied to contiguous first. The dtype conversion (activations -> cache dtype) happens in the same copy.
"""

from __future__ import annotations

import numpy as np

from barerl.ops.cuda.build import ctype, load_kernel
from barerl.ops.cuda.launch import require

_THREADS = 128


def token_stride(x) -> int | None:
    """Elements between the token rows of a (T, heads, D) array whose heads and dims are dense (a row-strided
    view of a fused qkv buffer is), else None."""
    item = x.dtype.itemsize
    dense_dims = x.shape[2] == 1 or x.strides[2] == item
    dense_heads = x.shape[1] == 1 or x.strides[1] == x.shape[2] * item  # a size-1 axis may have any stride
    return x.strides[0] // item if dense_dims and dense_heads else None


def _dense_rows(x):
    """x itself when token_stride applies, else a contiguous copy."""
    import cupy

    return x if token_stride(x) is not None else cupy.ascontiguousarray(x)


def store_kv(k, v, k_cache, v_cache, slot_mapping):
    """Write k, v (T, K, D) into the caches (num_blocks, block_size, K, D) at flat slots; slot -1 skips."""
    import cupy

    T, K, D = k.shape
    require(v.shape == k.shape and k_cache.shape == v_cache.shape and k_cache.shape[2:] == (K, D),
            f"store_kv: k {k.shape}, v {v.shape}, caches {k_cache.shape} / {v_cache.shape} do not match")
    require(k_cache.flags.c_contiguous and v_cache.flags.c_contiguous, "store_kv: caches must be contiguous")
    if T == 0:
        return
    require(k.dtype == v.dtype, f"store_kv: k is {k.dtype}, v is {v.dtype}")
    k, v = _dense_rows(k), _dense_rows(v)
    slots = cupy.asarray(slot_mapping).astype(np.int32, copy=False)
    kernel = load_kernel("kv_cache.cu", "store_kv", {"DTYPE": ctype(k_cache.dtype), "SRC_T": ctype(k.dtype)})
    kernel((T,), (_THREADS,), (k, v, k_cache, v_cache, slots, np.int64(token_stride(k)),
                                np.int64(token_stride(v)), np.int32(K * D)))
