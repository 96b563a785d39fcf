"""Reference ops of the network itself: the living definition of every layer op, forward and backward.

Each function is written against an array namespace (`xp`): given NumPy arrays it runs on the CPU, given
CuPy arrays it runs unchanged on the GPU, where it is the oracle for the CUDA kernels. Every op here has a
twin of the same name and signature in `backend.cuda`.

Conventions, shared with the kernels:
- Activations are (tokens, features), packed: sequences are concatenated and `cu_seqlens` (int32,
  (S+1,)) marks their boundaries; `positions` (int32, (T,)) gives each token's position in its sequence.
- Arithmetic is fp32 whatever the storage dtype (bf16/fp16/fp32); outputs are cast back to the
  activation dtype, except statistics (rstd, lse, log-probs), which stay fp32.
- Weight gradients are accumulated: `*_backward` adds into the `dw`/`db` arrays it is given (the caller
  zeroes them once per optimizer step), and returns the gradient of its input.
- Linear weights are stored as Hugging Face does: (out_features, in_features), so y = x @ w.T.
"""

from __future__ import annotations

import itertools

import numpy as np

__all__ = [
    "DEFAULT_LM_HEAD_CHUNK",
    "advance_decode",
    "attention",
    "attention_backward",
    "embedding",
    "embedding_backward",
    "linear",
    "linear_backward",
    "lm_head_backward",
    "lm_head_forward_backward",
    "lm_head_logits",
    "lm_head_logprobs",
    "paged_attention",
    "paged_attention_invariant",
    "qk_norm_rope",
    "qk_norm_rope_backward",
    "qk_norm_rope_store",
    "rmsnorm",
    "rmsnorm_backward",
    "set_batch_invariant",
    "store_kv",
    "swiglu",
    "swiglu_backward",
    "xp_of",
]

DEFAULT_LM_HEAD_CHUNK = 1024  # tokens per LM-head chunk: bounds the fp32 logits to chunk x vocab


def xp_of(*arrays):
    """NumPy or CuPy, whichever owns the arrays."""
    for a in arrays:
        if a is not None and type(a).__module__.startswith("cupy"):
            import cupy

            return cupy
    return np


def _f32(x):
    return x.astype(np.float32, copy=False)


def _scatter_add(xp, target, index, values):
    if xp is np:
        np.add.at(target, index, values)
    else:
        import cupyx

        cupyx.scatter_add(target, index, values)


# ---------------------------------------------------------------------------------------------------------
# Embedding


def embedding(ids, table):
    """ids (T,) int32, table (V, C) -> (T, C) in table's dtype."""
    return table[ids]


def embedding_backward(dx, ids, dtable):
    """dtable (V, C) += scatter of dx (T, C) rows at ids."""
    xp = xp_of(dx)
    _scatter_add(xp, dtable, ids, _f32(dx).astype(dtable.dtype, copy=False))


# ---------------------------------------------------------------------------------------------------------
# RMSNorm


def rmsnorm(x, w, eps):
    """y = x / rms(x) * w over the last axis. x (T, C), w (C,) -> y (T, C), rstd (T,) fp32."""
    xp = xp_of(x)
    xf = _f32(x)
    rstd = 1.0 / xp.sqrt((xf * xf).mean(axis=-1) + np.float32(eps))
    y = (xf * rstd[..., None]) * _f32(w)
    return y.astype(x.dtype, copy=False), rstd.astype(np.float32, copy=False)


def rmsnorm_backward(dy, x, w, rstd, dw, residual_grad=None):
    """dw (C,) += sum over rows of dy * x_hat (dw None: a frozen weight); returns dx (T, C) in x's dtype, plus
    residual_grad (the residual stream's gradient around the norm) when given, added in fp32 before the
    rounding."""
    xf, dyf = _f32(x), _f32(dy)
    xhat = xf * rstd[..., None]
    dxhat = dyf * _f32(w)
    if dw is not None:
        dw += (dyf * xhat).reshape(-1, xf.shape[-1]).sum(axis=0).astype(dw.dtype, copy=False)
    dx = rstd[..., None] * (dxhat - xhat * (dxhat * xhat).mean(axis=-1, keepdims=True))
    if residual_grad is not None:
        if residual_grad.shape != x.shape:  # as the kernel's launcher: a broadcast would hide a caller's bug
            raise ValueError(f"rmsnorm_backward: residual_grad {residual_grad.shape} does not match x {x.shape}")
        dx += _f32(residual_grad)
    return dx.astype(x.dtype, copy=False)


