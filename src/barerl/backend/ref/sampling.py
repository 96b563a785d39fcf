"""Reference sampler: the contract the CUDA sampler kernel reproduces.

    sample(logits (B, V) fp32, temperature (B,) fp32, top_k (B,) int32, top_p (B,) fp32, min_p (B,) fp32,
           seeds (B,) uint64, counters (B,) int64) -> tokens (B,) int32, logprobs (B,) fp32

Row b, all math in fp32:
- temperature 0: greedy argmax of the logits (lowest index on ties); logprob = log_softmax(logits)[token].
- otherwise z = logits / T and a token is kept when it passes all three filters, applied in this order:
  top-k (0 or -1 = off): z >= the k-th largest z (ties with the k-th all kept);
  top-p (1 = off): p = softmax of z over the top-k set; keep v when the probability of the tokens strictly
    more probable than v is < top_p. This is vLLM's "smallest set of most probable tokens reaching p", with
    ties at the boundary all kept so that a threshold search in a kernel gives the same set as a sort;
  min-p (0 = off): p_v >= min_p * p_max, i.e. exp(z_v - z_max) >= min_p (independent of normalisation).
  The token is argmax over the kept set of z_v + g_v (Gumbel-max), g_v = -log(-log(u_v)) with u_v from
  `uniform_noise(seed, counter, v)`, and logprob = z_token - logsumexp(z over the kept set).
The noise is a counter-based hash (splitmix64 finaliser): no generator state, so the engine sets
counter = index of the generated token within its sequence and a sequence samples the same tokens whatever
batch it lands in, and after preemption and recompute.
"""

from __future__ import annotations

import numpy as np

from barerl.backend.ref.counter_rng import splitmix64
from barerl.backend.ref.nn import DEFAULT_LM_HEAD_CHUNK, xp_of

__all__ = [
    "lm_head_backward_filtered",
    "lm_head_logprobs_filtered",
    "logprobs_under_sampling",
    "sample",
    "uniform_noise",
]

def _host(a):
    return a.get() if hasattr(a, "get") else np.asarray(a)


def uniform_noise(seeds, counters, vocab_size: int):
    """u (B, V) fp32 in (0, 1): u[b, v] = uniform(seeds[b], counters[b], v), uint64 wrap-around arithmetic.

    x = seed + 0x9E3779B97F4A7C15 * (counter * 2**32 + v + 1); z = (x ^ (x >> 30)) * 0xBF58476D1CE4E5B9;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EB; z ^= z >> 31; u = ((z >> 41) + 0.5) * 2**-23 (23 bits, so
    the + 0.5 is exact in fp32 and u < 1: with 24 bits the top value rounded to 1.0, an infinite Gumbel draw).
    """
    xp = xp_of(seeds)
    u64 = xp.uint64
    v = xp.arange(vocab_size, dtype=u64)
    key = (xp.asarray(counters).astype(u64)[:, None] << u64(32)) + v[None, :] + u64(1)
    z = splitmix64(xp.asarray(seeds).astype(u64)[:, None], key)
    return ((z >> u64(41)).astype(np.float32) + np.float32(0.5)) * np.float32(2.0**-23)


def _keep_mask(z, top_k, top_p, min_p):
    """Bool (B, V): which tokens survive top-k, then top-p, then min-p (see the module docstring)."""
    xp = xp_of(z)
    B, V = z.shape
    keep = xp.ones((B, V), dtype=bool)
    top_k, top_p, min_p = _host(top_k), _host(top_p), _host(min_p)
    for b in np.flatnonzero((top_k > 0) & (top_k < V)):
        kth = xp.partition(z[b], V - int(top_k[b]))[V - int(top_k[b])]  # CuPy needs a Python int
        keep[b] &= z[b] >= kth
    for b in np.flatnonzero(top_p < 1):
        zk = xp.where(keep[b], z[b], -np.inf)
        p = xp.exp(zk - zk.max())
        p /= p.sum()
        ascending = xp.sort(p)
        cumulative = xp.cumsum(ascending)
        # mass of the tokens strictly more probable than v = total - mass of the tokens with p <= p_v
        at_most = cumulative[xp.searchsorted(ascending, p, side="right") - 1]
        keep[b] &= (cumulative[-1] - at_most) < np.float32(top_p[b])
    if (min_p > 0).any():
        ratio = xp.exp(z - z.max(axis=-1, keepdims=True))  # p_v / p_max
        keep &= ratio >= xp.asarray(min_p, dtype=np.float32)[:, None]
    return keep


def _masked_logsumexp(z, keep):
    xp = xp_of(z)
    zk = xp.where(keep, z, -np.inf)
    m = zk.max(axis=-1, keepdims=True)
    return (m + xp.log(xp.exp(zk - m).sum(axis=-1, keepdims=True)))[:, 0]


def _log_softmax_at(logits, tokens):
    xp = xp_of(logits)
    full = xp.ones(logits.shape, dtype=bool)
    return logits[xp.arange(logits.shape[0]), tokens] - _masked_logsumexp(logits, full)


def _split_rows(temperature):
    t = _host(temperature)
    return np.flatnonzero(t == 0), np.flatnonzero(t != 0)


