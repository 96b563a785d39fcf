"""Backends: the same op names on NumPy (`ref`, the definition) and on CUDA kernels (`cuda`).

Model, engine and trainer code call only `backend.<op>`; choosing a device picks the module.
"""

from __future__ import annotations

from types import ModuleType

DEVICES = ("cpu", "cuda")


def get_backend(device: str = "cpu") -> ModuleType:
    if device == "cpu":
        from barerl.backend import ref

        return ref
    if device == "cuda":
        from barerl.backend import cuda

        return cuda
    raise ValueError(f"device must be one of {DEVICES}, got {device!r}")
