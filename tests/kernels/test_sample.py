"""sample (kernels/sampling.py) against backend.ref.sampling.sample: identical tokens, close log-probs.

Every truncation mode alone and mixed row by row, the Qwen3 vocabulary, ties (greedy and at the k-th
value), peaked and flat rows, and reproducibility of a seeded draw.
"""

from __future__ import annotations

import numpy as np
import pytest

from barerl.backend import ref

pytestmark = pytest.mark.gpu
LOGPROB_ATOL = 1e-4
MODES = {  # mode -> per-row (temperature, top_k, top_p, min_p)
    "greedy": (0.0, 0, 1.0, 0.0),
    "temperature": (0.8, 0, 1.0, 0.0),
    "top_k": (1.0, 50, 1.0, 0.0),
    "top_p": (0.7, 0, 0.9, 0.0),
    "min_p": (1.2, 0, 1.0, 0.05),
    "all": (0.9, 200, 0.8, 0.02),
    "top_k_1": (1.0, 1, 1.0, 0.0),
    "top_p_tiny": (1.0, 0, 1e-4, 0.0),
}


def settings(draw, rows: int, modes: list[str]):
    """Device arrays (temperature, top_k, top_p, min_p, seeds, counters) with row i in mode modes[i % n]."""
    import cupy

    table = np.array([MODES[modes[i % len(modes)]] for i in range(rows)], dtype=np.float64)
    seeds = draw.rng.integers(0, 2**63, rows, dtype=np.int64).astype(np.uint64) * np.uint64(2) + np.uint64(1)
    counters = draw.rng.integers(0, 5000, rows).astype(np.int64)
    return (cupy.asarray(table[:, 0].astype(np.float32)), cupy.asarray(table[:, 1].astype(np.int32)),
            cupy.asarray(table[:, 2].astype(np.float32)), cupy.asarray(table[:, 3].astype(np.float32)),
            cupy.asarray(seeds), cupy.asarray(counters))


def check(logits, args):
    import cupy

    from barerl.backend import cuda

    tokens, logprobs = cuda.sample(logits, *args)
    want_tokens, want_logprobs = ref.sample(logits, *args)
    got_t, want_t = cupy.asnumpy(tokens), cupy.asnumpy(want_tokens)
    err = np.abs(cupy.asnumpy(logprobs).astype(np.float64) - cupy.asnumpy(want_logprobs))
    differ = int((got_t != want_t).sum())
    print(f"tokens: {differ} of {got_t.size} differ; logprob max abs error {err.max():.3e}")
    assert tokens.dtype == np.int32 and logprobs.dtype == np.float32
    np.testing.assert_array_equal(got_t, want_t)
    assert np.isfinite(cupy.asnumpy(logprobs)).all() and err.max() < LOGPROB_ATOL


@pytest.mark.parametrize("mode", list(MODES))
@pytest.mark.parametrize("vocab,scale", [(1000, 3.0), (32003, 1.0), (151936, 4.0)])
def test_each_mode(draw, mode, vocab, scale):
    logits = draw.normal((12, vocab), np.float32, scale)
    check(logits, settings(draw, 12, [mode]))


def test_mixed_rows(draw):
    logits = draw.normal((64, 151936), np.float32, 2.0)
    check(logits, settings(draw, 64, list(MODES)))


def test_ties(draw):
    """Logits on a coarse grid: greedy ties go to the lowest index, top-k keeps all ties of the k-th value."""
    import cupy

    logits = cupy.asarray(np.round(draw.rng.standard_normal((24, 5000)) * 2) / 2).astype(np.float32)
    check(logits, settings(draw, 24, ["greedy", "top_k", "all", "top_p"]))


def test_banned_tokens(draw):
    """Rows with -inf logits (how the engine bans tokens before min_tokens), one row all banned but one."""
    logits = draw.normal((6, 3000), np.float32, 2.0)
    logits[:, ::3] = -np.inf
    logits[5, :] = -np.inf
    logits[5, 7] = 1.5
    check(logits, settings(draw, 6, ["greedy", "temperature", "all"]))


def test_reproducible(draw):
    import cupy

    from barerl.backend import cuda

    logits = draw.normal((8, 20000), np.float32, 2.0)
    args = settings(draw, 8, ["temperature", "all"])
    first, second = cuda.sample(logits, *args)[0], cuda.sample(logits, *args)[0]
    assert bool(cupy.all(first == second))
