"""Linear layers on cuBLASLt: y = x @ w.T (+ bias + residual), and its backward with fp32 accumulation.

The forward runs on cuBLASLt (kernels/cublaslt.py): the residual is its C operand (beta = 1) and the bias its
epilogue, so one kernel writes the output, rounded once (the reference sums in fp32 too; the residual
enters as bf16, as in the reference). Decode-sized GEMMs with a long K (see
`split_k_parts`) run split-K instead: S fp32 parts from one batched GEMM, summed with bias + residual by one
kernel and rounded once; `linear_rmsnorm` normalises the summed rows in that same kernel (o_proj and the
post-attention norm: one launch fewer per layer and step). Weight gradients accumulate with beta = 1 into
`dw` in its own dtype (fp32 grads: no rounding of the sum); the bias gradient is a GEMM with a ones vector.
"""

from __future__ import annotations

import numpy as np

from barerl.kernels.build import ctype, load_kernel
from barerl.kernels.cublas import gemm_split_k
from barerl.kernels.cublaslt import matmul
from barerl.kernels.launch import num_blocks, ptr
from barerl.kernels.rmsnorm import MAX_ROW_IN_REGISTERS, rmsnorm

_ones: dict[tuple, object] = {}
_SPLIT_K_MAX_ROWS = 256
_SPLIT_K_CHUNK = 512  # K per part: the fp32 parts (S x rows x N) stay small and in L2
_FUSE_NORM = True  # linear_rmsnorm's one-kernel split-K sum + norm (False: split_k_sum, then rmsnorm)


def _cast(x, dtype):
    return x if x is None or x.dtype == dtype else x.astype(dtype)


def split_k_parts(rows: int, k: int, n: int) -> int:
    """How many K parts a GEMM of `rows` rows is cut into: decode-sized row counts with a K much longer than N
    (o_proj, down_proj) leave cuBLAS too few CTAs to stream the weight at full bandwidth; 1 = no split."""
    if rows > _SPLIT_K_MAX_ROWS or k < 2 * n or k % _SPLIT_K_CHUNK:
        return 1
    return k // _SPLIT_K_CHUNK


def linear(x, w, bias=None, residual=None):
    """y = x @ w.T + bias + residual. x (T, K), w (N, K), bias (N,), residual (T, N) -> (T, N), x's dtype."""
    import cupy

    w, bias, residual = _cast(w, x.dtype), _cast(bias, x.dtype), _cast(residual, x.dtype)
    out = cupy.empty((x.shape[0], w.shape[0]), x.dtype)
    if residual is not None:
        residual = cupy.ascontiguousarray(residual)
    parts = split_k_parts(x.shape[0], x.shape[1], w.shape[0])
    if parts > 1:
        partials = gemm_split_k(x, w, cupy.empty((parts, *out.shape), np.float32))
        kernel = load_kernel("linear.cu", "split_k_sum", {"DTYPE": ctype(x.dtype)})
        kernel((num_blocks(out.size, 256),), (256,), (out, partials, ptr(bias), ptr(residual), np.int32(parts),
                                                       np.int64(out.shape[0]), np.int32(out.shape[1])))
        return out
    return matmul(x, w, out, transb=True, beta=0.0 if residual is None else 1.0, c=residual, bias=bias)


def linear_rmsnorm(x, w, residual, norm_w, eps):
    """x_new = x @ w.T + residual and rmsnorm(x_new) * norm_w -> x_new, h (T, N), rstd (T,) fp32; the same
    bits as linear then rmsnorm. Split-K products sum and normalise in one kernel."""
    import cupy

    rows, n = x.shape[0], w.shape[0]
    parts = split_k_parts(rows, x.shape[1], n)
    if not _FUSE_NORM or parts == 1 or n > MAX_ROW_IN_REGISTERS[np.dtype(x.dtype).itemsize] or not rows:
        x_new = linear(x, w, residual=residual)
        return (x_new, *rmsnorm(x_new, norm_w, eps))
    w, residual, norm_w = _cast(w, x.dtype), _cast(residual, x.dtype), _cast(norm_w, x.dtype)
    partials = gemm_split_k(x, w, cupy.empty((parts, rows, n), np.float32))
    x_new, h = cupy.empty((rows, n), x.dtype), cupy.empty((rows, n), x.dtype)
    rstd = cupy.empty(rows, np.float32)
    kernel = load_kernel("linear.cu", "split_k_sum_rmsnorm", {"DTYPE": ctype(x.dtype)})
    warps = 4
    kernel((-(-rows // warps),), (32 * warps,),
           (x_new, h, rstd, partials, ptr(None), ptr(None if residual is None else cupy.ascontiguousarray(residual)),
            cupy.ascontiguousarray(norm_w), np.int32(parts), np.int32(rows), np.int32(n), np.float32(eps)))
    return x_new, h, rstd


def _ones_column(n: int, dtype):
    """A cached (n, 1) ones matrix: dbias += dy.T @ ones sums dy's rows on cuBLAS."""
    import cupy

    key = (cupy.cuda.Device().id, np.dtype(dtype).name)
    ones = _ones.get(key)
    if ones is None or ones.shape[0] < n:
        ones = cupy.ones((max(n, 4096), 1), dtype=np.float32).astype(dtype)
        _ones[key] = ones
    return ones[:n]


def linear_backward(dy, x, w, dw, dbias=None):
    """dw (N, K) += dy.T @ x; dbias (N,) += sum(dy); returns dx = dy @ w (T, K) in x's dtype."""
    import cupy

    w = _cast(w, dy.dtype)
    x = _cast(x, dy.dtype)
    matmul(dy, x, dw, transa=True, beta=1.0)
    if dbias is not None:
        matmul(dy, _ones_column(dy.shape[0], dy.dtype), dbias.reshape(-1, 1), transa=True, beta=1.0)
    dx = cupy.empty((dy.shape[0], w.shape[1]), x.dtype)
    return matmul(dy, w, dx)


def lm_head_logits(h, w, inv_temperature=1.0):
    """Logits of a few rows (the engine's last tokens): h (B, C), w (V, C) -> (B, V) fp32."""
    import cupy

    out = cupy.empty((h.shape[0], w.shape[0]), np.float32)
    return matmul(h, _cast(w, h.dtype), out, transb=True, alpha=float(inv_temperature))