def sample(logits, temperature, top_k, top_p, min_p, seeds, counters):
    """One token per row: tokens (B,) int32 and their log-probs (B,) fp32 (see the module docstring)."""
    xp = xp_of(logits)
    logits = logits.astype(np.float32, copy=False)
    B, V = logits.shape
    tokens = xp.empty(B, np.int32)
    logprobs = xp.empty(B, np.float32)
    greedy, rand = _split_rows(temperature)
    if greedy.size:
        g = xp.asarray(greedy)
        tokens[g] = logits[g].argmax(axis=-1)
        logprobs[g] = _log_softmax_at(logits[g], tokens[g])
    if rand.size:
        r = xp.asarray(rand)
        z = logits[r] / xp.asarray(temperature, dtype=np.float32)[r][:, None]
        keep = _keep_mask(z, _host(top_k)[rand], _host(top_p)[rand], _host(min_p)[rand])
        u = uniform_noise(xp.asarray(seeds)[r], xp.asarray(counters)[r], V)
        gumbel = -xp.log(-xp.log(u))
        chosen = xp.where(keep, z + gumbel, -np.inf).argmax(axis=-1)
        tokens[r] = chosen
        logprobs[r] = z[xp.arange(rand.size), chosen] - _masked_logsumexp(z, keep)
    return tokens, logprobs


def logprobs_under_sampling(logits, tokens, temperature, top_k, top_p, min_p):
    """Log-prob (B,) fp32 of given tokens under the distribution `sample` draws from with these settings.

    Greedy rows (temperature 0) give log_softmax(logits)[token]; a token outside the kept set gives -inf.
    """
    xp = xp_of(logits)
    logits = logits.astype(np.float32, copy=False)
    tokens = xp.asarray(tokens)
    out = xp.empty(logits.shape[0], np.float32)
    greedy, rand = _split_rows(temperature)
    if greedy.size:
        g = xp.asarray(greedy)
        out[g] = _log_softmax_at(logits[g], tokens[g])
    if rand.size:
        r = xp.asarray(rand)
        z = logits[r] / xp.asarray(temperature, dtype=np.float32)[r][:, None]
        keep = _keep_mask(z, _host(top_k)[rand], _host(top_p)[rand], _host(min_p)[rand])
        rows, chosen = xp.arange(rand.size), tokens[r]
        lp = z[rows, chosen] - _masked_logsumexp(z, keep)
        out[r] = xp.where(keep[rows, chosen], lp, -np.inf)
    return out


# ---------------------------------------------------------------------------------------------------------
# Training under the sampling distribution: the LM head's log-probs and their gradient when the engine
# samples with top-k / top-p / min-p, so the policy ratio compares like with like. The kept set is
# recomputed from the logits (same filter as `sample`) and treated as fixed by the gradient; a target the
# filter dropped (possible only at exact ties) is kept so its log-prob stays finite.


def _filtered_chunk(h, w, targets, inv_temperature, top_k, top_p, min_p):
    xp = xp_of(h)
    n = h.shape[0]
    z = (h.astype(np.float32) @ w.astype(np.float32).T) * np.float32(inv_temperature)
    full = lambda value, dtype: xp.full(n, value, dtype)
    keep = _keep_mask(z, full(top_k, np.int32), full(top_p, np.float32), full(min_p, np.float32))
    keep[xp.arange(n), targets] = True
    return z, keep


def lm_head_logprobs_filtered(h, w, targets, inv_temperature, top_k, top_p, min_p,
                              chunk_size=DEFAULT_LM_HEAD_CHUNK):
    """`lm_head_logprobs` under the filtered distribution: logprobs, lse over the kept set, entropy (T,)."""
    xp = xp_of(h)
    T = h.shape[0]
    logprobs, lse, entropy = (xp.empty(T, np.float32) for _ in range(3))
    for a in range(0, T, chunk_size):
        b = min(a + chunk_size, T)
        z, keep = _filtered_chunk(h[a:b], w, targets[a:b], inv_temperature, top_k, top_p, min_p)
        row_lse = _masked_logsumexp(z, keep)
        p = xp.where(keep, xp.exp(z - row_lse[:, None]), 0.0)
        lse[a:b] = row_lse
        logprobs[a:b] = z[xp.arange(b - a), targets[a:b]] - row_lse
        entropy[a:b] = row_lse - (p * xp.where(keep, z, 0.0)).sum(axis=-1)
    return logprobs, lse, entropy


def lm_head_backward_filtered(dlogprobs, h, w, targets, lse, dw, inv_temperature, top_k, top_p, min_p,
                              chunk_size=DEFAULT_LM_HEAD_CHUNK):
    """Gradient of `lm_head_logprobs_filtered`'s log-probs: dw += ..., returns dh in h's dtype."""
    xp = xp_of(h)
    dh = xp.empty(h.shape, np.float32)
    wf = w.astype(np.float32)
    for a in range(0, h.shape[0], chunk_size):
        b = min(a + chunk_size, h.shape[0])
        z, keep = _filtered_chunk(h[a:b], w, targets[a:b], inv_temperature, top_k, top_p, min_p)
        g = dlogprobs[a:b].astype(np.float32)
        dz = -xp.where(keep, xp.exp(z - lse[a:b, None]), 0.0) * g[:, None]
        dz[xp.arange(b - a), targets[a:b]] += g
        dz *= np.float32(inv_temperature)
        dh[a:b] = dz @ wf
        dw += (dz.T @ h[a:b].astype(np.float32)).astype(dw.dtype, copy=False)
    return dh.astype(h.dtype, copy=False)
