"""The LM head: logits are only ever built for a chunk of tokens at a time, so no (tokens, vocab) fp32 matrix
exists for a batch.

The conventions every op follows (packing, fp32 arithmetic, accumulated gradients) are `barerl.ops.ref`'s.
"""

from __future__ import annotations

import numpy as np

from barerl.ops.common import DEFAULT_LM_HEAD_CHUNK, as_f32, xp_of

__all__ = ["lm_head_backward", "lm_head_forward_backward", "lm_head_logits", "lm_head_logprobs"]


def lm_head_logits(h, w, inv_temperature=1.0, batch_invariant=False):
    """Logits of a few rows (the engine's last tokens): h (B, C), w (V, C) -> (B, V) fp32."""
    return (as_f32(h) @ as_f32(w).T) * np.float32(inv_temperature)


def _chunk_bounds(num_rows: int, chunk_size: int):
    return [(a, min(a + chunk_size, num_rows)) for a in range(0, num_rows, chunk_size)]


def _chunk_logits(hf, wf, inv_temperature):
    return (hf @ wf.T) * np.float32(inv_temperature)


def _chunk_stats(xp, logits, targets):
    """Each row's target log-prob, log-sum-exp and entropy, from one chunk of logits (rows, V)."""
    m = logits.max(axis=-1, keepdims=True)
    e = xp.exp(logits - m)
    z = e.sum(axis=-1, keepdims=True)
    lse = (m + xp.log(z))[:, 0]
    logprobs = logits[xp.arange(logits.shape[0]), targets] - lse
    return logprobs, lse, lse - (e * logits).sum(axis=-1) / z[:, 0]


def _chunk_backward(xp, logits, hf, wf, targets, lse, dlogprobs, inv_temperature, dw):
    """From one chunk's logits and its rows' fp32 dlogprobs: dw += dlogits.T @ h (unless dw is None: a frozen
    head); returns dh = dlogits @ w."""
    t = np.float32(inv_temperature)
    dlogits = -xp.exp(logits - lse[:, None]) * dlogprobs[:, None]
    dlogits[xp.arange(logits.shape[0]), targets] += dlogprobs
    dlogits *= t
    if dw is not None:
        dw += (dlogits.T @ hf).astype(dw.dtype, copy=False)
    return dlogits @ wf


def lm_head_logprobs(h, w, targets, inv_temperature=1.0, chunk_size=DEFAULT_LM_HEAD_CHUNK, batch_invariant=False):
    """Log-probability of each target token under softmax(h @ w.T * inv_temperature).

    h (T, C), w (V, C), targets (T,) int32. Returns logprobs (T,), lse (T,) and entropy (T,), all fp32.
    The (T, V) logits are never held whole: at most chunk_size x V at a time.
    """
    xp = xp_of(h)
    logprobs, lse, entropy = (xp.empty(h.shape[0], np.float32) for _ in range(3))
    wf = as_f32(w)
    for a, b in _chunk_bounds(h.shape[0], chunk_size):
        logits = _chunk_logits(as_f32(h[a:b]), wf, inv_temperature)
        logprobs[a:b], lse[a:b], entropy[a:b] = _chunk_stats(xp, logits, targets[a:b])
    return logprobs, lse, entropy


def lm_head_backward(dlogprobs, h, w, targets, lse, dw, inv_temperature=1.0, chunk_size=DEFAULT_LM_HEAD_CHUNK,
                     batch_invariant=False):
    """Gradient of `lm_head_logprobs`'s log-probs: dw (V, C) += ... (None: a frozen head), returns dh (T, C)
    in h's dtype."""
    xp = xp_of(h)
    dh = xp.empty(h.shape, np.float32)
    wf = as_f32(w)
    for a, b in _chunk_bounds(h.shape[0], chunk_size):
        hf = as_f32(h[a:b])
        logits = _chunk_logits(hf, wf, inv_temperature)  # again: the forward did not keep them
        g = as_f32(dlogprobs[a:b])
        dh[a:b] = _chunk_backward(xp, logits, hf, wf, targets[a:b], lse[a:b], g, inv_temperature, dw)
    return dh.astype(h.dtype, copy=False)


def lm_head_forward_backward(h, w, targets, token_grad, dw, inv_temperature=1.0,
                             chunk_size=DEFAULT_LM_HEAD_CHUNK, batch_invariant=False):
    """`lm_head_logprobs` and `lm_head_backward` in one walk over the chunks, for a loss whose gradient at a
    token depends on that token's log-prob alone: each chunk's logits serve its forward and its backward.

    token_grad(logprobs_chunk, start, stop) -> dlogprobs_chunk (stop - start,), taken as fp32: d loss / d
    logprobs[start:stop] from those log-probs, called once per chunk in order. dw (V, C) += ...
    Returns logprobs, lse, entropy (T,) fp32 and dh (T, C) in h's dtype, as the two unfused ops would.
    """
    xp = xp_of(h)
    logprobs, lse, entropy = (xp.empty(h.shape[0], np.float32) for _ in range(3))
    dh = xp.empty(h.shape, np.float32)
    wf = as_f32(w)
    for a, b in _chunk_bounds(h.shape[0], chunk_size):
        hf = as_f32(h[a:b])
        logits = _chunk_logits(hf, wf, inv_temperature)
        logprobs[a:b], lse[a:b], entropy[a:b] = _chunk_stats(xp, logits, targets[a:b])
        g = as_f32(token_grad(logprobs[a:b], a, b))
        dh[a:b] = _chunk_backward(xp, logits, hf, wf, targets[a:b], lse[a:b], g, inv_temperature, dw)
    return logprobs, lse, entropy, dh.astype(h.dtype, copy=False)
