"""FlashAttention-2 launchers (csrc/attention.cu): packed causal varlen attention with GQA.

Compiled per (dtype, head_dim). bf16/fp16 with head_dim 64 or 128 run the tensor-core kernels; fp32 inputs
(tests, debugging; mma.sync has no fp32 operands) and other head sizes (small demo models) run the reference
op on the same CuPy arrays. q, k, v may be row-strided
views of a fused qkv buffer (no copies); o and the gradients are dense. The backward adds dQ with fp32
atomics into a zeroed scratch, then rounds it to the input dtype.
"""

from __future__ import annotations

import numpy as np

from barerl.ops import ref
from barerl.ops.cuda.build import ctype, load_kernel
from barerl.ops.cuda.launch import contiguous, multiprocessors, require, reserve_shared_memory

# Block shapes, compile-time in the kernels; the benchmark tries other values. Forward: warps per block,
# m16 row tiles per warp (query rows per block = 16 x fwd_mt x fwd_warps) and keys per K/V tile; backward:
# warps per block (16 keys each). "defines" adds switches (the benchmark's leave-one-stage-out variants).
# Defaults: the fastest measured at T1 shapes on the H200 (docs/LOG.md).
CONFIG = {"fwd_warps": 4, "fwd_mt": 2, "fwd_bn": 64, "bwd_warps": 4, "defines": {}}
_BWD_BM, _DELTA_THREADS = 32, 128
LOG2E = 1.4426950408889634


