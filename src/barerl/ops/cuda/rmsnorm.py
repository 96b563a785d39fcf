"""RMSNorm launchers (csrc/rmsnorm.cu): one warp per row; backward accumulates dw in fp32."""

from __future__ import annotations

import numpy as np

from barerl.ops.cuda.build import ctype, load_kernel
from barerl.ops.cuda.launch import (
    contiguous,
    finish_accumulation,
    fp32_accumulator,
    multiprocessors,
    ptr,
    require,
    reserve_shared_memory,
)

_ROWS_PER_BLOCK = 4


def _grid(rows: int, blocks_per_sm: int) -> int:
    return max(1, min(-(-rows // _ROWS_PER_BLOCK), multiprocessors() * blocks_per_sm))


def _check(x, w) -> tuple[int, int]:
    cols = x.shape[-1]
    vec = 16 // x.dtype.itemsize
    require(cols % vec == 0, f"rmsnorm: the last axis ({cols}) must be a multiple of {vec} for {x.dtype}")
    require(w.shape == (cols,), f"rmsnorm: weight shape {w.shape} does not match the last axis {cols}")
    return x.size // cols if cols else 0, cols


def rmsnorm(x, w, eps):
    """y = x / rms(x) * w over the last axis. x (..., C), w (C,) -> y like x, rstd (...,) fp32."""
    import cupy

    x = contiguous(x)
    w = contiguous(w.astype(x.dtype, copy=False))
    rows, cols = _check(x, w)
    y = cupy.empty_like(x)
    rstd = cupy.empty(x.shape[:-1], np.float32)
    if rows:
        kernel = load_kernel("rmsnorm.cu", "rmsnorm_forward", {"DTYPE": ctype(x.dtype)})
        kernel(
            (_grid(rows, 1024),),
            (32 * _ROWS_PER_BLOCK,),  # a warp per row: all rows in flight
            (y, rstd, x, w, np.int32(rows), np.int32(cols), np.float32(eps)),
        )
    return y, rstd


def rmsnorm_backward(dy, x, w, rstd, dw, residual_grad=None):
    """dw (C,) += sum over rows of dy * x_hat (dw None: frozen); returns dx like x (+ residual_grad, added in
    fp32)."""
    import cupy

    x, dy = contiguous(x), contiguous(dy.astype(x.dtype, copy=False))
    if residual_grad is not None:
        residual_grad = contiguous(residual_grad.astype(x.dtype, copy=False))
        require(residual_grad.shape == x.shape,
                f"rmsnorm_backward: residual_grad {residual_grad.shape} does not match x {x.shape}")
    w = contiguous(w.astype(x.dtype, copy=False))
    rows, cols = _check(x, w)
    dx = cupy.empty_like(x)
    acc = fp32_accumulator(dw, like=w)
    if rows:
        kernel = load_kernel("rmsnorm.cu", "rmsnorm_backward", {"DTYPE": ctype(x.dtype)})
        smem = reserve_shared_memory(kernel, _ROWS_PER_BLOCK * cols * 4)
        kernel(
            (_grid(rows, 16),),
            (32 * _ROWS_PER_BLOCK,),  # fewer blocks: fewer dw atomics
            (dx, acc, dy, x, w, contiguous(rstd), ptr(residual_grad), np.int32(rows), np.int32(cols)),
            shared_mem=smem,
        )
    finish_accumulation(dw, acc)
    return dx
