"""cuBLAS matrix products through ctypes, usable inside CUDA-graph stream capture.

Why ctypes: CuPy refuses every cuBLAS call during stream capture (GPU_FACTS.md), while libcublas itself is
capturable when its handle is bound to the capturing stream and given its own workspace (so cuBLAS allocates
nothing during capture). One handle per device; before each call it is re-bound to CuPy's current stream
(`cublasSetStream` resets the workspace, so the workspace is set again after each re-bind).

Layout: our arrays are row-major, cuBLAS is column-major. Row-major C = op(A) @ op(B) is computed as the
column-major product C^T = op(B)^T @ op(A)^T, which reads the same memory with no copies. Rows may be strided
(views such as the q part of a fused qkv), but the last axis must be contiguous.

Numerics: operands bf16/fp16/fp32, compute always fp32 (CUBLAS_COMPUTE_32F: true fp32, no TF32), out
bf16/fp16/fp32. `beta=1` with an fp32 `out` is how weight gradients accumulate.
"""

from __future__ import annotations

import ctypes
import functools
import glob
import os

import numpy as np

_CUDA_DTYPE = {"float32": 0, "float16": 2, "bfloat16": 14}  # cudaDataType: CUDA_R_32F, _16F, _16BF
_COMPUTE_32F = 68
_GEMM_DEFAULT = -1
WORKSPACE_BYTES = 32 << 20
_OP = {False: 0, True: 1}  # CUBLAS_OP_N, CUBLAS_OP_T


class CublasError(RuntimeError):
    pass


@functools.cache
def load_library(stem: str = "cublas") -> ctypes.CDLL:
    """lib{stem} (libcublas, libcublasLt): the one CuPy already loaded if any, else the pip wheel's or the
    toolkit's."""
    try:  # makes CuPy load its libcublas (and Lt), which a dlopen by soname then finds
        import cupy_backends.cuda.libs.cublas  # noqa: F401
    except ImportError:
        pass
    candidates = [f"lib{stem}.so.13", f"lib{stem}.so.12", f"lib{stem}.so"]
    import site

    roots = [*site.getsitepackages(), os.environ.get("CUDA_PATH", "/usr/local/cuda")]
    for root in roots:
        candidates += sorted(glob.glob(os.path.join(root, "nvidia", "*", "lib", f"lib{stem}.so*")))
        candidates += sorted(glob.glob(os.path.join(root, "lib64", f"lib{stem}.so*")))
    errors = []
    for name in candidates:
        try:
            return ctypes.CDLL(name)
        except OSError as e:
            errors.append(str(e))
    raise CublasError(f"could not load lib{stem}; tried:\n" + "\n".join(errors))


class LibraryHandle:
    """A cuBLAS or cuBLASLt handle, made by the library's `create` function, with its own workspace."""

    def __init__(self, lib: ctypes.CDLL, create: str) -> None:
        import cupy

        self.lib = lib
        self.handle = ctypes.c_void_p()
        check(getattr(lib, create)(ctypes.byref(self.handle)), create)
        self.workspace = cupy.empty(WORKSPACE_BYTES, dtype=np.uint8)


class _Handle(LibraryHandle):
    """A cuBLAS handle re-bound to the current CuPy stream before each call."""

    def __init__(self, lib: ctypes.CDLL) -> None:
        super().__init__(lib, "cublasCreate_v2")
        self.stream = None

    def bind(self) -> None:
        import cupy

        stream = cupy.cuda.get_current_stream().ptr
        if stream != self.stream:
            check(self.lib.cublasSetStream_v2(self.handle, ctypes.c_void_p(stream)), "cublasSetStream_v2")
            check(
                self.lib.cublasSetWorkspace_v2(
                    self.handle, ctypes.c_void_p(self.workspace.data.ptr), ctypes.c_size_t(WORKSPACE_BYTES)
                ),
                "cublasSetWorkspace_v2",
            )
            self.stream = stream


def check(status: int, what: str) -> None:
    if status != 0:
        raise CublasError(f"{what} returned cuBLAS status {status}")


def on_current_device(cache: dict, make):
    """cache[current device id], made by make() on the device's first use (a handle and its workspace)."""
    import cupy

    device = cupy.cuda.Device().id
    if device not in cache:
        cache[device] = make()
    return cache[device]


_handles: dict[int, _Handle] = {}


def _handle() -> _Handle:
    handle = on_current_device(_handles, lambda: _Handle(load_library()))
    handle.bind()
    return handle


def matrix_layout(x, name: str) -> tuple[int, int, int]:
    """(rows, cols, leading dimension in elements) of a 2-D array whose last axis is contiguous."""
    if x.ndim != 2:
        raise ValueError(f"matrix product: {name} must be 2-D, got shape {x.shape}")
    item = x.dtype.itemsize
    if x.strides[1] != item and x.shape[1] > 1:
        raise ValueError(f"matrix product: {name}'s last axis must be contiguous (strides {x.strides})")
    ld = x.strides[0] // item if x.shape[0] > 1 else x.shape[1]
    return x.shape[0], x.shape[1], max(ld, x.shape[1], 1)


def gemm(a, b, out, transa: bool = False, transb: bool = False, alpha: float = 1.0, beta: float = 0.0):
    """out = alpha * op(a) @ op(b) + beta * out, op(x) = x.T when trans. Returns out.

    op(a) (M, K), op(b) (K, N), out (M, N). a and b share a dtype (bf16, fp16 or fp32); out is bf16, fp16
    or fp32; accumulation is fp32.
    """
    (m, n, k), (_, _, lda), (_, _, ldb), (_, _, ldc) = product_layouts(a, b, out, transa, transb)
    if m == 0 or n == 0:
        return out
    h = _handle()
    f_alpha, f_beta = ctypes.c_float(alpha), ctypes.c_float(beta)
    in_type, out_type = _CUDA_DTYPE[a.dtype.name], _CUDA_DTYPE[out.dtype.name]
    # column-major view: out.T = op(b).T @ op(a).T, so b comes first
    status = h.lib.cublasGemmEx(h.handle, _OP[transb], _OP[transa], n, m, k, ctypes.byref(f_alpha),
                                ctypes.c_void_p(b.data.ptr), in_type, ldb, ctypes.c_void_p(a.data.ptr), in_type, lda,
                                ctypes.byref(f_beta), ctypes.c_void_p(out.data.ptr), out_type, ldc, _COMPUTE_32F,
                                _GEMM_DEFAULT)
    check(status, f"cublasGemmEx(m={m}, n={n}, k={k}, {a.dtype}->{out.dtype})")
    return out


def product_layouts(a, b, out, transa: bool, transb: bool):
    """The checked operands of out = op(a) @ op(b): (m, n, k) and the (rows, cols, ld) of a, b and out."""
    if a.dtype != b.dtype:
        raise TypeError(f"matrix product: a and b must share a dtype, got {a.dtype} and {b.dtype}")
    layout_a, layout_b, layout_out = matrix_layout(a, "a"), matrix_layout(b, "b"), matrix_layout(out, "out")
    (ra, ca, _), (rb, cb, _), (ro, co, _) = layout_a, layout_b, layout_out
    m, k = (ca, ra) if transa else (ra, ca)
    k2, n = (cb, rb) if transb else (rb, cb)
    if k != k2 or (ro, co) != (m, n):
        raise ValueError(f"matrix product: shapes do not agree: op(a) {(m, k)}, op(b) {(k2, n)}, out {(ro, co)}")
    return (m, n, k), layout_a, layout_b, layout_out