def _rows(x, name: str):
    """x (T, heads, D) with dense heads and dims and 16-byte-aligned rows: x itself, else a dense copy."""
    item = x.dtype.itemsize
    D = x.shape[2]
    dense = x.strides[2] == item and x.strides[1] == D * item and (x.strides[0] // item) % 8 == 0
    require(x.ndim == 3, f"attention: {name} must be (T, heads, head_dim), got {x.shape}")
    return x if dense else contiguous(x)


def tensor_cores_cover(q) -> bool:
    return q.dtype != np.float32 and q.shape[2] in (64, 128)


def forward_block_rows() -> int:
    """Query rows per block of the forward kernels (flash_attention_forward, paged_prefill_attention)."""
    return 16 * CONFIG["fwd_mt"] * CONFIG["fwd_warps"]


def forward_shared_bytes(head_dim: int, dtype) -> int:
    """Dynamic shared memory of a forward block: its Q tile and two stages of K and V tiles."""
    return (forward_block_rows() + 4 * CONFIG["fwd_bn"]) * (head_dim + 8) * np.dtype(dtype).itemsize


def attention_defines(dtype, head_dim: int) -> dict:
    return {
        "DTYPE": ctype(dtype),
        "HEAD_DIM": head_dim,
        "FWD_WARPS": CONFIG["fwd_warps"],
        "FWD_MT": CONFIG["fwd_mt"],
        "FWD_BN_KEYS": CONFIG["fwd_bn"],
        "BWD_WARPS": CONFIG["bwd_warps"],
        **CONFIG["defines"],
    }


def _setup(q, k, v, cu_seqlens, kernel_name: str):
    T, H, D = q.shape
    K = k.shape[1]
    require(H % K == 0, f"attention: query heads {H} must be a multiple of kv heads {K}")
    require(D in (64, 128), f"attention: head_dim {D} is not supported by the kernel (64 or 128)")
    require(k.shape == v.shape == (T, K, D), f"attention: k {k.shape} / v {v.shape} do not match q {q.shape}")
    defines = attention_defines(q.dtype, D)
    cu = contiguous(cu_seqlens.astype(np.int32, copy=False))
    return load_kernel("attention.cu", kernel_name, defines), defines, cu, cu.shape[0] - 1


def _strides(*arrays):
    return tuple(np.int64(a.strides[0] // a.dtype.itemsize) for a in arrays)


def attention(q, k, v, cu_seqlens, scale):
    """Causal softmax(q k^T * scale) v within each sequence: o (T, H, D) in q's dtype, lse (H, T) fp32."""
    import cupy

    if not tensor_cores_cover(q):
        return ref.attention(q, k, v, cu_seqlens, scale)
    q, k, v = (
        _rows(q, "q"),
        _rows(k.astype(q.dtype, copy=False), "k"),
        _rows(v.astype(q.dtype, copy=False), "v"),
    )
    T, H, D = q.shape
    kernel, _, cu, num_seqs = _setup(q, k, v, cu_seqlens, "flash_attention_forward")
    o = cupy.empty((T, H, D), q.dtype)
    lse = cupy.empty((H, T), np.float32)
    if T:
        smem = reserve_shared_memory(kernel, forward_shared_bytes(D, q.dtype))
        kernel(
            (-(-T // forward_block_rows()) + num_seqs, H),
            (32 * CONFIG["fwd_warps"],),
            (
                o,
                lse,
                q,
                k,
                v,
                cu,
                np.int32(num_seqs),
                np.int32(H),
                np.int32(k.shape[1]),
                *_strides(q, k, v),
                np.int32(T),
                np.float32(scale * LOG2E),
            ),
            shared_mem=smem,
        )
    return o, lse


def attention_backward(do, q, k, v, o, lse, cu_seqlens, scale):
    """Gradient of `attention`, recomputing the probabilities from lse. Returns dqkv (T, (H + 2K) D): dq, dk
    and dv side by side, as the fused qkv rows q, k and v are views of (ops.ref.attention_backward)."""
    import cupy

    if not tensor_cores_cover(q):
        return ref.attention_backward(do, q, k, v, o, lse, cu_seqlens, scale)
    q, k, v = (
        _rows(q, "q"),
        _rows(k.astype(q.dtype, copy=False), "k"),
        _rows(v.astype(q.dtype, copy=False), "v"),
    )
    do, o = contiguous(do.astype(q.dtype, copy=False)), contiguous(o.astype(q.dtype, copy=False))
    T, H, D = q.shape
    K = k.shape[1]
    kernel, defines, cu, num_seqs = _setup(q, k, v, cu_seqlens, "flash_attention_backward")
    dq_accum = cupy.zeros((T, H, D), np.float32)
    dqkv = cupy.empty((T, (H + 2 * K) * D), q.dtype)
    if not T:
        return dqkv
    dk, dv = dqkv[:, H * D : (H + K) * D], dqkv[:, (H + K) * D :]  # the kernel writes rows of these views
    delta = cupy.empty((H, T), np.float32)
    load_kernel("attention.cu", "attention_delta", defines)(
        (max(1, min(-(-T * H // 4), multiprocessors() * 16)),),
        (_DELTA_THREADS,),
        (delta, do, o, np.int32(T), np.int32(H)),
    )
    item, block_n = q.dtype.itemsize, 16 * CONFIG["bwd_warps"]
    smem = reserve_shared_memory(
        kernel,
        (2 * block_n + 4 * _BWD_BM) * (D + 8) * item + block_n * (_BWD_BM + 8) * item + 4 * _BWD_BM * 4,
    )
    kernel(
        (-(-T // block_n) + num_seqs, K),
        (32 * CONFIG["bwd_warps"],),
        (
            dq_accum,
            dk,
            dv,
            q,
            k,
            v,
            do,
            contiguous(lse),
            delta,
            cu,
            np.int32(num_seqs),
            np.int32(H),
            np.int32(K),
            *_strides(q, k, v),
            np.int32(T),
            np.float32(scale),
            np.float32(scale * LOG2E),
            np.int64(dqkv.shape[1]),
        ),
        shared_mem=smem,
    )
    load_kernel("attention.cu", "round_rows_to_dtype", defines)(
        (min(T, multiprocessors() * 16),), (256,),
        (dqkv, dq_accum, np.int64(T), np.int32(H * D), np.int64(dqkv.shape[1])),
    )
    return dqkv
