"""Embedding launchers (csrc/embedding.cu): row gather, and a scatter-add with fp32 atomics."""

from __future__ import annotations

import numpy as np

from barerl.ops.cuda.build import ctype, load_kernel
from barerl.ops.cuda.launch import contiguous, finish_accumulation, fp32_accumulator, num_blocks, require


def _cols(x) -> int:
    cols = x.shape[-1]
    vec = 16 // x.dtype.itemsize
    require(cols % vec == 0, f"embedding: the row length ({cols}) must be a multiple of {vec} for {x.dtype}")
    return cols


def embedding(ids, table):
    """ids (T,) int32, table (V, C) -> (T, C) in table's dtype."""
    import cupy

    table = contiguous(table)
    ids = contiguous(ids.astype(np.int32, copy=False))
    cols = _cols(table)
    out = cupy.empty((ids.shape[0], cols), table.dtype)
    kernel = load_kernel("embedding.cu", "embedding_forward", {"DTYPE": ctype(table.dtype)})
    vecs = out.size // (16 // out.dtype.itemsize)
    kernel((num_blocks(vecs, 256),), (256,), (out, ids, table, np.int64(ids.shape[0]), np.int32(cols)))
    return out


def embedding_backward(dx, ids, dtable):
    """dtable (V, C) += scatter of dx (T, C) rows at ids (fp32 atomics)."""
    dx = contiguous(dx)
    ids = contiguous(ids.astype(np.int32, copy=False))
    cols = _cols(dx)
    acc = fp32_accumulator(dtable)
    kernel = load_kernel("embedding.cu", "embedding_backward", {"DTYPE": ctype(dx.dtype)})
    vecs = dx.size // (16 // dx.dtype.itemsize)
    kernel((num_blocks(vecs, 256),), (256,), (acc, ids, dx, np.int64(ids.shape[0]), np.int32(cols)))
    finish_accumulation(dtable, acc)