# ---------------------------------------------------------------------------------------------------------
# Linear (cuBLAS on the GPU; bias and residual are GEMM epilogues there)


def linear(x, w, bias=None, residual=None, scale=1.0):
    """y = scale * x @ w.T + bias + residual. x (T, K), w (N, K), bias (N,), residual (T, N) -> (T, N)."""
    y = _f32(x) @ _f32(w).T
    if scale != 1.0:
        y *= np.float32(scale)
    if bias is not None:
        y += _f32(bias)
    if residual is not None:
        y += _f32(residual)
    return y.astype(x.dtype, copy=False)


def linear_backward(dy, x, w, dw, dbias=None, scale=1.0, residual_grad=None):
    """Gradient of `linear`: dw (N, K) += scale * dy.T @ x (dw None: no weight gradient, a frozen weight);
    dbias (N,) += sum(dy); returns dx = scale * dy @ w (T, K) in x's dtype, plus residual_grad (T, K) when
    given (x's gradient along another path), added in fp32 before the rounding."""
    dyf = _f32(dy)
    if dw is not None:
        dw += (np.float32(scale) * (dyf.T @ _f32(x))).astype(dw.dtype, copy=False)
    if dbias is not None:
        dbias += dyf.sum(axis=0).astype(dbias.dtype, copy=False)
    dx = dyf @ _f32(w)
    if scale != 1.0:
        dx *= np.float32(scale)
    if residual_grad is not None:
        dx += _f32(residual_grad)
    return dx.astype(x.dtype, copy=False)


# ---------------------------------------------------------------------------------------------------------
# Per-head q/k RMSNorm (Qwen3) + rotary embedding (NeoX half-split), fused


def _heads(qkv, num_heads, num_kv_heads):
    """Split (T, (H + 2K) * D) into q (T, H, D), k (T, K, D), v (T, K, D) fp32 copies."""
    T = qkv.shape[0]
    D = qkv.shape[1] // (num_heads + 2 * num_kv_heads)
    x = _f32(qkv).reshape(T, num_heads + 2 * num_kv_heads, D)
    return x[:, :num_heads], x[:, num_heads : num_heads + num_kv_heads], x[:, num_heads + num_kv_heads :]


def _rotate(x, cos, sin):
    """NeoX rotation of x (T, H, D) by angle tables cos/sin (T, D/2)."""
    h = x.shape[-1] // 2
    c, s = cos[:, None, :], sin[:, None, :]
    x1, x2 = x[..., :h], x[..., h:]
    return x1 * c - x2 * s, x2 * c + x1 * s


def _unrotate(dy, cos, sin):
    """Transpose of `_rotate` (its gradient)."""
    h = dy.shape[-1] // 2
    c, s = cos[:, None, :], sin[:, None, :]
    d1, d2 = dy[..., :h], dy[..., h:]
    return d1 * c + d2 * s, d2 * c - d1 * s


