"""Chunked LM head: log-probs of targets, log-sum-exp and entropy, and their gradient (csrc/lm_head.cu).

Per chunk of rows, cuBLAS writes the chunk's logits (chunk x V) in fp32 with alpha = inv_temperature, then
one kernel reduces each row (forward) or turns it into dlogits in the activation dtype (backward), which two
GEMMs consume: dh = dlogits @ w and dw += dlogits.T @ h (beta = 1). Scratch is chunk x V x (4 + 2) bytes;
the (T, V) logits never exist whole.
"""

from __future__ import annotations

import numpy as np

from barerl.backend.ref.nn import DEFAULT_LM_HEAD_CHUNK
from barerl.kernels.build import ctype, load_kernel
from barerl.kernels.cublaslt import matmul
from barerl.kernels.launch import contiguous

_THREADS = 512


def _inputs(h, w, targets):
    return (
        contiguous(h),
        contiguous(w.astype(h.dtype, copy=False)),
        contiguous(targets.astype(np.int32, copy=False)),
    )


def lm_head_logprobs(h, w, targets, inv_temperature=1.0, chunk_size=DEFAULT_LM_HEAD_CHUNK):
    """Log-probability of each target token under softmax(h @ w.T * inv_temperature).

    h (T, C), w (V, C), targets (T,) int32. Returns logprobs (T,), lse (T,) and entropy (T,), all fp32.
    """
    import cupy

    h, w, targets = _inputs(h, w, targets)
    T, V = h.shape[0], w.shape[0]
    logprobs, lse, entropy = (cupy.empty(T, np.float32) for _ in range(3))
    logits = cupy.empty((min(chunk_size, T), V), np.float32)
    kernel = load_kernel("lm_head.cu", "lm_head_stats", {"DTYPE": ctype(h.dtype)})
    for a in range(0, T, chunk_size):
        b = min(a + chunk_size, T)
        matmul(h[a:b], w, logits[: b - a], transb=True, alpha=float(inv_temperature))
        kernel(
            (b - a,), (_THREADS,), (logprobs[a:b], lse[a:b], entropy[a:b], logits, targets[a:b], np.int32(V))
        )
    return logprobs, lse, entropy


def lm_head_backward(
    dlogprobs, h, w, targets, lse, dw, inv_temperature=1.0, chunk_size=DEFAULT_LM_HEAD_CHUNK
):
    """Gradient of `lm_head_logprobs`'s log-probs: dw (V, C) += ..., returns dh (T, C) in h's dtype."""
    import cupy

    h, w, targets = _inputs(h, w, targets)
    dlogprobs = contiguous(dlogprobs.astype(np.float32, copy=False))
    lse = contiguous(lse)
    T, V = h.shape[0], w.shape[0]
    dh = cupy.empty_like(h)
    rows = min(chunk_size, T)
    logits = cupy.empty((rows, V), np.float32)
    dlogits = cupy.empty((rows, V), h.dtype)
    kernel = load_kernel("lm_head.cu", "lm_head_dlogits", {"DTYPE": ctype(h.dtype)})
    for a in range(0, T, chunk_size):
        b = min(a + chunk_size, T)
        matmul(h[a:b], w, logits[: b - a], transb=True, alpha=float(inv_temperature))
        kernel(
            (b - a,),
            (_THREADS,),
            (
                dlogits,
                logits,
                targets[a:b],
                lse[a:b],
                dlogprobs[a:b],
                np.int32(V),
                np.float32(inv_temperature),
            ),
        )
        matmul(dlogits[: b - a], w, dh[a:b])
        matmul(dlogits[: b - a], h[a:b], dw, transa=True, beta=1.0)
    return dh
