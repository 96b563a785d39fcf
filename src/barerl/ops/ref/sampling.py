"""Reference sampler: the contract the CUDA sampler kernel reproduces.

    sample(logits (B, V) fp32, temperature (B,) fp32, top_k (B,) int32, top_p (B,) fp32, min_p (B,) fp32,
           seeds (B,) uint64, counters (B,) int64) -> tokens (B,) int32, logprobs (B,) fp32

Row b, all math in fp32:
- temperature 0: greedy argmax of the logits (lowest index on ties); logprob = log_softmax(logits)[token].
- otherwise z = logits / T and a token is kept when it passes all three filters, applied in this order:
  top-k (0 or -1 = off): z >= the k-th largest z (ties with the k-th all kept);
  top-p (1 = off): p = softmax of z over the top-k set; keep the most probable tokens down to the first
    whose running mass reaches top_p (vLLM's "smallest set of most probable tokens reaching p"), with the
    ties at that boundary all kept. Masses in exact fixed point, as the kernel's threshold search counts
    them: w_v = floor(double(exp(z_v - z_max)) * 2^42) over the top-k set, W = sum of w_v, target =
    max(ceil(double(top_p) * double(W)), 1); keep z_v >= z_t for the first t (in decreasing z) at which the
    running sum of w reaches the target. (An fp32 sort and cumsum, as before, drifts by ~1e-4 on flat rows
    of 150k tokens and moved the boundary away from the kernel's.)
  min-p (0 = off): p_v >= min_p * p_max, i.e. exp(z_v - z_max) >= min_p (independent of normalisation).
- The token is drawn by inverse CDF over exact fixed-point masses, with one random draw per row:
    m = max of z over the kept set; p_v = exp(z_v - m) on the kept set, 0 elsewhere;
    mass_v = rint(p_v * 2^42) as uint64 (p_v <= 1, and p_v * 2^42 is exact in fp32), total = sum of mass_v;
    r = splitmix64(seed, counter) (64 bits); target = floor(r * total / 2^64), exact in integer arithmetic;
    token = the first v (in index order) with mass_0 + ... + mass_v > target;
  and logprob = z_token - (m + log(sum of p_v)), the log-prob under the truncated distribution sampled from.
Why: Gumbel-max needs a 64-bit hash and two logs per vocabulary element; this needs one hash per row and
per element one exp and an integer add, so a kernel is close to the cost of reading the logits. Why fixed
point: integer sums are exact in any order, so a kernel that sums in chunks and trees picks the very same
token as this reference (the fp32 sum of p behind the log-prob may differ in its last bits).
Boundaries: r < 2^64 gives target < total, so a token always exists; a token whose mass rounds to 0
(p_v < 2^-43) has the same prefix as its predecessor, so it is never the first to exceed the target;
token v is drawn with probability mass_v / total up to 2^-64. V < 2^22 keeps total below 2^64; the kept set
always holds the row's maximum (top-k >= 1, top_p > 0, min_p <= 1), so total >= 2^42, except in a row
without a finite maximum (all -inf), which gives total 0, token 0 and a NaN log-prob.
The draw is a counter-based hash (splitmix64 finaliser): no generator state, so the engine sets
counter = index of the generated token within its sequence and a sequence samples the same tokens whatever
batch it lands in, and after preemption and recompute.
"""

from __future__ import annotations

import math

import numpy as np

from barerl.ops.common import DEFAULT_LM_HEAD_CHUNK, xp_of
from barerl.ops.ref.counter_rng import splitmix64

__all__ = [
    "lm_head_backward_filtered",
    "lm_head_logprobs_filtered",
    "logprobs_under_sampling",
    "sample",
]

MASS_SCALE = np.float32(2.0**42)  # fixed-point unit of a token's mass (MASS_SCALE in sampling.cu)


def _host(a):
    return a.get() if hasattr(a, "get") else np.asarray(a)


