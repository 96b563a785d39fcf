"""RMSNorm over the last axis, forward and backward.

The conventions every op follows (packing, fp32 arithmetic, accumulated gradients) are `barerl.ops.ref`'s.
"""

from __future__ import annotations

import numpy as np

from barerl.ops.common import as_f32, xp_of

__all__ = ["rmsnorm", "rmsnorm_backward"]


def rmsnorm(x, w, eps):
    """y = x / rms(x) * w over the last axis. x (T, C), w (C,) -> y (T, C), rstd (T,) fp32."""
    xp = xp_of(x)
    xf = as_f32(x)
    rstd = 1.0 / xp.sqrt((xf * xf).mean(axis=-1) + np.float32(eps))
    y = (xf * rstd[..., None]) * as_f32(w)
    return y.astype(x.dtype, copy=False), rstd.astype(np.float32, copy=False)


def rmsnorm_backward(dy, x, w, rstd, dw, residual_grad=None):
    """dw (C,) += sum over rows of dy * x_hat (dw None: a frozen weight); returns dx (T, C) in x's dtype, plus
    residual_grad (the residual stream's gradient around the norm) when given, added in fp32 before the
    rounding."""
    xf, dyf = as_f32(x), as_f32(dy)
    xhat = xf * rstd[..., None]
    dxhat = dyf * as_f32(w)
    if dw is not None:
        dw += (dyf * xhat).reshape(-1, xf.shape[-1]).sum(axis=0).astype(dw.dtype, copy=False)
    dx = rstd[..., None] * (dxhat - xhat * (dxhat * xhat).mean(axis=-1, keepdims=True))
    if residual_grad is not None:
        if residual_grad.shape != x.shape:  # as the kernel's launcher: a broadcast would hide a caller's bug
            raise ValueError(f"rmsnorm_backward: residual_grad {residual_grad.shape} does not match x {x.shape}")
        dx += as_f32(residual_grad)
    return dx.astype(x.dtype, copy=False)
