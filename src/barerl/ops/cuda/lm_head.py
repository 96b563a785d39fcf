"""Chunked LM head: log-probs of targets, log-sum-exp and entropy, and their gradient (csrc/lm_head.cu).

Per chunk of rows, cuBLAS writes the chunk's logits (chunk x V) in fp32 with alpha = inv_temperature, then
one kernel reduces each row (forward) or turns it into dlogits in the activation dtype (backward), which two
GEMMs consume: dh = dlogits @ w and dw += dlogits.T @ h (beta = 1). Scratch is chunk x V x (4 + 2) bytes;
the (T, V) logits never exist whole. `lm_head_forward_backward` runs both steps on each chunk's logits
while they are in the scratch, when the loss's gradient at a token needs only that token's log-prob: one
logits GEMM per chunk instead of one in the forward and one again in the backward.
"""

from __future__ import annotations

import numpy as np

from barerl.ops.common import DEFAULT_LM_HEAD_CHUNK
from barerl.ops.cuda.build import ctype, load_kernel
from barerl.ops.cuda.cublaslt import matmul
from barerl.ops.cuda.launch import contiguous, require

_THREADS = 512


class _ChunkedHead:
    """One pass of the head over chunks of rows: contiguous inputs, the fp32 logits scratch (and the dlogits
    scratch when the pass runs backward), one method per step of a chunk. Every op runs on the current
    stream, so a step reads what the step before wrote."""

    def __init__(self, h, w, targets, inv_temperature, chunk_size, backward: bool, batch_invariant: bool):
        import cupy

        self.h = contiguous(h)
        self.w = contiguous(w.astype(h.dtype, copy=False))
        self.targets = contiguous(targets.astype(np.int32, copy=False))
        self.inv_temperature = inv_temperature
        self.chunk_size = chunk_size
        self.batch_invariant = batch_invariant
        self.defines = {"DTYPE": ctype(h.dtype)}
        rows, self.vocab = min(chunk_size, h.shape[0]), self.w.shape[0]
        self.logits = cupy.empty((rows, self.vocab), np.float32)
        self.dlogits = cupy.empty((rows, self.vocab), h.dtype) if backward else None

    def bounds(self):
        T = self.h.shape[0]
        return [(a, min(a + self.chunk_size, T)) for a in range(0, T, self.chunk_size)]

    def compute_logits(self, a, b):
        matmul(self.h[a:b], self.w, self.logits[: b - a], transb=True, alpha=float(self.inv_temperature),
               batch_invariant=self.batch_invariant)

    def stats(self, a, b, logprobs, lse, entropy):
        """Rows a:b of the (T,) outputs from the scratch's logits."""
        kernel = load_kernel("lm_head.cu", "lm_head_stats", self.defines)
        args = (logprobs[a:b], lse[a:b], entropy[a:b], self.logits, self.targets[a:b], np.int32(self.vocab))
        kernel((b - a,), (_THREADS,), args)

    def backward(self, a, b, dlogprobs, lse, dh, dw):
        """dh[a:b] and dw += ... (dw None: a frozen head) from the scratch's logits; dlogprobs, lse: rows a:b,
        contiguous fp32."""
        kernel = load_kernel("lm_head.cu", "lm_head_dlogits", self.defines)
        args = (self.dlogits, self.logits, self.targets[a:b], lse, dlogprobs, np.int32(self.vocab),
                np.float32(self.inv_temperature))
        kernel((b - a,), (_THREADS,), args)
        matmul(self.dlogits[: b - a], self.w, dh[a:b], batch_invariant=self.batch_invariant)
        if dw is not None:
            matmul(self.dlogits[: b - a], self.h[a:b], dw, transa=True, beta=1.0,
                   batch_invariant=self.batch_invariant)


def _row_stats(num_rows: int):
    import cupy

    return tuple(cupy.empty(num_rows, np.float32) for _ in range(3))


def lm_head_logprobs(h, w, targets, inv_temperature=1.0, chunk_size=DEFAULT_LM_HEAD_CHUNK, batch_invariant=False):
    """Log-probability of each target token under softmax(h @ w.T * inv_temperature).

    h (T, C), w (V, C), targets (T,) int32. Returns logprobs (T,), lse (T,) and entropy (T,), all fp32.
    """
    head = _ChunkedHead(h, w, targets, inv_temperature, chunk_size, False, batch_invariant)
    stats = _row_stats(h.shape[0])
    for a, b in head.bounds():
        head.compute_logits(a, b)
        head.stats(a, b, *stats)
    return stats


def lm_head_backward(
    dlogprobs, h, w, targets, lse, dw, inv_temperature=1.0, chunk_size=DEFAULT_LM_HEAD_CHUNK, batch_invariant=False
):
    """Gradient of `lm_head_logprobs`'s log-probs: dw (V, C) += ..., returns dh (T, C) in h's dtype."""
    import cupy

    head = _ChunkedHead(h, w, targets, inv_temperature, chunk_size, True, batch_invariant)
    dlogprobs = contiguous(dlogprobs.astype(np.float32, copy=False))
    lse = contiguous(lse)
    dh = cupy.empty_like(head.h)
    for a, b in head.bounds():
        head.compute_logits(a, b)  # again: the forward did not keep them
        head.backward(a, b, dlogprobs[a:b], lse[a:b], dh, dw)
    return dh


def lm_head_forward_backward(
    h, w, targets, token_grad, dw, inv_temperature=1.0, chunk_size=DEFAULT_LM_HEAD_CHUNK, batch_invariant=False
):
    """`lm_head_logprobs` and `lm_head_backward` in one walk over the chunks, for a loss whose gradient at a
    token depends on that token's log-prob alone: each chunk's logits serve its forward and its backward.

    token_grad(logprobs_chunk, start, stop) -> dlogprobs_chunk (stop - start,), taken as fp32, on the
    device: d loss / d logprobs[start:stop] from those log-probs, called once per chunk in order.
    dw (V, C) += ... Returns logprobs, lse, entropy (T,) fp32 and dh (T, C) in h's dtype: the same kernels
    in the same order as the two unfused ops, so the same bits.
    """
    import cupy

    head = _ChunkedHead(h, w, targets, inv_temperature, chunk_size, True, batch_invariant)
    logprobs, lse, entropy = stats = _row_stats(h.shape[0])
    dh = cupy.empty_like(head.h)
    for a, b in head.bounds():
        head.compute_logits(a, b)
        head.stats(a, b, *stats)
        g = contiguous(token_grad(logprobs[a:b], a, b).astype(np.float32, copy=False))
        # the kernel reads one value per row: a shorter or broadcast gradient would be read out of bounds
        require(g.shape == (b - a,), f"token_grad gave shape {tuple(g.shape)} for rows {a}:{b}")
        head.backward(a, b, g, lse[a:b], dh, dw)
    return logprobs, lse, entropy, dh


def lm_head_logits(h, w, inv_temperature=1.0, batch_invariant=False):
    """Logits of a few rows (the engine's last tokens): h (B, C), w (V, C) -> (B, V) fp32."""
    import cupy

    out = cupy.empty((h.shape[0], w.shape[0]), np.float32)
    return matmul(h, w.astype(h.dtype, copy=False), out, transb=True, alpha=float(inv_temperature),
                  batch_invariant=batch_invariant)
