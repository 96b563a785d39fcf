"""Small helpers shared by the kernel launchers: argument packing and launch geometry."""

from __future__ import annotations

import numpy as np

NULL = np.uint64(0)  # a null pointer argument (the kernel's optional input is absent)


def ptr(x):
    """The array itself as a kernel pointer argument, or a null pointer for None."""
    return NULL if x is None else x


def num_blocks(total: int, threads: int, cap: int = 132 * 16) -> int:
    """Blocks for a grid-stride loop over `total` items: enough to fill the GPU, at least one."""
    return max(1, min(cap, -(-total // threads)))


def require(condition: bool, message: str) -> None:
    if not condition:
        raise ValueError(message)


def contiguous(x):
    """x itself when C-contiguous, else a contiguous copy (kernels index rows as dense)."""
    import cupy

    return x if x.flags.c_contiguous else cupy.ascontiguousarray(x)


def fp32_accumulator(dw, like=None):
    """Where a kernel may atomically add fp32 gradients for `dw`: dw itself when it is contiguous fp32,
    else a zeroed fp32 scratch that `finish_accumulation` adds into dw afterwards. dw None (a frozen weight):
    a scratch shaped like `like`, whose sums are dropped (the kernels always accumulate)."""
    import cupy

    if dw is None:
        return cupy.zeros(like.shape, np.float32)
    if dw.dtype == np.float32 and dw.flags.c_contiguous:
        return dw
    return cupy.zeros(dw.shape, np.float32)


def finish_accumulation(dw, acc) -> None:
    if dw is not None and acc is not dw:
        dw[...] = (dw.astype(np.float32) + acc).astype(dw.dtype)


def current_device() -> int:
    import cupy

    return cupy.cuda.runtime.getDevice()


_shared_memory_limits: dict[tuple[int, int], int] = {}  # (device, id(kernel)) -> dynamic shared-memory bytes


def reserve_shared_memory(kernel, nbytes: int) -> int:
    """nbytes, after raising the kernel's dynamic shared-memory limit on the current device to at least that
    (a driver call, made only when the limit grows: one limit serves every smaller launch)."""
    key = (current_device(), id(kernel))
    if nbytes > _shared_memory_limits.get(key, 0):
        kernel.max_dynamic_shared_size_bytes = nbytes
        _shared_memory_limits[key] = nbytes
    return nbytes


_multiprocessors: dict[int, int] = {}


def multiprocessors() -> int:
    """SM count of the current device, cached: `Device().attributes` queries every attribute (tens of us)."""
    import cupy

    device = current_device()
    if device not in _multiprocessors:
        _multiprocessors[device] = cupy.cuda.Device(device).attributes["MultiProcessorCount"]
    return _multiprocessors[device]
