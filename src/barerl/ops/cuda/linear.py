"""Linear layers on cuBLASLt: y = x @ w.T (+ bias + residual), and its backward with fp32 accumulation.

The forward runs on cuBLASLt (ops/cuda/cublaslt.py): the residual is its C operand (beta = 1) and the bias its
epilogue, so one kernel writes the output, rounded once (the reference sums in fp32 too; the residual
enters as bf16, as in the reference). Decode-sized products take cuBLASLt's algorithm timed cold (see
cublaslt.py); a split-K path of our own (fp32 parts from a batched GEMM, summed by a kernel) was measured
slower on the H200 in whole decode steps (docs/LOG.md, a582e38) and removed. Weight gradients
accumulate with beta = 1 into `dw` in its own dtype (fp32 grads: no rounding of the sum); the bias gradient
is a GEMM with a ones vector.
"""

from __future__ import annotations

import numpy as np

from barerl.ops.cuda.cublaslt import defer_decode_tuning, matmul  # noqa: F401 (an op of this family)

_ones: dict[tuple, object] = {}


def _cast(x, dtype):
    return x if x is None or x.dtype == dtype else x.astype(dtype)


def linear(x, w, bias=None, residual=None, scale=1.0, batch_invariant=False):
    """y = scale * x @ w.T + bias + residual. x (T, K), w (N, K), bias (N,), residual (T, N) -> (T, N), x's
    dtype (scale is the product's alpha)."""
    import cupy

    w, bias, residual = _cast(w, x.dtype), _cast(bias, x.dtype), _cast(residual, x.dtype)
    out = cupy.empty((x.shape[0], w.shape[0]), x.dtype)
    if residual is not None:
        residual = cupy.ascontiguousarray(residual)
    return matmul(x, w, out, transb=True, alpha=float(scale), beta=0.0 if residual is None else 1.0, c=residual,
                  bias=bias, batch_invariant=batch_invariant)


def _ones_column(n: int, dtype):
    """A cached (n, 1) ones matrix: dbias += dy.T @ ones sums dy's rows on cuBLAS."""
    import cupy

    key = (cupy.cuda.Device().id, np.dtype(dtype).name)
    ones = _ones.get(key)
    if ones is None or ones.shape[0] < n:
        ones = cupy.ones((max(n, 4096), 1), dtype=np.float32).astype(dtype)
        _ones[key] = ones
    return ones[:n]


def linear_backward(dy, x, w, dw, dbias=None, scale=1.0, residual_grad=None, batch_invariant=False):
    """dw (N, K) += scale * dy.T @ x (dw None: a frozen weight, no product); dbias (N,) += sum(dy); returns
    dx = scale * dy @ w (+ residual_grad (T, K), the C operand) in x's dtype."""
    import cupy

    w = _cast(w, dy.dtype)
    x = _cast(x, dy.dtype)
    if dw is not None:
        matmul(dy, x, dw, transa=True, alpha=float(scale), beta=1.0, batch_invariant=batch_invariant)
    if dbias is not None:
        matmul(dy, _ones_column(dy.shape[0], dy.dtype), dbias.reshape(-1, 1), transa=True, beta=1.0,
               batch_invariant=batch_invariant)
    dx = cupy.empty((dy.shape[0], w.shape[1]), x.dtype)
    if residual_grad is not None:
        residual_grad = cupy.ascontiguousarray(_cast(residual_grad, x.dtype))
    return matmul(dy, w, dx, alpha=float(scale), beta=0.0 if residual_grad is None else 1.0, c=residual_grad,
                  batch_invariant=batch_invariant)
