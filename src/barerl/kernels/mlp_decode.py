"""A decode step's MLP in one pass over its weights (csrc/mlp_decode.cu), and the backend's `mlp` op.

Design decisions:
- `mlp` is the reference twin's contract (residual + swiglu(x @ w_gate_up.T) @ w_down.T) with the products
  and the activation rounded where the separate ops round them; only fp32 summation orders differ.
- The fused form runs where it pays and fits: at most 64 rows (decode batches), sm_90 (clusters), shapes the
  kernel's tiling divides, and its weight tiles within one SM's shared memory (Qwen3-0.6B: 211 KB).
  Everything else, and the batch-invariant mode (whose rows must match the trainer's products bit for bit),
  composes linear, swiglu and linear.
"""

from __future__ import annotations

import numpy as np

from barerl.kernels import cublaslt
from barerl.kernels.build import compute_capability, ctype, load_kernel
from barerl.kernels.launch import num_blocks, require, reserve_shared_memory
from barerl.kernels.linear import linear
from barerl.kernels.swiglu import swiglu

MAX_ROWS = 64  # must equal ROWS in mlp_decode.cu
_CLUSTERS, _CTAS, _THREADS = 16, 128, 256  # CLUSTERS, CLUSTERS x CLUSTER and THREADS in mlp_decode.cu
_SHARED_MEMORY_LIMIT = 227 * 1024  # an H100 / H200 CTA's dynamic shared memory
_FUSED = True  # False: always compose (A/B switch for benchmarks)


def shared_memory_bytes(hidden: int, inter: int) -> int:
    """mlp_decode.cu's SMEM_BYTES: the x half, gate_up's and down's weight tiles, one slot of the activation."""
    per_cta = inter // 128
    return 2 * (MAX_ROWS * hidden // 2 + 4 * per_cta * hidden // 2 + hidden // 8 * inter // 16 + MAX_ROWS * per_cta)


def fusable(x, w_gate_up, w_down) -> bool:
    rows, hidden = x.shape
    inter = w_down.shape[1]
    return (
        1 <= rows <= MAX_ROWS
        and hidden % 512 == 0
        and inter % 1024 == 0
        and x.dtype.itemsize == 2
        and w_gate_up.dtype == w_down.dtype == x.dtype
        and w_gate_up.shape == (2 * inter, hidden)
        and w_down.shape == (hidden, inter)
        and shared_memory_bytes(hidden, inter) <= _SHARED_MEMORY_LIMIT
        and int(compute_capability()) >= 90
    )


def mlp_decode(x, w_gate_up, w_down, residual):
    """residual + swiglu(x @ w_gate_up.T) @ w_down.T for x (M <= 64, C): two launches (csrc/mlp_decode.cu)."""
    import cupy

    require(fusable(x, w_gate_up, w_down), f"mlp_decode: unsupported shapes or dtypes {x.shape} {w_down.shape}")
    require(residual.shape == x.shape and residual.dtype == x.dtype, "mlp_decode: residual must be like x")
    rows, hidden = x.shape
    inter = w_down.shape[1]
    x, w_gate_up, w_down, residual = (cupy.ascontiguousarray(a) for a in (x, w_gate_up, w_down, residual))
    defines = {"DTYPE": ctype(x.dtype), "HIDDEN": hidden, "INTER": inter}
    kernel = load_kernel("mlp_decode.cu", "mlp_decode", defines)
    smem = reserve_shared_memory(kernel, shared_memory_bytes(hidden, inter))
    parts = cupy.empty((_CLUSTERS, rows, hidden), np.float32)
    kernel((_CTAS,), (_THREADS,), (parts, x, w_gate_up, w_down, np.int32(rows)), shared_mem=smem)
    out = cupy.empty_like(residual)
    load_kernel("mlp_decode.cu", "mlp_decode_sum", defines)(
        (num_blocks(rows * hidden // 4, 256),), (256,), (out, parts, residual, np.int32(rows)))
    return out


def mlp(x, w_gate_up, w_down, residual):
    """residual + swiglu(x @ w_gate_up.T) @ w_down.T (backend.ref.nn.mlp's contract)."""
    if _FUSED and not cublaslt.batch_invariant() and fusable(x, w_gate_up, w_down):
        return mlp_decode(x, w_gate_up, w_down, residual)
    return linear(swiglu(linear(x, w_gate_up)), w_down, residual=residual)
