"""What both backends need to agree on, in one low module that imports nothing of barerl: the array namespace of
an array, the bf16 dtype, the LM head's chunk size, and the fp32 view every reference op computes in."""

from __future__ import annotations

import ml_dtypes
import numpy as np

BFLOAT16 = np.dtype(ml_dtypes.bfloat16)
DEFAULT_LM_HEAD_CHUNK = 1024  # tokens per LM-head chunk: bounds the fp32 logits to chunk x vocab


def xp_of(*arrays):
    """NumPy or CuPy, whichever owns the arrays."""
    for a in arrays:
        if a is not None and type(a).__module__.startswith("cupy"):
            import cupy

            return cupy
    return np


def as_f32(x):
    """x in fp32: x itself when it is fp32 already (no copy)."""
    return x.astype(np.float32, copy=False)