def qk_norm_rope(qkv, positions, cos, sin, num_heads, num_kv_heads, q_norm=None, k_norm=None, eps=1e-6):
    """Normalise each q and k head (when q_norm/k_norm are given), then rotate q and k; v passes through.

    qkv (T, (H + 2K) * D); positions (T,) int32; cos, sin (P, D/2) fp32 tables; q_norm, k_norm (D,) or None.
    Returns out (T, (H + 2K) * D) in qkv's dtype, q_rstd (T, H) and k_rstd (T, K) fp32 (empty without norm).
    """
    xp = xp_of(qkv)
    q, k, v = _heads(qkv, num_heads, num_kv_heads)
    c, s = cos[positions], sin[positions]
    q_rstd = xp.zeros((qkv.shape[0], 0), np.float32)
    k_rstd = q_rstd
    if q_norm is not None:
        q, q_rstd = rmsnorm(q, q_norm, eps)
        k, k_rstd = rmsnorm(k, k_norm, eps)
    q = xp.concatenate(_rotate(q, c, s), axis=-1)
    k = xp.concatenate(_rotate(k, c, s), axis=-1)
    out = xp.concatenate([q, k, v], axis=1).reshape(qkv.shape)
    return out.astype(qkv.dtype, copy=False), q_rstd, k_rstd


def qk_norm_rope_backward(
    dout, qkv, positions, cos, sin, num_heads, num_kv_heads, q_norm, k_norm, q_rstd, k_rstd, dq_norm, dk_norm
):
    """Gradient of `qk_norm_rope` with respect to qkv; dq_norm, dk_norm (D,) are accumulated (None: frozen)."""
    xp = xp_of(dout)
    dq, dk, dv = _heads(dout, num_heads, num_kv_heads)
    c, s = cos[positions], sin[positions]
    dq = xp.concatenate(_unrotate(dq, c, s), axis=-1)
    dk = xp.concatenate(_unrotate(dk, c, s), axis=-1)
    if q_norm is not None:
        q, k, _ = _heads(qkv, num_heads, num_kv_heads)
        dq = rmsnorm_backward(dq, q, q_norm, q_rstd, dq_norm)
        dk = rmsnorm_backward(dk, k, k_norm, k_rstd, dk_norm)
    return xp.concatenate([dq, dk, dv], axis=1).reshape(qkv.shape).astype(qkv.dtype, copy=False)


# ---------------------------------------------------------------------------------------------------------
# Causal attention over packed variable-length sequences, with grouped-query heads


def _segments(cu_seqlens):
    cu = [int(c) for c in (cu_seqlens.get() if hasattr(cu_seqlens, "get") else cu_seqlens)]
    return list(itertools.pairwise(cu))


def _expand_kv(x, group):
    """(L, K, D) -> (K*group, L, D): each kv head repeated for the `group` query heads that share it."""
    return x.transpose(1, 0, 2).repeat(group, axis=0)


def attention(q, k, v, cu_seqlens, scale):
    """Causal softmax(q k^T * scale) v within each sequence.

    q (T, H, D), k and v (T, K, D) with H % K == 0, cu_seqlens (S+1,) int32.
    Returns o (T, H, D) in q's dtype and lse (H, T) fp32, the log-sum-exp of each row's scaled scores.
    """
    xp = xp_of(q)
    T, H, D = q.shape
    group = H // k.shape[1]
    o = xp.zeros((T, H, D), np.float32)
    lse = xp.zeros((H, T), np.float32)
    for a, b in _segments(cu_seqlens):
        qs = _f32(q[a:b]).transpose(1, 0, 2)  # (H, L, D)
        ks, vs = _expand_kv(_f32(k[a:b]), group), _expand_kv(_f32(v[a:b]), group)
        scores = (qs @ ks.transpose(0, 2, 1)) * np.float32(scale)  # (H, L, L)
        L = b - a
        scores = xp.where(xp.tril(xp.ones((L, L), dtype=bool)), scores, -np.inf)
        m = scores.max(axis=-1, keepdims=True)
        p = xp.exp(scores - m)
        denom = p.sum(axis=-1, keepdims=True)
        o[a:b] = ((p / denom) @ vs).transpose(1, 0, 2)
        lse[:, a:b] = (m + xp.log(denom))[..., 0]
    return o.astype(q.dtype, copy=False), lse


