"""SwiGLU launchers (csrc/swiglu.cu): elementwise, 16-byte vectors, grid-stride."""

from __future__ import annotations

import numpy as np

from barerl.ops.cuda.build import ctype, load_kernel
from barerl.ops.cuda.launch import contiguous, num_blocks, require


def _inter(gate_up) -> int:
    inter = gate_up.shape[-1] // 2
    vec = 16 // gate_up.dtype.itemsize
    require(
        gate_up.shape[-1] % 2 == 0 and inter % vec == 0,
        f"swiglu: gate_up's last axis ({gate_up.shape[-1]}) must be 2 x a multiple of {vec}",
    )
    return inter


def swiglu(gate_up):
    """gate_up (T, 2I) = [gate | up] -> silu(gate) * up (T, I)."""
    import cupy

    gate_up = contiguous(gate_up)
    inter = _inter(gate_up)
    rows = gate_up.shape[0]
    a = cupy.empty((rows, inter), gate_up.dtype)
    kernel = load_kernel("swiglu.cu", "swiglu_forward", {"DTYPE": ctype(gate_up.dtype)})
    kernel(
        (num_blocks(a.size // (16 // a.dtype.itemsize), 256),),
        (256,),
        (a, gate_up, np.int64(rows), np.int32(inter)),
    )
    return a


def swiglu_backward(da, gate_up):
    """Gradient of `swiglu`: returns d gate_up (T, 2I)."""
    import cupy

    gate_up = contiguous(gate_up)
    da = contiguous(da.astype(gate_up.dtype, copy=False))
    inter = _inter(gate_up)
    rows = gate_up.shape[0]
    dgate_up = cupy.empty_like(gate_up)
    kernel = load_kernel("swiglu.cu", "swiglu_backward", {"DTYPE": ctype(gate_up.dtype)})
    kernel(
        (num_blocks(da.size // (16 // da.dtype.itemsize), 256),),
        (256,),
        (dgate_up, da, gate_up, np.int64(rows), np.int32(inter)),
    )
    return dgate_up
