"""The reference sampler against hand-derived targets: the draw, the inverse CDF over fixed-point masses,
greedy, filters, frequencies, log-probs, boundary cases."""

import numpy as np
import pytest

from barerl.ops import ref

M64 = (1 << 64) - 1
SCALE = 2**42


def python_splitmix64(seed, key):
    """The contract's hash in plain Python integers."""
    x = (seed + 0x9E3779B97F4A7C15 * key) & M64
    z = ((x ^ (x >> 30)) * 0xBF58476D1CE4E5B9) & M64
    z = ((z ^ (z >> 27)) * 0x94D049BB133111EB) & M64
    return z ^ (z >> 31)


def python_sample(z, seed, counter):
    """One row by the contract, in Python integers over NumPy's fp32 p: (token, masses)."""
    p = np.exp(z - z.max())
    masses = [int(np.rint(pv * np.float32(SCALE))) for pv in p]
    target = python_splitmix64(seed, counter) * sum(masses) >> 64
    prefix = np.cumsum(masses, dtype=object)
    return next(v for v in range(len(z)) if prefix[v] > target), masses


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


def test_target_is_the_contract_hash_scaled_exactly():
    """target = floor(splitmix64(seed, counter) * total / 2^64), checked against Python integers."""
    from barerl.ops.ref.sampling import _draw_targets, _mulhi64

    seeds = np.array([0, 1, 2**63 + 12345, M64, 7], np.uint64)
    counters = np.array([0, 7, 3, 2**31, -1], np.int64)
    totals = np.array([1, 2**42, 3 * 2**42 + 5, 151936 * 2**42, M64], np.uint64)
    got = _draw_targets(seeds, counters, totals)
    assert got.dtype == np.uint64
    for b in range(5):
        r = python_splitmix64(int(seeds[b]), int(counters[b]) & M64)
        assert int(got[b]) == r * int(totals[b]) >> 64 < int(totals[b])
    # the largest draw still lands below the total: a token always exists
    top = _mulhi64(np.full(5, M64, np.uint64), totals)
    np.testing.assert_array_equal(top, totals - np.uint64(1))
    rng = np.random.default_rng(0)
    a, b = (rng.integers(0, 2**63, 1000, dtype=np.int64).astype(np.uint64) * np.uint64(2) + np.uint64(1)
            for _ in range(2))
    assert all(int(h) == int(x) * int(y) >> 64 for h, x, y in zip(_mulhi64(a, b), a, b))


def test_inverse_cdf_picks_each_token_with_its_mass():
    """Over every target in [0, total) token v is picked mass_v times: zero-mass tokens never."""
    from barerl.ops.ref.sampling import _inverse_cdf

    masses = np.array([0, 3, 0, 5, 1, 0, 2, 0], np.uint64)
    prefix = np.cumsum(masses)
    targets = np.arange(int(prefix[-1]), dtype=np.uint64)
    tokens = _inverse_cdf(np.tile(prefix, (targets.size, 1)), targets)
    np.testing.assert_array_equal(np.bincount(tokens, minlength=masses.size), masses)
    np.testing.assert_array_equal(tokens[[0, 2, 3, 7, 8, 9, 10]], [1, 1, 3, 3, 4, 6, 6])
    assert _inverse_cdf(np.zeros((1, 4), np.uint64), np.zeros(1, np.uint64))[0] == 0  # total 0: token 0


@pytest.mark.parametrize("temperature,scale", [(1.0, 1.0), (0.7, 3.0), (1.5, 8.0)])
def test_sample_is_the_inverse_cdf_of_the_fixed_point_masses(temperature, scale):
    rng = np.random.default_rng(1)
    B, V = 16, 300
    logits = (rng.normal(size=(B, V)) * scale).astype(np.float32)
    seeds = rng.integers(0, 2**63, B).astype(np.uint64)
    counters = rng.integers(0, 10_000, B).astype(np.int64)
    tokens, logprobs = ref.sample(logits, *rows(B, temperature=temperature), seeds, counters)
    for b in range(B):
        z = logits[b] / np.float32(temperature)
        token, masses = python_sample(z, int(seeds[b]), int(counters[b]))
        assert tokens[b] == token and masses[token] > 0
        expected = z[token] - (z.max() + np.log(np.exp(z.astype(np.float64) - z.max()).sum()))
        np.testing.assert_allclose(logprobs[b], expected, rtol=1e-5, atol=1e-5)


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
    other_counter = ref.sample(logits, *rows(64), args[0], args[1] + 1000)
    assert (other_counter[0] != a[0]).mean() > 0.5


def draws(logits, n=2000, seed=99, **settings):
    """ref.sample of one row n times (counters 0..n-1): tokens, logprobs."""
    logits = np.tile(np.asarray(logits, np.float32), (n, 1))
    return ref.sample(logits, *rows(n, **settings), np.full(n, seed, np.uint64), np.arange(n, dtype=np.int64))


def test_one_kept_token_is_always_drawn_with_logprob_zero():
    logits = np.array([0.5, 2.0, -1.0, 1.9, 0.0], np.float32)
    for settings in ({"top_k": 1}, {"top_p": 0.05}, {"min_p": 0.99, "temperature": 0.01}):
        tokens, logprobs = draws(logits, **settings)
        assert (tokens == 1).all() and (logprobs == 0).all(), settings


def test_all_mass_in_one_token_and_zero_mass_tokens_are_never_drawn():
    """exp(-40) * 2^42 rounds to a mass of 0: that token is never drawn, though its log-prob is finite."""
    _, masses = python_sample(np.array([0.0, -40.0, -200.0, 0.0], np.float32), 0, 0)
    assert masses == [SCALE, 0, 0, SCALE]
    tokens, logprobs = draws([0.0, -40.0, -200.0, 0.0], n=4000)
    counts = np.bincount(tokens, minlength=4)
    assert counts[1] == counts[2] == 0 and abs(counts[0] - 2000) < 200
    np.testing.assert_allclose(logprobs, np.log(0.5), rtol=1e-6)
    lp = ref.logprobs_under_sampling(np.array([[0.0, -40.0, -200.0, 0.0]], np.float32), np.array([1]),
                                     *rows(1))
    np.testing.assert_allclose(lp, -40.0 - np.log(2.0), rtol=1e-6)
    tokens, logprobs = draws([3.0, -100.0, -100.0, -100.0])
    assert (tokens == 0).all() and (logprobs == 0).all()


def test_tied_logits_are_drawn_uniformly():
    from scipy.stats import chisquare

    tokens, _ = draws([1.0, 1.0, 1.0, 1.0, 1.0, -np.inf], n=10_000)
    counts = np.bincount(tokens, minlength=6)
    assert counts[5] == 0 and chisquare(counts[:5]).pvalue > 1e-3, counts


def test_banned_tokens_are_never_drawn_and_a_fully_banned_row_gives_token_zero():
    logits = np.array([-np.inf, 0.3, -np.inf, 0.1, -np.inf], np.float32)
    tokens, logprobs = draws(logits, n=1000, top_k=2, top_p=0.9)
    assert set(np.unique(tokens)) <= {1, 3} and np.isfinite(logprobs).all()
    with np.errstate(invalid="ignore"):
        tokens, logprobs = draws(np.full(5, -np.inf), n=3)
    assert (tokens == 0).all() and np.isnan(logprobs).all()