def attention_backward(do, q, k, v, o, lse, cu_seqlens, scale):
    """Gradient of `attention`, recomputing the probabilities from lse. Returns dqkv (T, (H + 2K) D) in q's
    dtype: dq, dk and dv side by side per token, the layout of the fused qkv rows that q, k, v are views of."""
    xp = xp_of(q)
    T, H, D = q.shape
    K = k.shape[1]
    group = H // K
    dq = xp.zeros((T, H, D), np.float32)
    dk = xp.zeros((T, K, D), np.float32)
    dv = xp.zeros((T, K, D), np.float32)
    for a, b in _segments(cu_seqlens):
        L = b - a
        qs = _f32(q[a:b]).transpose(1, 0, 2)
        ks, vs = _expand_kv(_f32(k[a:b]), group), _expand_kv(_f32(v[a:b]), group)
        dos, os_ = _f32(do[a:b]).transpose(1, 0, 2), _f32(o[a:b]).transpose(1, 0, 2)
        scores = (qs @ ks.transpose(0, 2, 1)) * np.float32(scale)
        p = xp.where(xp.tril(xp.ones((L, L), dtype=bool)), xp.exp(scores - lse[:, a:b, None]), 0.0)
        dvs = p.transpose(0, 2, 1) @ dos  # (H, L, D)
        dp = dos @ vs.transpose(0, 2, 1)
        delta = (dos * os_).sum(axis=-1, keepdims=True)
        ds = p * (dp - delta) * np.float32(scale)
        dq[a:b] = (ds @ ks).transpose(1, 0, 2)
        dks = ds.transpose(0, 2, 1) @ qs  # (H, L, D)
        dk[a:b] = dks.reshape(K, group, L, D).sum(axis=1).transpose(1, 0, 2)
        dv[a:b] = dvs.reshape(K, group, L, D).sum(axis=1).transpose(1, 0, 2)
    return xp.concatenate([dq.reshape(T, -1), dk.reshape(T, -1), dv.reshape(T, -1)], axis=1).astype(q.dtype)


# ---------------------------------------------------------------------------------------------------------
# Paged KV cache (inference engine)


def store_kv(k, v, k_cache, v_cache, slot_mapping):
    """Write k, v (T, K, D) into the caches (num_blocks, block_size, K, D) at flat slots; slot -1 skips."""
    xp = xp_of(k)
    slots = xp.asarray(slot_mapping)
    keep = slots >= 0
    kc = k_cache.reshape(-1, *k_cache.shape[2:])
    vc = v_cache.reshape(-1, *v_cache.shape[2:])
    kc[slots[keep]] = k[keep].astype(k_cache.dtype, copy=False)
    vc[slots[keep]] = v[keep].astype(v_cache.dtype, copy=False)


def qk_norm_rope_store(
    qkv, positions, cos, sin, num_heads, num_kv_heads, q_norm, k_norm, eps, k_cache, v_cache, slot_mapping
):
    """`qk_norm_rope`, then `store_kv` of its rotated k and its v (the engine's decode path: one kernel on
    the GPU). Returns what `qk_norm_rope` returns."""
    out, q_rstd, k_rstd = qk_norm_rope(qkv, positions, cos, sin, num_heads, num_kv_heads, q_norm, k_norm, eps)
    T, D = out.shape[0], out.shape[1] // (num_heads + 2 * num_kv_heads)
    kv = out[:, num_heads * D :].reshape(T, 2, num_kv_heads, D)
    store_kv(kv[:, 0], kv[:, 1], k_cache, v_cache, slot_mapping)
    return out, q_rstd, k_rstd


