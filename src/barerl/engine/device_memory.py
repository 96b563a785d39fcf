"""Device memory that can be released and mapped again at the same address (CUDA virtual memory management).

Why: the engine's CUDA graphs hold the KV cache's address. Sleeping (GRPO frees the cache for training) used
to drop the graphs with the cache, and every generation round captured them again. A virtual address range
reserved once keeps that address: `release` hands the physical memory back to the driver, `map` takes new
memory under the same addresses, and the graphs stay valid.

Driver calls through ctypes (libcuda; CuPy does not expose them): cuMemAddressReserve once, then cuMemCreate +
cuMemMap + cuMemSetAccess to map, cuMemUnmap + cuMemRelease to release. Where the driver or the device lacks
them, `RemappableBuffer.create` returns None and the caller keeps its plain allocation.
"""

from __future__ import annotations

import ctypes

_ALLOCATION_PINNED = 1  # CU_MEM_ALLOCATION_TYPE_PINNED
_LOCATION_DEVICE = 1  # CU_MEM_LOCATION_TYPE_DEVICE
_ACCESS_READWRITE = 3  # CU_MEM_ACCESS_FLAGS_PROT_READWRITE
_GRANULARITY_MINIMUM = 0  # CU_MEM_ALLOC_GRANULARITY_MINIMUM


class _Location(ctypes.Structure):
    _fields_ = [("type", ctypes.c_int), ("id", ctypes.c_int)]


class _AllocFlags(ctypes.Structure):
    _fields_ = [("compressionType", ctypes.c_ubyte), ("gpuDirectRDMACapable", ctypes.c_ubyte),
                ("usage", ctypes.c_ushort), ("reserved", ctypes.c_ubyte * 4)]


class _AllocationProp(ctypes.Structure):  # CUmemAllocationProp
    _fields_ = [("type", ctypes.c_int), ("requestedHandleTypes", ctypes.c_int), ("location", _Location),
                ("win32HandleMetaData", ctypes.c_void_p), ("allocFlags", _AllocFlags)]


class _AccessDesc(ctypes.Structure):  # CUmemAccessDesc
    _fields_ = [("location", _Location), ("flags", ctypes.c_int)]


class DeviceMemoryError(RuntimeError):
    pass


def _driver() -> ctypes.CDLL | None:
    try:
        return ctypes.CDLL("libcuda.so.1")
    except OSError:
        return None


class RemappableBuffer:
    """`nbytes` of device memory at a fixed address; `map` / `release` attach and detach physical memory."""

    def __init__(self, lib: ctypes.CDLL, device: int, nbytes: int):
        self.lib, self.device = lib, device
        self.prop = _AllocationProp(type=_ALLOCATION_PINNED, location=_Location(_LOCATION_DEVICE, device))
        granularity = ctypes.c_size_t()
        self._check(lib.cuMemGetAllocationGranularity(ctypes.byref(granularity), ctypes.byref(self.prop),
                                                      _GRANULARITY_MINIMUM), "cuMemGetAllocationGranularity")
        g = granularity.value
        self.nbytes = -(-nbytes // g) * g
        self.address = ctypes.c_uint64()
        self._check(lib.cuMemAddressReserve(ctypes.byref(self.address), ctypes.c_size_t(self.nbytes),
                                            ctypes.c_size_t(g), ctypes.c_uint64(0), ctypes.c_uint64(0)),
                    "cuMemAddressReserve")
        self.handle: ctypes.c_uint64 | None = None

    @classmethod
    def create(cls, nbytes: int) -> RemappableBuffer | None:
        """A reservation of nbytes on the current device, or None where the driver cannot make one."""
        import cupy

        lib = _driver()
        if lib is None or not hasattr(lib, "cuMemAddressReserve"):
            return None
        try:
            return cls(lib, cupy.cuda.Device().id, nbytes)
        except DeviceMemoryError:
            return None

    @property
    def mapped(self) -> bool:
        return self.handle is not None

    def map(self) -> None:
        """Back the whole range with new device memory (contents undefined)."""
        if self.mapped:
            return
        handle = ctypes.c_uint64()
        size = ctypes.c_size_t(self.nbytes)
        self._check(self.lib.cuMemCreate(ctypes.byref(handle), size, ctypes.byref(self.prop), ctypes.c_uint64(0)),
                    "cuMemCreate (out of device memory?)")
        try:
            self._check(self.lib.cuMemMap(self.address, size, ctypes.c_size_t(0), handle, ctypes.c_uint64(0)),
                        "cuMemMap")
        except DeviceMemoryError:
            self.lib.cuMemRelease(handle)
            raise
        access = _AccessDesc(location=_Location(_LOCATION_DEVICE, self.device), flags=_ACCESS_READWRITE)
        self._check(self.lib.cuMemSetAccess(self.address, size, ctypes.byref(access), ctypes.c_size_t(1)),
                    "cuMemSetAccess")
        self.handle = handle

    def release(self) -> None:
        """Give the physical memory back to the driver; the addresses stay reserved for the next `map`."""
        if not self.mapped:
            return
        import cupy

        cupy.cuda.Device().synchronize()  # no kernel may still read the memory
        self._check(self.lib.cuMemUnmap(self.address, ctypes.c_size_t(self.nbytes)), "cuMemUnmap")
        self._check(self.lib.cuMemRelease(self.handle), "cuMemRelease")
        self.handle = None

    def array(self, shape: tuple[int, ...], dtype):
        """A CuPy array over the mapped range (it must stay mapped while the array is used)."""
        import cupy
        import numpy as np

        if not self.mapped:
            raise DeviceMemoryError("the buffer is released: map() it first")
        nbytes = int(np.prod(shape)) * np.dtype(dtype).itemsize
        if nbytes > self.nbytes:
            raise DeviceMemoryError(f"an array of {nbytes} bytes does not fit the {self.nbytes}-byte buffer")
        memory = cupy.cuda.UnownedMemory(self.address.value, self.nbytes, self)
        return cupy.ndarray(shape, dtype, cupy.cuda.MemoryPointer(memory, 0))

    def _check(self, status: int, what: str) -> None:
        if status != 0:
            raise DeviceMemoryError(f"{what} failed with CUDA driver error {status}")

    def __del__(self):
        lib = getattr(self, "lib", None)
        if lib is None or not getattr(self, "address", None) or not self.address.value:
            return
        if self.handle is not None:
            # work queued on the memory (the engine's last fill of the cache, say) may outlive its last array:
            # unmapping under it faults that work with an illegal address, which the next sync reports elsewhere
            lib.cuCtxSynchronize()
            lib.cuMemUnmap(self.address, ctypes.c_size_t(self.nbytes))
            lib.cuMemRelease(self.handle)
        lib.cuMemAddressFree(self.address, ctypes.c_size_t(self.nbytes))
