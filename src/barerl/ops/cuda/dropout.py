"""Dropout launchers (csrc/dropout.cu), same contracts as ops/ref/dropout.py: elementwise, 16-byte vectors,
the mask drawn from (seed, stream, element index) in the kernel and never stored."""

from __future__ import annotations

import numpy as np

from barerl.ops.cuda.build import ctype, load_kernel
from barerl.ops.cuda.launch import contiguous, num_blocks, require
from barerl.ops.ref.dropout import STREAM_SHIFT, dropout_threshold


def dropout(x, p: float, seed: int, stream: int):
    """x (..., F) -> x * keep / (1 - p) in x's dtype (see ops.ref.dropout)."""
    import cupy

    x = contiguous(x)
    vec = 16 // x.dtype.itemsize
    require(x.size % vec == 0, f"dropout: {x.size} elements is not a multiple of {vec} for {x.dtype}")
    require(x.size < 1 << STREAM_SHIFT, f"dropout: {x.size} elements exceed one stream's counters")
    threshold = dropout_threshold(p)
    y = cupy.empty_like(x)
    if x.size:
        kernel = load_kernel("dropout.cu", "dropout", {"DTYPE": ctype(x.dtype)})
        kernel((num_blocks(x.size // vec, 256),), (256,),
               (y, x, np.int64(x.size), np.uint64(seed), np.uint64(stream), np.uint32(threshold),
                np.float32(1.0 / (1.0 - p))))
    return y


def dropout_backward(dy, p: float, seed: int, stream: int):
    """Gradient of `dropout` (the same seed and stream): dy through the same mask and scale."""
    return dropout(dy, p, seed, stream)
