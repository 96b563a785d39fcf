"""Writing keys and values into the paged KV cache (num_blocks, block_size, K, D) at flat slots.

The conventions every op follows (packing, fp32 arithmetic, accumulated gradients) are `barerl.ops.ref`'s.
"""

from __future__ import annotations

from barerl.ops.common import xp_of

__all__ = ["store_kv"]


def store_kv(k, v, k_cache, v_cache, slot_mapping):
    """Write k, v (T, K, D) into the caches (num_blocks, block_size, K, D) at flat slots; slot -1 skips."""
    xp = xp_of(k)
    slots = xp.asarray(slot_mapping)
    keep = slots >= 0
    kc = k_cache.reshape(-1, *k_cache.shape[2:])
    vc = v_cache.reshape(-1, *v_cache.shape[2:])
    kc[slots[keep]] = k[keep].astype(k_cache.dtype, copy=False)
    vc[slots[keep]] = v[keep].astype(v_cache.dtype, copy=False)
