"""Linear layers: y = x @ w.T (+ bias + residual), and the backward (cuBLASLt on the GPU, where bias and
residual are the product's epilogue).

The conventions every op follows (packing, fp32 arithmetic, accumulated gradients) are `barerl.ops.ref`'s.
"""

from __future__ import annotations

from contextlib import nullcontext

import numpy as np

from barerl.ops.common import as_f32

__all__ = ["defer_decode_tuning", "linear", "linear_backward"]


def defer_decode_tuning():
    """The GPU's products tune their algorithms (ops/cuda/cublaslt.py); the reference has nothing to defer."""
    return nullcontext()


def linear(x, w, bias=None, residual=None, scale=1.0, batch_invariant=False):
    """y = scale * x @ w.T + bias + residual. x (T, K), w (N, K), bias (N,), residual (T, N) -> (T, N)."""
    y = as_f32(x) @ as_f32(w).T
    if scale != 1.0:
        y *= np.float32(scale)
    if bias is not None:
        y += as_f32(bias)
    if residual is not None:
        y += as_f32(residual)
    return y.astype(x.dtype, copy=False)


def linear_backward(dy, x, w, dw, dbias=None, scale=1.0, residual_grad=None, batch_invariant=False):
    """Gradient of `linear`: dw (N, K) += scale * dy.T @ x (dw None: no weight gradient, a frozen weight);
    dbias (N,) += sum(dy); returns dx = scale * dy @ w (T, K) in x's dtype, plus residual_grad (T, K) when
    given (x's gradient along another path), added in fp32 before the rounding."""
    dyf = as_f32(dy)
    if dw is not None:
        dw += (np.float32(scale) * (dyf.T @ as_f32(x))).astype(dw.dtype, copy=False)
    if dbias is not None:
        dbias += dyf.sum(axis=0).astype(dbias.dtype, copy=False)
    dx = dyf @ as_f32(w)
    if scale != 1.0:
        dx *= np.float32(scale)
    if residual_grad is not None:
        dx += as_f32(residual_grad)
    return dx.astype(x.dtype, copy=False)
