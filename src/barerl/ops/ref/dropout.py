"""Dropout (LoRA's, on an adapter's input; training only), forward and backward, from a counter.

The mask is a pure function of (seed, stream, element index): element i of a (T, F) input is kept when the
top 32 bits of `splitmix64(seed, stream * 2^40 + i)` reach round(p * 2^32), and kept elements are scaled by
1 / (1 - p). Nothing is stored between the forward and the backward, and recomputation under gradient
checkpointing draws the very same mask; the backward is the same map applied to the gradient.

The conventions every op follows (packing, fp32 arithmetic, accumulated gradients) are `barerl.ops.ref`'s.
"""

from __future__ import annotations

import numpy as np

from barerl.ops.common import as_f32, xp_of
from barerl.ops.ref.counter_rng import splitmix64

__all__ = ["dropout", "dropout_backward"]

STREAM_SHIFT = 40  # element counters of one stream stay below 2^40


def dropout_threshold(p: float) -> int:
    """The 32-bit threshold an element's draw must reach to be kept (keep probability 1 - p)."""
    if not 0.0 <= p < 1.0:
        raise ValueError(f"dropout: p must be in [0, 1), got {p!r}")
    return min(round(p * 2**32), 2**32 - 1)


def dropout(x, p: float, seed: int, stream: int):
    """x (..., F) -> x * keep / (1 - p) in x's dtype, keep drawn per element from (seed, stream)."""
    xp = xp_of(x)
    u64 = xp.uint64
    key = (u64(stream) << u64(STREAM_SHIFT)) + xp.arange(x.size, dtype=u64)
    keep = (splitmix64(u64(seed), key) >> u64(32)) >= u64(dropout_threshold(p))
    xf = as_f32(x).reshape(-1)
    y = xp.where(keep, xf * np.float32(1.0 / (1.0 - p)), np.float32(0.0))
    return y.reshape(x.shape).astype(x.dtype, copy=False)


def dropout_backward(dy, p: float, seed: int, stream: int):
    """Gradient of `dropout` (the same seed and stream): dy through the same mask and scale."""
    return dropout(dy, p, seed, stream)
