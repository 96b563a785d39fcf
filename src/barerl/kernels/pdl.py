"""Programmatic Dependent Launch (PDL) of our small kernels: each one's launch and prologue overlap the tail of
the kernel ahead of it in the stream (typically a cuBLAS GEMM).

Why: a decode step is ~260 kernels, and our small ones (rmsnorm, qk_norm_rope, paged attention, swiglu) spend
most of their 1.5-3 us in launch and ramp-up. Launched with CU_LAUNCH_ATTRIBUTE_PROGRAMMATIC_STREAM_SERIALIZATION,
a kernel may start before its predecessor has finished; it then waits in `wait_for_producer()`
(csrc/common.cuh, griddepcontrol.wait) before it reads an input or writes an output, so its results are those
of a plain launch. Stream capture turns the attribute into a programmatic edge of the CUDA graph (CUDA 12.3).
Launched so: the forwards of rmsnorm, qk_norm_rope(_store) and swiglu, paged attention's split and combine;
qk_norm_rope and the split also let the next launch start early (`allow_dependents()`): theirs is ours.

Design decisions:
- CuPy launches through cuLaunchKernel only, so `launch` calls cuLaunchKernelEx through ctypes on libcuda, with
  the RawKernel's CUfunction (`RawKernel.kernel` is a cupy.cuda.function.Function; `.ptr` is the handle) on
  CuPy's current stream. The structures follow cuda.h (CUDA 13.0, x86-64); tests/kernels/test_pdl.py checks
  their sizes and offsets.
- Arguments are the kinds the launchers pass: a CuPy array becomes its device pointer, np.int32 / np.int64 /
  np.uint64 / np.float32 their C types; anything else is a TypeError rather than a guess.
- A plain launch (`kernel(grid, block, args, shared_mem=...)`) on devices before sm_90, drivers before CUDA
  12.3, or with BARERL_PDL=0 in the environment (read once, when this module is imported; BARERL_PDL=1, the
  default, turns it on): an A/B benchmark flips one variable. Tests set `ENABLED` directly.
"""

from __future__ import annotations

import ctypes
import functools
import os

import numpy as np

_PROGRAMMATIC_STREAM_SERIALIZATION = 6  # CU_LAUNCH_ATTRIBUTE_PROGRAMMATIC_STREAM_SERIALIZATION
_MIN_DRIVER = 12030  # CUDA 12.3: stream capture keeps the attribute as a programmatic graph edge
_C_TYPES = {np.int32: ctypes.c_int32, np.int64: ctypes.c_int64, np.uint64: ctypes.c_uint64,
            np.float32: ctypes.c_float}


def _read_switch() -> bool:
    value = os.environ.get("BARERL_PDL", "1")
    if value not in ("0", "1"):
        raise ValueError(f"BARERL_PDL must be 0 or 1, not {value!r}")
    return value == "1"


ENABLED = _read_switch()


class _AttributeValue(ctypes.Union):  # CUlaunchAttributeValue: 64 bytes, of which we set one int
    _fields_ = [("pad", ctypes.c_char * 64), ("programmatic_stream_serialization_allowed", ctypes.c_int)]


class _LaunchAttribute(ctypes.Structure):  # CUlaunchAttribute
    _fields_ = [("id", ctypes.c_int), ("pad", ctypes.c_char * 4), ("value", _AttributeValue)]


class _LaunchConfig(ctypes.Structure):  # CUlaunchConfig (gridDimX..Z and blockDimX..Z as arrays)
    _fields_ = [("grid", ctypes.c_uint * 3), ("block", ctypes.c_uint * 3), ("shared_mem_bytes", ctypes.c_uint),
                ("stream", ctypes.c_void_p), ("attrs", ctypes.POINTER(_LaunchAttribute)),
                ("num_attrs", ctypes.c_uint)]


_ATTRIBUTE = _LaunchAttribute(id=_PROGRAMMATIC_STREAM_SERIALIZATION,
                              value=_AttributeValue(programmatic_stream_serialization_allowed=1))
_ATTRIBUTES = ctypes.pointer(_ATTRIBUTE)  # every launch's one attribute (the driver reads it during the call)


def _dim3(sizes) -> ctypes.Array:
    """(x,), (x, y) or (x, y, z) as the three sizes of a CUDA dim3, the missing ones 1."""
    return (ctypes.c_uint * 3)(*(int(size) for size in sizes), *[1] * (3 - len(sizes)))


def launch_config(grid, block, shared_mem: int, stream: int) -> _LaunchConfig:
    """The CUlaunchConfig of one PDL launch on `stream` (a CUstream address; 0 is the legacy default stream)."""
    return _LaunchConfig(grid=_dim3(grid), block=_dim3(block), shared_mem_bytes=shared_mem, stream=stream,
                         attrs=_ATTRIBUTES, num_attrs=1)


def pack_arguments(args) -> tuple[list, ctypes.Array]:
    """(the arguments as C values, the array of their addresses that cuLaunchKernelEx reads); the values must
    stay alive until the launch returns."""
    values = []
    for arg in args:
        c_type = _C_TYPES.get(type(arg))
        if c_type is not None:
            values.append(c_type(arg))
        elif hasattr(getattr(arg, "data", None), "ptr"):  # a CuPy array (a view points at its first element)
            values.append(ctypes.c_void_p(arg.data.ptr))
        else:
            raise TypeError(f"pdl.launch: cannot pass a {type(arg).__name__} as a kernel argument")
    return values, (ctypes.c_void_p * len(values))(*map(ctypes.addressof, values))


@functools.cache
def _launch_kernel_ex():
    function = ctypes.CDLL("libcuda.so.1").cuLaunchKernelEx
    function.argtypes = [ctypes.POINTER(_LaunchConfig), ctypes.c_void_p, ctypes.POINTER(ctypes.c_void_p),
                         ctypes.c_void_p]
    function.restype = ctypes.c_int
    return function


_device_supports: dict[int, bool] = {}


def supported() -> bool:
    """Whether the current device and driver take PDL launches (sm_90+, CUDA 12.3+); cached per device."""
    import cupy

    device = cupy.cuda.runtime.getDevice()
    if device not in _device_supports:
        cc = int(cupy.cuda.Device(device).compute_capability)
        _device_supports[device] = cc >= 90 and cupy.cuda.runtime.driverGetVersion() >= _MIN_DRIVER
    return _device_supports[device]


def launch(kernel, grid, block, args, shared_mem: int = 0) -> None:
    """`kernel(grid, block, args, shared_mem=shared_mem)` as a programmatic dependent launch where PDL is on
    (module docstring). The kernel must call wait_for_producer() before it touches memory."""
    if not (ENABLED and supported()):
        kernel(grid, block, args, shared_mem=shared_mem)
        return
    import cupy

    _values, params = pack_arguments(args)  # params points into _values: alive until the call returns
    config = launch_config(grid, block, shared_mem, cupy.cuda.get_current_stream().ptr)
    status = _launch_kernel_ex()(ctypes.byref(config), kernel.kernel.ptr, params, None)
    cupy.cuda.driver.check_status(status)