def _top_p_keep(z, kept, top_p: float):
    """Bool (V,): the top-p set of a row z within its top-k set `kept` (module docstring: exact masses)."""
    xp = xp_of(z)
    zk = xp.where(kept, z, -np.inf)
    weight = xp.floor(xp.exp(zk - zk.max()).astype(np.float64) * float(MASS_SCALE)).astype(xp.uint64)
    order = xp.argsort(-zk)
    running = xp.cumsum(weight[order])
    target = max(math.ceil(top_p * float(int(running[-1]))), 1)
    first = min(int((running < xp.asarray(target, dtype=xp.uint64)).sum()), z.shape[0] - 1)  # 1st >= target
    return z >= zk[order[first]]


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
        keep[b] &= _top_p_keep(z[b], keep[b], float(top_p[b]))
    if (min_p > 0).any():
        ratio = xp.exp(z - z.max(axis=-1, keepdims=True))  # p_v / p_max
        keep &= ratio >= xp.asarray(min_p, dtype=np.float32)[:, None]
    return keep


def _kept_exp(z, keep):
    """m (n, 1): the max of z over the kept set; p (n, V): exp(z - m) on the kept set, 0 elsewhere."""
    xp = xp_of(z)
    zk = xp.where(keep, z, -np.inf)
    m = zk.max(axis=-1, keepdims=True)
    return m, xp.exp(zk - m)


def _logsumexp_of(m, p):
    return (m + xp_of(p).log(p.sum(axis=-1, keepdims=True)))[:, 0]


def _masked_logsumexp(z, keep):
    return _logsumexp_of(*_kept_exp(z, keep))


def _prefix_masses(p):
    """Inclusive prefix sums (n, V) uint64 of the fixed-point masses rint(p * 2^42), exact in any order.

    A NaN p (z - m = -inf - -inf in a row without a finite maximum) weighs 0.
    """
    xp = xp_of(p)
    mass = xp.rint(xp.where(p > 0, p, np.float32(0)) * MASS_SCALE).astype(xp.uint64)
    return xp.cumsum(mass, axis=-1)


def _mulhi64(a, b):
    """floor(a * b / 2^64) for uint64 arrays, exact: the 128-bit product from 32-bit halves (__umul64hi)."""
    u64 = xp_of(a).uint64
    low, half = u64(0xFFFFFFFF), u64(32)
    a_lo, a_hi, b_lo, b_hi = a & low, a >> half, b & low, b >> half
    cross_hl, cross_lh = a_hi * b_lo, a_lo * b_hi
    carry = ((a_lo * b_lo) >> half) + (cross_hl & low) + (cross_lh & low)  # < 3 * 2^32: no wrap
    return a_hi * b_hi + (cross_hl >> half) + (cross_lh >> half) + (carry >> half)


def _draw_targets(seeds, counters, totals):
    """target (n,) uint64 = floor(splitmix64(seed, counter) * total / 2^64): below total (when total > 0),
    and each value in [0, total) has 2^64 / total draws to within one, so a range of mass w is hit with
    probability w / total up to 2^-64."""
    xp = xp_of(totals)
    u64 = xp.uint64
    r = splitmix64(xp.asarray(seeds).astype(u64), xp.asarray(counters).astype(u64))
    return _mulhi64(r, totals.astype(u64, copy=False))


def _inverse_cdf(prefix, targets):
    """The first v of each row with prefix[v] > target (prefix (n, V) non-decreasing, targets (n,)); 0 when
    none does (total 0)."""
    return (prefix > targets[:, None]).argmax(axis=-1)


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
    B = logits.shape[0]
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
        m, p = _kept_exp(z, keep)
        prefix = _prefix_masses(p)
        targets = _draw_targets(xp.asarray(seeds)[r], xp.asarray(counters)[r], prefix[:, -1])
        chosen = _inverse_cdf(prefix, targets)
        tokens[r] = chosen
        logprobs[r] = z[xp.arange(rand.size), chosen] - _logsumexp_of(m, p)
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
    """Gradient of `lm_head_logprobs_filtered`'s log-probs: dw += ... (None: a frozen head), returns dh in h's
    dtype."""
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
        if dw is not None:
            dw += (dz.T @ h[a:b].astype(np.float32)).astype(dw.dtype, copy=False)
    return dh.astype(h.dtype, copy=False)
