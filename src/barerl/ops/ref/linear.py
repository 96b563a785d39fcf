"""Linear layers: y = x @ w.T (+ bias + residual), and the backward (cuBLASLt on the GPU, where bias and
residual are the product's epilogue).

The conventions every op follows (packing, fp32 arithmetic, accumulated gradients) are `barerl.ops.ref`'s.
"""

from __future__ import annotations

from barerl.ops.common import as_f32

__all__ = ["linear", "linear_backward"]


def linear(x, w, bias=None, residual=None, batch_invariant=False):
    """y = x @ w.T + bias + residual. x (T, K), w (N, K), bias (N,), residual (T, N) -> (T, N)."""
    y = as_f32(x) @ as_f32(w).T
    if bias is not None:
        y += as_f32(bias)
    if residual is not None:
        y += as_f32(residual)
    return y.astype(x.dtype, copy=False)


def linear_backward(dy, x, w, dw, dbias=None, batch_invariant=False):
    """dw (N, K) += dy.T @ x; dbias (N,) += sum(dy); returns dx = dy @ w (T, K) in x's dtype."""
    dyf = as_f32(dy)
    dw += (dyf.T @ as_f32(x)).astype(dw.dtype, copy=False)
    if dbias is not None:
        dbias += dyf.sum(axis=0).astype(dbias.dtype, copy=False)
    return (dyf @ as_f32(w)).astype(x.dtype, copy=False)
