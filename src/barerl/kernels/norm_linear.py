"""A decode step's RMSNorm folded into the product after it (csrc/norm_linear.cu): qkv, and gate_up with its
SwiGLU. Shapes the kernel does not take (many rows, fp32, K % 128, a weight tile past shared memory) run the
unfused ops, so both functions always give their reference twin's result."""

from __future__ import annotations

import numpy as np

from barerl.kernels.build import ctype, load_kernel
from barerl.kernels.launch import NULL, contiguous, multiprocessors

MAX_ROWS = 64  # above this cuBLAS on the normed rows is faster (the kernel re-reads x per 64-row tile)
_BM, _WEIGHT_ROWS = 64, (16, 32, 48, 64)
_KSPLIT = 2  # warps per 16 rows, each taking every KSPLIT-th k step
_optin_smem: dict[int, int] = {}
_raised: set[tuple[int, int]] = set()  # (kernel, bytes) whose dynamic shared-memory limit is raised already


def _shared_memory_limit() -> int:
    import cupy

    device = cupy.cuda.runtime.getDevice()
    if device not in _optin_smem:
        _optin_smem[device] = cupy.cuda.runtime.deviceGetAttribute(
            cupy.cuda.runtime.cudaDevAttrMaxSharedMemoryPerBlockOptin, device)
    return _optin_smem[device] - 1024  # the kernel's static shared memory


def _weight_rows(x, w, swiglu: bool) -> int | None:
    """Weight rows per CTA: the smallest tile that needs at most one wave of CTAs, else the largest that fits;
    None where the kernel does not apply."""
    rows, k_dim = x.shape
    n = w.shape[0]
    if (x.dtype.name not in ("bfloat16", "float16") or rows > MAX_ROWS or k_dim % 128 or w.shape[1] != k_dim
            or (swiglu and n % 2)):
        return None
    fitting = []
    for wrows in _WEIGHT_ROWS:
        cols = n // 2 if swiglu else n
        per_tile = wrows // 2 if swiglu else wrows
        if cols % per_tile or (swiglu and per_tile % 8):
            continue
        if (_BM + wrows + 1) * k_dim * x.dtype.itemsize <= _shared_memory_limit():
            fitting.append((wrows, cols // per_tile))
    one_wave = [wrows for wrows, tiles in fitting if tiles <= multiprocessors()]
    if one_wave:
        return one_wave[0]
    return fitting[-1][0] if fitting else None


def _launch(x, norm_w, eps, w, bias, swiglu: bool, wrows: int):
    import cupy

    rows, k_dim = x.shape
    inter = w.shape[0] // 2 if swiglu else 0
    out = cupy.empty((rows, inter if swiglu else w.shape[0]), x.dtype)
    kernel = load_kernel("norm_linear.cu", "norm_linear",
                         {"DTYPE": ctype(x.dtype), "WROWS": wrows, "SWIGLU": int(swiglu), "KSPLIT": _KSPLIT})
    smem = (_BM + wrows + 1) * k_dim * x.dtype.itemsize
    if (id(kernel), smem) not in _raised:  # a driver call: once, not per launch
        kernel.max_dynamic_shared_size_bytes = smem
        _raised.add((id(kernel), smem))
    tiles = (inter // (wrows // 2)) if swiglu else w.shape[0] // wrows
    cast = lambda a: contiguous(a.astype(x.dtype, copy=False))
    kernel((tiles,), (128 * _KSPLIT,),
           (out, x, cast(norm_w), cast(w), NULL if bias is None else cast(bias), np.int32(rows),
            np.int32(k_dim), np.int32(inter), np.float32(eps)),
           shared_mem=smem)
    return out


def rmsnorm_linear(x, norm_w, eps, w, bias=None):
    """linear(rmsnorm(x, norm_w, eps)[0], w, bias): x (T, K), w (N, K) -> (T, N)."""
    from barerl.kernels.linear import linear
    from barerl.kernels.rmsnorm import rmsnorm

    x = contiguous(x)
    wrows = _weight_rows(x, w, swiglu=False)
    if wrows is None:
        return linear(rmsnorm(x, norm_w, eps)[0], w, bias)
    return _launch(x, norm_w, eps, w, bias, swiglu=False, wrows=wrows)


def rmsnorm_linear_swiglu(x, norm_w, eps, w):
    """swiglu(linear(rmsnorm(x, norm_w, eps)[0], w)): x (T, K), w (2I, K) = [gate; up] -> (T, I)."""
    from barerl.kernels.linear import linear
    from barerl.kernels.rmsnorm import rmsnorm
    from barerl.kernels.swiglu import swiglu

    x = contiguous(x)
    wrows = _weight_rows(x, w, swiglu=True)
    if wrows is None:
        return swiglu(linear(rmsnorm(x, norm_w, eps)[0], w))
    return _launch(x, norm_w, eps, w, None, swiglu=True, wrows=wrows)
