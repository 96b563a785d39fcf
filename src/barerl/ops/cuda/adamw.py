"""Fused AdamW and global grad-norm launchers (csrc/adamw.cu), same contracts as ops/ref/adamw.py.

One elementwise pass over the flat buffers: grad is read once, master and both moments are read and
written once, and the working weights (the copy forward passes and the engine read) are overwritten in place.
The scalar factors (bias corrections, decay) are computed on the host, as in the reference.
"""

from __future__ import annotations

import math

import numpy as np

from barerl.ops.common import BFLOAT16
from barerl.ops.cuda.build import ctype, load_kernel
from barerl.ops.cuda.launch import multiprocessors, ptr, require

_THREADS = 256


def _grid(n: int) -> int:
    return max(1, min(-(-n // _THREADS), multiprocessors() * 8))


def grad_norm(grad) -> float:
    """Global L2 norm of a flat gradient (N,), fp32 per block, fp64 across blocks."""
    import cupy

    require(
        grad.ndim == 1 and grad.flags.c_contiguous,
        f"grad_norm: grad must be flat and dense, got {grad.shape}",
    )
    total = cupy.zeros(1, np.float64)
    if grad.size:
        kernel = load_kernel("adamw.cu", "grad_sum_squares", {"DTYPE": ctype(grad.dtype)})
        kernel((_grid(grad.size),), (_THREADS,), (total, grad, np.int64(grad.size)))
    return math.sqrt(float(total.get()[0]))


def adamw_step(
    master,
    grad,
    exp_avg,
    exp_avg_sq,
    decay_mask,
    lr: float,
    beta1: float,
    beta2: float,
    eps: float,
    weight_decay: float,
    step: int,
    grad_scale: float = 1.0,
    working_out=None,
    rounding_seed: int | None = None,
    offset: int = 0,
    master_low16=None,
) -> None:
    """One AdamW update, in place, on flat (N,) arrays (see ops.ref.adamw.adamw_step); `offset`: element
    0's index in the whole buffer (stochastic rounding's counter); `master_low16`: the master as its low halves
    (master None)."""
    if step < 1:
        raise ValueError(f"adamw_step: step is 1-based, got {step}")
    require((master is None) != (master_low16 is None), "adamw_step: give master or master_low16, not both")
    require(master_low16 is None or (rounding_seed is not None and master_low16.dtype == np.uint16),
            "adamw_step: master_low16 (uint16) needs stochastic rounding (rounding_seed)")
    n = (master if master is not None else master_low16).shape[0]
    for name, a in (
        ("master", master),
        ("grad", grad),
        ("exp_avg", exp_avg),
        ("exp_avg_sq", exp_avg_sq),
        ("decay_mask", decay_mask),
        ("working_out", working_out),
        ("master_low16", master_low16),
    ):
        if a is not None:
            require(a.shape == (n,), f"adamw_step: {name} has shape {a.shape}, master has ({n},)")
            require(a.flags.c_contiguous, f"adamw_step: {name} must be dense")
    for name, a in (("master", master), ("exp_avg", exp_avg), ("exp_avg_sq", exp_avg_sq)):
        if a is not None:
            require(a.dtype == np.float32, f"adamw_step: {name} must be fp32, got {a.dtype}")
    if decay_mask is not None and decay_mask.dtype != np.uint8:
        decay_mask = (
            decay_mask.view(np.uint8) if decay_mask.dtype == np.bool_ else decay_mask.astype(np.uint8)
        )
    stochastic = rounding_seed is not None
    require(not stochastic or (working_out is not None and working_out.dtype == BFLOAT16),
            "adamw_step: stochastic rounding (rounding_seed) needs bf16 working_out")
    work_dtype = ctype(working_out.dtype) if working_out is not None else "float"
    kernel = load_kernel("adamw.cu", "adamw_step", {"DTYPE": ctype(grad.dtype), "WORK_DTYPE": work_dtype})
    decay = 1.0 - lr * weight_decay if weight_decay != 0.0 else 1.0
    if n:
        kernel(
            (_grid(n),),
            (_THREADS,),
            (
                ptr(master),
                exp_avg,
                exp_avg_sq,
                ptr(working_out),
                grad,
                ptr(decay_mask),
                np.int64(n),
                np.float32(grad_scale),
                np.float32(beta1),
                np.float32(beta2),
                np.float32(eps),
                np.float32(decay),
                np.float32(lr / (1.0 - beta1**step)),
                np.float32(math.sqrt(1.0 - beta2**step)),
                np.int32(stochastic),
                np.uint64(rounding_seed or 0),
                np.int64(step),
                np.int64(offset),
                ptr(master_low16),
            ),
        )
