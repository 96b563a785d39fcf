"""The reference sampler against hand-derived targets: the hash, greedy, filters, frequencies, log-probs."""

import numpy as np
import pytest

from barerl.backend import ref

M64 = (1 << 64) - 1


def python_uniform(seed, counter, v):
    """The contract's hash in plain Python integers."""
    x = (seed + 0x9E3779B97F4A7C15 * (counter * 2**32 + v + 1)) & M64
    z = ((x ^ (x >> 30)) * 0xBF58476D1CE4E5B9) & M64
    z = ((z ^ (z >> 27)) * 0x94D049BB133111EB) & M64
    z ^= z >> 31
    return ((z >> 41) + 0.5) * 2.0**-23


def rows(B, **kw):
    """Per-row sampler settings, broadcast to B rows (defaults: everything off)."""
    d = {"temperature": 1.0, "top_k": 0, "top_p": 1.0, "min_p": 0.0}
    d.update(kw)
    return (np.full(B, d["temperature"], np.float32), np.full(B, d["top_k"], np.int32),
            np.full(B, d["top_p"], np.float32), np.full(B, d["min_p"], np.float32))


def target_distribution(logits, temperature=1.0, top_k=0, top_p=1.0, min_p=0.0):
    """The kept set and its renormalised probabilities, derived in float64 by sorting."""
    z = np.asarray(logits, np.float64) / temperature
    keep = np.ones(len(z), bool)
    if top_k > 0:
        keep &= z >= np.sort(z)[::-1][top_k - 1]
    p = np.where(keep, np.exp(z - z.max()), 0.0)
    p /= p.sum()
    if top_p < 1:
        keep &= np.array([p[p > pv].sum() < top_p for pv in p])
    if min_p > 0:
        keep &= p >= min_p * p.max()
    q = np.where(keep, np.exp(z - z.max()), 0.0)
    return q / q.sum()


def test_uniform_noise_matches_the_contract_hash():
    seeds = np.array([0, 1, 2**63 + 12345, M64], np.uint64)
    counters = np.array([0, 7, 3, 2**31], np.int64)
    u = ref.uniform_noise(seeds, counters, 50)
    assert u.dtype == np.float32 and u.shape == (4, 50)
    for b in range(4):
        for v in (0, 1, 49):
            assert u[b, v] == np.float32(python_uniform(int(seeds[b]), int(counters[b]), v))
    big = ref.uniform_noise(np.arange(64, dtype=np.uint64), np.zeros(64, np.int64), 1000)
    assert 0 < big.min() and big.max() < 1 and abs(big.mean() - 0.5) < 0.01


def test_greedy_is_argmax_lowest_index_on_ties_with_full_log_softmax():
    logits = np.array([[1.0, 3.0, 3.0, -1.0], [0.0, 0.0, 0.0, 0.0]], np.float32)
    tokens, logprobs = ref.sample(logits, *rows(2, temperature=0.0, top_k=1, top_p=0.5),
                                  np.zeros(2, np.uint64), np.zeros(2, np.int64))
    np.testing.assert_array_equal(tokens, [1, 0])
    expected = logits[[0, 1], [1, 0]] - np.log(np.exp(logits.astype(np.float64)).sum(axis=1))
    np.testing.assert_allclose(logprobs, expected, rtol=1e-6)


FILTERS = [
    {"temperature": 1.0},
    {"temperature": 0.5},
    {"temperature": 1.3, "top_k": 3},
    {"temperature": 1.0, "top_p": 0.7},
    {"temperature": 0.8, "min_p": 0.15},
    {"temperature": 1.5, "top_k": 5, "top_p": 0.9, "min_p": 0.05},
]


@pytest.mark.parametrize("settings", FILTERS, ids=lambda s: ",".join(f"{k}={v}" for k, v in s.items()))
def test_frequencies_and_logprobs_match_the_target_distribution(settings):
    """Chi-square of 10,000 draws (one seed, counters 0..N-1) against the filtered softmax."""
    from scipy.stats import chisquare

    logits = np.array([2.0, 1.5, 1.0, 0.7, 0.3, 0.0, -0.5, -1.0], np.float32)
    target = target_distribution(logits, **settings)
    N = 10_000
    tokens, logprobs = ref.sample(np.tile(logits, (N, 1)), *rows(N, **settings),
                                  np.full(N, 1234, np.uint64), np.arange(N, dtype=np.int64))
    counts = np.bincount(tokens, minlength=len(logits))
    assert counts[target == 0].sum() == 0, f"filtered tokens sampled: {counts} vs {target}"
    kept = target > 0
    p_value = chisquare(counts[kept], target[kept] * N).pvalue
    assert p_value > 1e-3, f"counts {counts}, expected {np.round(target * N)}"
    np.testing.assert_allclose(logprobs, np.log(target[tokens]), rtol=1e-5, atol=1e-5)
    again = ref.logprobs_under_sampling(np.tile(logits, (N, 1)), tokens, *rows(N, **settings))
    np.testing.assert_array_equal(again, logprobs)


def test_top_p_keeps_ties_at_the_boundary():
    # p = [0.4, 0.2, 0.2, 0.2]: top_p 0.5 needs the first 0.2; both ties with it stay
    logits = np.log(np.array([[0.4, 0.2, 0.2, 0.2]], np.float32))
    lp = ref.logprobs_under_sampling(logits, np.array([3]), *rows(1, top_p=0.5))
    np.testing.assert_allclose(lp, np.log(0.2), rtol=1e-5)
    lp = ref.logprobs_under_sampling(logits, np.array([3]), *rows(1, top_p=0.4))
    assert lp[0] == -np.inf  # 0.4 alone reaches p = 0.4


def test_top_k_keeps_ties_with_the_kth():
    logits = np.array([[3.0, 2.0, 2.0, 1.0]], np.float32)
    lp = ref.logprobs_under_sampling(logits, np.array([2]), *rows(1, top_k=2))
    z = np.array([3.0, 2.0, 2.0])
    np.testing.assert_allclose(lp, 2.0 - np.log(np.exp(z).sum()), rtol=1e-6)


def test_seeded_sampling_is_reproducible_and_depends_on_seed_and_counter():
    rng = np.random.default_rng(0)
    logits = rng.normal(size=(64, 100)).astype(np.float32)
    args = (np.full(64, 7, np.uint64), np.arange(64, dtype=np.int64))
    a = ref.sample(logits, *rows(64), *args)
    b = ref.sample(logits.copy(), *rows(64), *args)
    np.testing.assert_array_equal(a[0], b[0])
    np.testing.assert_array_equal(a[1], b[1])
    # a row's result depends only on its own logits, seed and counter: not on its neighbours
    c = ref.sample(logits[10:11], *rows(1), args[0][10:11], args[1][10:11])
    assert c[0][0] == a[0][10]
    other_seed = ref.sample(logits, *rows(64), np.full(64, 8, np.uint64), args[1])
    assert (other_seed[0] != a[0]).mean() > 0.5


def test_uniform_noise_never_reaches_one():
    from barerl.backend.ref.sampling import uniform_noise

    u = uniform_noise(np.arange(64, dtype=np.uint64), np.arange(64, dtype=np.int64), 151936)
    assert u.max() < 1.0 and u.min() > 0.0
