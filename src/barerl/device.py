"""Which device a command runs on: `auto` is the GPU when CuPy finds one, else the CPU, for every command
(train, eval, generate); `cuda` without CuPy or without a GPU is one clear error saying what to install."""

from __future__ import annotations

DEVICES = ("auto", "cpu", "cuda")
INSTALL_CUDA = ("install CuPy with barerl's GPU extra: pip install 'barerl[cuda12]' (CUDA 12 drivers) or "
                "'barerl[cuda13]' (CUDA 13)")


def import_cupy():
    """The cupy module, or a ValueError saying how to install it."""
    try:
        import cupy
    except ImportError:
        raise ValueError(f"device cuda: CuPy is not installed; {INSTALL_CUDA}, or use --device cpu") from None
    return cupy


def resolve_device(device: str) -> str:
    """'auto' -> 'cuda' when CuPy sees a GPU, else 'cpu'; 'cuda' is checked (CuPy installed, a GPU present)."""
    if device not in DEVICES:
        raise ValueError(f"device must be one of {list(DEVICES)}, got {device!r}")
    if device == "cpu":
        return device
    try:
        cupy = import_cupy()
        count = cupy.cuda.runtime.getDeviceCount()
    except Exception as e:  # noqa: BLE001 -- no cupy, no driver or no GPU: auto means the CPU then
        if device == "auto":
            return "cpu"
        raise e if isinstance(e, ValueError) else ValueError(
            f"device cuda: CuPy finds no usable GPU ({type(e).__name__}: {e}); use --device cpu") from None
    if count == 0:
        if device == "auto":
            return "cpu"
        raise ValueError("device cuda: CuPy finds no GPU; use --device cpu")
    return "cuda"


def resolve_auto_dtype(dtype: str, device: str) -> str:
    """'auto' -> bfloat16 on the GPU, float32 on the CPU."""
    if dtype != "auto":
        return dtype
    return "bfloat16" if device == "cuda" else "float32"
