"""A decode step's gate_up product and SwiGLU in one launch (csrc/gate_up_swiglu.cu), and the backend's op.

Design decisions:
- `gate_up_swiglu` is the reference twin's contract (swiglu(x @ w_gate_up.T)) with the product's output and
  the activation rounded where the separate ops round them; only the fp32 summation order differs.
- The fused form runs where it pays and fits: at most 64 rows (decode batches), a 16-bit dtype, and a CTA's
  x with its weight rows within one SM's shared memory (Qwen3-0.6B: 224 KB), features per CTA chosen so that
  the grid is one CTA per SM at most. Everything else, and the batch-invariant mode (whose rows must match
  the trainer's products bit for bit), composes linear and swiglu.
"""

from __future__ import annotations

import numpy as np

from barerl.kernels import cublaslt
from barerl.kernels.build import ctype, load_kernel
from barerl.kernels.launch import multiprocessors, require, reserve_shared_memory
from barerl.kernels.linear import linear
from barerl.kernels.swiglu import swiglu

MAX_ROWS = 64  # must equal ROWS in gate_up_swiglu.cu
_THREADS = 256
_SHARED_MEMORY_LIMIT = 227 * 1024  # an H100 / H200 CTA's dynamic shared memory
_FUSED = True  # False: always compose (A/B switch for benchmarks)


def shared_memory_bytes(hidden: int, features: int) -> int:
    """gate_up_swiglu.cu's SMEM_BYTES: 64 x rows and 2 x `features` weight rows, all of K, 16-bit."""
    return 2 * hidden * (MAX_ROWS + 2 * features)


def features_per_cta(hidden: int, inter: int) -> int | None:
    """The smallest multiple of 8 dividing `inter` that keeps the grid within one CTA per SM and the tiles
    within shared memory; None if there is none."""
    for features in range(8, inter + 1, 8):
        if inter % features == 0 and inter // features <= multiprocessors():
            return features if shared_memory_bytes(hidden, features) <= _SHARED_MEMORY_LIMIT else None
    return None


def fusable(x, w_gate_up) -> bool:
    rows, hidden = x.shape
    return (
        1 <= rows <= MAX_ROWS
        and hidden % 128 == 0  # swizzled tile rows of whole 8-unit groups
        and x.dtype.itemsize == 2
        and w_gate_up.dtype == x.dtype
        and w_gate_up.shape[1] == hidden
        and w_gate_up.shape[0] % 16 == 0
        and features_per_cta(hidden, w_gate_up.shape[0] // 2) is not None
    )


def fused_gate_up_swiglu(x, w_gate_up):
    """swiglu(x @ w_gate_up.T) for x (M <= 64, C), w_gate_up (2I, C) = [gate | up]: one launch."""
    import cupy

    require(fusable(x, w_gate_up), f"gate_up_swiglu: unsupported x {x.shape} {x.dtype} or w {w_gate_up.shape}")
    rows, hidden = x.shape
    inter = w_gate_up.shape[0] // 2
    features = features_per_cta(hidden, inter)
    x, w_gate_up = cupy.ascontiguousarray(x), cupy.ascontiguousarray(w_gate_up)
    kernel = load_kernel("gate_up_swiglu.cu", "gate_up_swiglu",
                         {"DTYPE": ctype(x.dtype), "HIDDEN": hidden, "FT": features})
    smem = reserve_shared_memory(kernel, shared_memory_bytes(hidden, features))
    a = cupy.empty((rows, inter), x.dtype)
    kernel((inter // features,), (_THREADS,), (a, x, w_gate_up, np.int32(rows), np.int32(inter)), shared_mem=smem)
    return a


def gate_up_swiglu(x, w_gate_up):
    """swiglu(x @ w_gate_up.T) (backend.ref.nn.gate_up_swiglu's contract)."""
    if _FUSED and not cublaslt.batch_invariant() and fusable(x, w_gate_up):
        return fused_gate_up_swiglu(x, w_gate_up)
    return swiglu(linear(x, w_gate_up))