def advance_decode(tokens, input_ids, positions, context_lens, slot_mapping, counters, block_tables, block_size):
    """Turn one decode step's inputs (one token per sequence, in place) into the next step's, on the device:
    each live row (slot >= 0) feeds its sampled token back, moves to the next position and cache slot
    (block_tables (S, max_blocks) must already hold that block) and draws its next sample with counter + 1.
    Padding rows (slot -1) stay as they are. Elementwise, no host round trip: a CUDA graph can hold
    several decode steps."""
    xp = xp_of(positions)
    live = slot_mapping >= 0
    next_positions = positions + 1
    column = xp.where(live, next_positions // block_size, 0)
    block = block_tables[xp.arange(positions.shape[0]), column]
    input_ids[...] = xp.where(live, tokens.astype(input_ids.dtype), input_ids)
    slot_mapping[...] = xp.where(live, block * block_size + next_positions % block_size, -1)
    positions[...] = xp.where(live, next_positions, positions)
    context_lens[...] = xp.where(live, context_lens + 1, context_lens)
    counters[...] = xp.where(live, counters + 1, counters)


def paged_attention(q, k_cache, v_cache, block_tables, context_lens, cu_seqlens_q, scale):
    """Causal attention of new query tokens against each sequence's cached keys and values.

    q (T, H, D): the new tokens of S sequences, packed by cu_seqlens_q (S+1,). Their keys and values are
    already in the caches (num_blocks, block_size, K, D). block_tables (S, max_blocks) int32 maps each
    sequence's logical blocks to physical ones; context_lens (S,) counts its cached tokens including the
    new ones. Query i of a sequence with n new tokens sits at position context_len - n + i and sees keys
    0..that position. Returns o (T, H, D) in q's dtype.
    """
    xp = xp_of(q)
    T, H, D = q.shape
    block_size, K = k_cache.shape[1], k_cache.shape[2]
    group = H // K
    o = xp.zeros((T, H, D), np.float32)
    tables = block_tables.get() if hasattr(block_tables, "get") else np.asarray(block_tables)
    lens = context_lens.get() if hasattr(context_lens, "get") else np.asarray(context_lens)
    for s, (a, b) in enumerate(_segments(cu_seqlens_q)):
        ctx = int(lens[s])
        nblocks = -(-ctx // block_size)
        blocks = xp.asarray(tables[s, :nblocks])
        ks = k_cache[blocks].reshape(-1, K, D)[:ctx]
        vs = v_cache[blocks].reshape(-1, K, D)[:ctx]
        qs = _f32(q[a:b]).transpose(1, 0, 2)  # (H, n, D)
        scores = (qs @ _expand_kv(_f32(ks), group).transpose(0, 2, 1)) * np.float32(scale)  # (H, n, ctx)
        qpos = ctx - (b - a) + xp.arange(b - a)
        scores = xp.where(xp.arange(ctx)[None, :] <= qpos[:, None], scores, -np.inf)
        p = xp.exp(scores - scores.max(axis=-1, keepdims=True))
        p /= p.sum(axis=-1, keepdims=True)
        o[a:b] = (p @ _expand_kv(_f32(vs), group)).transpose(1, 0, 2)
    return o.astype(q.dtype, copy=False)


def set_batch_invariant(on: bool) -> None:
    """The CUDA backend's products take split-K-free algorithms from then on (kernels/cublaslt.py), so a row's
    bits do not depend on the batch; the reference has no algorithm choice to switch."""


def paged_attention_invariant(q, k_cache, v_cache, block_tables, context_lens, cu_seqlens_q, scale):
    """paged_attention's math. The CUDA twin adds a guarantee the reference needs no code for: a token's
    output is bitwise the training `attention`'s for it, whatever else is in the batch."""
    return paged_attention(q, k_cache, v_cache, block_tables, context_lens, cu_seqlens_q, scale)


# ---------------------------------------------------------------------------------------------------------
# SwiGLU MLP activation


def swiglu(gate_up):
    """gate_up (T, 2I) = [gate | up] -> silu(gate) * up (T, I)."""
    xp = xp_of(gate_up)
    g = _f32(gate_up)
    n = g.shape[-1] // 2
    gate, up = g[:, :n], g[:, n:]
    return (gate / (1.0 + xp.exp(-gate)) * up).astype(gate_up.dtype, copy=False)


def swiglu_backward(da, gate_up):
    """Gradient of `swiglu`: returns d gate_up (T, 2I)."""
    xp = xp_of(da)
    g = _f32(gate_up)
    n = g.shape[-1] // 2
    gate, up = g[:, :n], g[:, n:]
    daf = _f32(da)
    sig = 1.0 / (1.0 + xp.exp(-gate))
    silu = gate * sig
    dgate = daf * up * sig * (1.0 + gate * (1.0 - sig))
    return xp.concatenate([dgate, daf * silu], axis=1).astype(gate_up.dtype, copy=False)


# ---------------------------------------------------------------------------------------------------------
# LM head: logits are only ever built for a chunk of tokens at a time


def lm_head_logits(h, w, inv_temperature=1.0):
    """Logits of a few rows (the engine's last tokens): h (B, C), w (V, C) -> (B, V) fp32."""
    return (_f32(h) @ _f32(w).T) * np.float32(inv_temperature)


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


def lm_head_logprobs(h, w, targets, inv_temperature=1.0, chunk_size=DEFAULT_LM_HEAD_CHUNK):
    """Log-probability of each target token under softmax(h @ w.T * inv_temperature).

    h (T, C), w (V, C), targets (T,) int32. Returns logprobs (T,), lse (T,) and entropy (T,), all fp32.
    The (T, V) logits are never held whole: at most chunk_size x V at a time.
    """
    xp = xp_of(h)
    logprobs, lse, entropy = (xp.empty(h.shape[0], np.float32) for _ in range(3))
    wf = _f32(w)
    for a, b in _chunk_bounds(h.shape[0], chunk_size):
        logits = _chunk_logits(_f32(h[a:b]), wf, inv_temperature)
        logprobs[a:b], lse[a:b], entropy[a:b] = _chunk_stats(xp, logits, targets[a:b])
    return logprobs, lse, entropy


def lm_head_backward(dlogprobs, h, w, targets, lse, dw, inv_temperature=1.0, chunk_size=DEFAULT_LM_HEAD_CHUNK):
    """Gradient of `lm_head_logprobs`'s log-probs: dw (V, C) += ... (None: a frozen head), returns dh (T, C)
    in h's dtype."""
    xp = xp_of(h)
    dh = xp.empty(h.shape, np.float32)
    wf = _f32(w)
    for a, b in _chunk_bounds(h.shape[0], chunk_size):
        hf = _f32(h[a:b])
        logits = _chunk_logits(hf, wf, inv_temperature)  # again: the forward did not keep them
        g = _f32(dlogprobs[a:b])
        dh[a:b] = _chunk_backward(xp, logits, hf, wf, targets[a:b], lse[a:b], g, inv_temperature, dw)
    return dh.astype(h.dtype, copy=False)


def lm_head_forward_backward(h, w, targets, token_grad, dw, inv_temperature=1.0,
                             chunk_size=DEFAULT_LM_HEAD_CHUNK):
    """`lm_head_logprobs` and `lm_head_backward` in one walk over the chunks, for a loss whose gradient at a
    token depends on that token's log-prob alone: each chunk's logits serve its forward and its backward.

    token_grad(logprobs_chunk, start, stop) -> dlogprobs_chunk (stop - start,), taken as fp32: d loss / d
    logprobs[start:stop] from those log-probs, called once per chunk in order. dw (V, C) += ...
    Returns logprobs, lse, entropy (T,) fp32 and dh (T, C) in h's dtype, as the two unfused ops would.
    """
    xp = xp_of(h)
    logprobs, lse, entropy = (xp.empty(h.shape[0], np.float32) for _ in range(3))
    dh = xp.empty(h.shape, np.float32)
    wf = _f32(w)
    for a, b in _chunk_bounds(h.shape[0], chunk_size):
        hf = _f32(h[a:b])
        logits = _chunk_logits(hf, wf, inv_temperature)
        logprobs[a:b], lse[a:b], entropy[a:b] = _chunk_stats(xp, logits, targets[a:b])
        g = _f32(token_grad(logprobs[a:b], a, b))
        dh[a:b] = _chunk_backward(xp, logits, hf, wf, targets[a:b], lse[a:b], g, inv_temperature, dw)
    return logprobs, lse, entropy, dh.astype(h.dtype, copy=False)
