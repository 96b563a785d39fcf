"""Embedding lookup and its backward (a scatter-add into the table's gradient).

The conventions every op follows (packing, fp32 arithmetic, accumulated gradients) are `barerl.ops.ref`'s.
"""

from __future__ import annotations

import numpy as np

from barerl.ops.common import as_f32, xp_of

__all__ = ["embedding", "embedding_backward"]


def _scatter_add(xp, target, index, values):
    if xp is np:
        np.add.at(target, index, values)
    else:
        import cupyx

        cupyx.scatter_add(target, index, values)


def embedding(ids, table):
    """ids (T,) int32, table (V, C) -> (T, C) in table's dtype."""
    return table[ids]


def embedding_backward(dx, ids, dtable):
    """dtable (V, C) += scatter of dx (T, C) rows at ids."""
    xp = xp_of(dx)
    _scatter_add(xp, dtable, ids, as_f32(dx).astype(dtable.dtype, copy=False))
