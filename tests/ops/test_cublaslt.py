"""cuBLASLt's algorithm choice for decode-sized products (ops/cuda/cublaslt.py). On the CPU: which candidates
are timed and kept, with `_TUNE_DECODE` on and off, which a batch-invariant plan keeps or makes, and the
search's walk over configurations (split-free when batch-invariant). On the GPU: every candidate is right (the
cold tuning may pick any), the search keeps a right one, a timed algorithm whose output disagrees with the
first pick's is refused, the tuning cycles through exact, aligned copies of b and records its pick,
`_TUNE_DECODE = False` keeps the first pick over a recorded one, an in-place accumulation is never tuned, and in batch-invariant mode a row has the same bits at 1 to 4,096 rows.
"""

from __future__ import annotations

import json
import math

import numpy as np
import pytest
from kernel_harness import BF16, FP32, assert_close, f32, poison

ROWS, N, K = 64, 1024, 2048  # o_proj + residual in a G1 decode step: x (64, 2048) @ w (1024, 2048).T


def fake_plan(times: list[float], decode: bool):
    """A plan whose candidates are told apart by their first algorithm word, and a tune() of those times."""
    from barerl.ops.cuda.cublaslt import HeuristicResult, _Plan

    candidates = [HeuristicResult() for _ in times]
    for i, candidate in enumerate(candidates):
        candidate.algo[0] = i
    timed = []

    def tune(candidate) -> float:
        timed.append(candidate.algo[0])
        return times[candidate.algo[0]]

    return _Plan(None, (), candidates, "key", decode=decode, invariant=False), tune, timed


def host_lt(tmp_path, choices=None):
    """An _Lt with no library: what algorithm() needs to choose and record."""
    from barerl.ops.cuda.cublaslt import _Lt

    state = object.__new__(_Lt)
    state.choices, state.choices_path = dict(choices or {}), tmp_path / "choices.json"
    return state


@pytest.mark.parametrize("decode", [False, True])
def test_decode_plans_time_their_first_candidates_only(tmp_path, monkeypatch, decode):
    from barerl.ops.cuda import cublaslt

    monkeypatch.setattr(cublaslt, "_DECODE_CANDIDATES", 3)
    monkeypatch.setattr(cublaslt, "_SEARCH_DECODE", not decode)  # on: a search would need the library it lacks
    plan, tune, timed = fake_plan([10.0, 9.0, 8.0, 1.0], decode)
    state = host_lt(tmp_path)
    chosen = state.algorithm(plan, tune)
    assert timed == ([0, 1, 2] if decode else [0, 1, 2, 3]) and chosen.algo[0] == (2 if decode else 3)
    assert json.loads(state.choices_path.read_text()) == {"key": bytes(chosen.algo).hex()}


def test_decode_tuning_off_ignores_recorded_choices(tmp_path, monkeypatch):
    from barerl.ops.cuda import cublaslt

    monkeypatch.setattr(cublaslt, "_TUNE_DECODE", False)
    plan, tune, timed = fake_plan([10.0, 1.0], decode=True)
    state = host_lt(tmp_path, {"key": bytes(plan.candidates[1].algo).hex()})
    assert state.algorithm(plan, tune).algo[0] == 0 and timed == []


# SPLITK_NUM, REDUCTION_SCHEME, TILE_ID, STAGES_ID, CLUSTER_SHAPE_ID, CTA_SWIZZLING -> the fake algorithm's word
_FAKE_WORDS = {2: 1, 3: 2, 1: 3, 6: 4, 8: 5, 4: 6}


class FakeAlgorithmLibrary:
    """cuBLASLt's algorithm-configuration calls on fake algorithms: word 0 names one, words 1-6 hold its split-K
    parts, reduction scheme, tile, stages, cluster shape and swizzle; AlgoCheck accepts the names in `accepted`
    (and, when given, the configurations `valid(words)` accepts); `caps` are every algorithm's capabilities."""

    def __init__(self, accepted, caps=None, valid=None):
        self.accepted, self.caps, self.valid = accepted, caps or {}, valid or (lambda words: True)

    def cublasLtMatmulAlgoCapGetAttribute(self, algo, attribute, words, nbytes, written):
        values = self.caps[attribute]
        written._obj.value = 4 * len(values)
        for i, value in enumerate(values[: nbytes // 4]):
            words[i] = value
        return 0

    def cublasLtMatmulAlgoConfigGetAttribute(self, algo, attribute, value, nbytes, written):
        value._obj.value = algo._obj[_FAKE_WORDS[attribute]] if attribute in _FAKE_WORDS else 0
        return 0

    def cublasLtMatmulAlgoConfigSetAttribute(self, algo, attribute, value, nbytes):
        algo._obj[_FAKE_WORDS[attribute]] = value._obj.value
        return 0

    def cublasLtMatmulAlgoCheck(self, handle, desc, a, b, c, d, algo, result):
        result._obj.workspace_size = 0
        ok = algo._obj[0] in self.accepted and self.valid(list(algo._obj))
        return 0 if ok else 15  # CUBLAS_STATUS_NOT_SUPPORTED


def algorithms(*split_parts):
    from barerl.ops.cuda.cublaslt import HeuristicResult

    results = [HeuristicResult() for _ in split_parts]
    for i, (result, parts) in enumerate(zip(results, split_parts)):
        result.algo[0], result.algo[1], result.algo[2] = i // 2 if parts > 1 else 100 + i, parts, 2 * (parts > 1)
    return results


def test_batch_invariant_plans_keep_or_make_split_free_algorithms():
    """Split-free candidates are kept as they are; with none, the split-K ones get one part (and no reduction),
    those cuBLASLt accepts are kept, each once."""
    from barerl.ops.cuda.cublaslt import _Lt

    state = object.__new__(_Lt)
    state.handle, state.lib = None, FakeAlgorithmLibrary(accepted={0, 1})
    mixed = algorithms(2, 1, 4, 1)
    assert [r.algo[0] for r in state._split_free(None, (None,) * 4, mixed)] == [101, 103]
    made = state._split_free(None, (None,) * 4, algorithms(2, 2, 4, 2, 2, 2))  # names 0, 0, 1, 1, 2, 2
    assert [(r.algo[0], r.algo[1], r.algo[2]) for r in made] == [(0, 1, 0), (1, 1, 0)]  # 2 refused; twins once


def searched(tmp_path, invariant: bool):
    """The search from a fake first pick on the fake library: tiles 1-3 x stages 4-5 (tile 3 needs stages 5),
    split-K into up to 16 parts with reduction schemes 2 and 4, cluster shapes, swizzle 0/1. Time: 10 less 1
    per tile step, 2 per split part past one (up to 4), 0.5 for cluster shape 2 -> (chosen words, timed words)."""
    caps = {6: [1, 2, 3], 13: [4, 5], 0: [1], 1: [2 | 4], 2: [1]}
    state = host_lt(tmp_path)
    state.handle = None
    state.lib = FakeAlgorithmLibrary({7}, caps, valid=lambda w: w[3] != 3 or w[4] == 5)
    plan, _, _ = fake_plan([10.0], decode=True)
    plan.invariant, plan.layouts = invariant, (None,) * 4
    first = plan.candidates[0]
    first.algo[0], first.algo[1], first.algo[3], first.algo[4] = 7, 1, 1, 4
    timed = []

    def tune(candidate) -> float:
        words = list(candidate.algo)[:7]
        timed.append(words)
        return 10.0 - (words[3] - 1) - 2 * min(words[1] - 1, 3) - 0.5 * (words[5] == 2)

    plan.candidates.append(first)  # two candidates: algorithm() tunes rather than keeping the only one
    chosen = state.algorithm(plan, tune)
    assert state.choices["key"] == bytes(chosen.algo).hex()
    return list(chosen.algo)[:7], timed


def test_decode_search_walks_one_attribute_at_a_time(tmp_path):
    chosen, timed = searched(tmp_path, invariant=False)
    assert chosen == [7, 4, 2, 3, 5, 2, 0]  # tile 3 (with stages 5), then 4 parts (the first at 2 ms), cluster 2
    assert all(w[3] != 3 or w[4] == 5 for w in timed)  # only configurations cuBLASLt accepts are timed
    assert len({tuple(w) for w in timed[2:]}) == len(timed) - 2  # none twice (past the two given candidates)


def test_decode_search_keeps_batch_invariant_plans_split_free(tmp_path):
    chosen, timed = searched(tmp_path, invariant=True)
    assert chosen == [7, 1, 0, 3, 5, 2, 0] and all(w[1] == 1 for w in timed)


@pytest.fixture
def lt(monkeypatch, tmp_path):
    """This device's cuBLASLt state with no plans and no recorded choices (written under tmp_path)."""
    from barerl.ops.cuda import cublaslt

    state = cublaslt._lt()
    monkeypatch.setattr(state, "plans", {})
    monkeypatch.setattr(state, "choices", {})
    monkeypatch.setattr(state, "choices_path", tmp_path / "choices.json")
    return state


def operands(draw):
    """x, w, residual of the product, and its fp32 reference."""
    x, w, residual = draw.normal((ROWS, K), BF16), draw.normal((N, K), BF16, 0.02), draw.normal((ROWS, N), BF16)
    return x, w, residual, f32(x) @ f32(w).T + f32(residual)


@pytest.mark.gpu
def test_every_decode_candidate_is_right(draw, lt):
    import cupy

    from barerl.ops.cuda import cublaslt

    x, w, residual, want = operands(draw)
    out = cupy.empty((ROWS, N), BF16)
    for algo in range(cublaslt.candidates(x, w, out, transb=True, c=residual)):
        poison(out)
        cublaslt.matmul(x, w, out, transb=True, beta=1.0, c=residual, algo=algo)
        assert_close(f"candidate {algo}", out, want, BF16)


@pytest.mark.gpu
def test_decode_tuning_cycles_through_copies_of_b(draw, lt, monkeypatch):
    import cupy

    from barerl.ops.cuda import cublaslt

    x, w, residual, want = operands(draw)
    cycles = []

    def checked_copies(b, stream):
        memory, pointers = real_copies(b, stream)
        for ptr in pointers[1:]:
            assert ptr % 256 == 0
            copy = cupy.ndarray(b.shape, np.uint16, cupy.cuda.MemoryPointer(memory, ptr - memory.ptr))
            assert bool((copy == b.view(np.uint16)).all())
        cycles.append(pointers)
        return memory, pointers

    real_copies = cublaslt._cold_copies
    monkeypatch.setattr(cublaslt, "_cold_copies", checked_copies)
    monkeypatch.setattr(cublaslt, "_SEARCH_DECODE", False)  # the heuristic's candidates alone
    out = cupy.empty((ROWS, N), BF16)
    poison(out)
    cublaslt.matmul(x, w, out, transb=True, beta=1.0, c=residual)
    assert_close("tuned", out, want, BF16)
    assert len(cycles) == 1 and cycles[0][0] == w.data.ptr
    assert len(cycles[0]) == min(cublaslt._COLD_MAX_COPIES, math.ceil(cublaslt._COLD_BYTES / w.nbytes))
    assert cublaslt.chosen(x, w, out, transb=True, c=residual) in range(cublaslt._DECODE_CANDIDATES)
    recorded = json.loads(lt.choices_path.read_text())
    assert [key for key in recorded if "m<=64 n<=1024 k<=2048" in key]


@pytest.mark.gpu
def test_decode_search_keeps_a_right_algorithm(draw, lt):
    import cupy

    from barerl.ops.cuda import cublaslt

    x, w, residual, want = operands(draw)
    out = cupy.empty((ROWS, N), BF16)
    poison(out)
    cublaslt.matmul(x, w, out, transb=True, beta=1.0, c=residual)
    assert_close("searched", out, want, BF16)
    plan = cublaslt._plan_for(x, w, out, False, True, residual, None, False)[0]
    assert json.loads(lt.choices_path.read_text())[plan.tuning_key] == bytes(plan.chosen.algo).hex()
    print("searched:", cublaslt.algorithm_config(plan.chosen), "first pick:",
          cublaslt.algorithm_config(plan.candidates[0]))


@pytest.mark.gpu
def test_a_timed_algorithm_must_agree_with_the_first_pick(draw):
    import cupy

    from barerl.ops.cuda import cublaslt

    first = draw.normal((ROWS, N), BF16)
    scratch = {"d": first.copy()}
    assert cublaslt._agrees(scratch)  # the reference
    scratch["d"] = first + cupy.asarray(0.001, BF16) * first
    assert cublaslt._agrees(scratch)
    scratch["d"] = first[::-1].copy()
    assert not cublaslt._agrees(scratch)
    scratch["d"] = first.copy()
    scratch["d"][3, 5] = np.nan
    assert not cublaslt._agrees(scratch)


@pytest.mark.gpu
def test_decode_tuning_off_keeps_the_first_pick(draw, lt, monkeypatch):
    import cupy

    from barerl.ops.cuda import cublaslt

    x, w, residual, want = operands(draw)
    out = cupy.empty((ROWS, N), BF16)
    plan = cublaslt._plan_for(x, w, out, False, True, residual, None, False)[0]
    lt.choices[plan.tuning_key] = bytes(plan.candidates[-1].algo).hex()  # as a run with tuning on left it
    monkeypatch.setattr(cublaslt, "_TUNE_DECODE", False)
    monkeypatch.setattr(cublaslt, "_cold_copies", lambda b, stream: pytest.fail("timed with tuning off"))
    cublaslt.matmul(x, w, out, transb=True, beta=1.0, c=residual)
    assert_close("first pick", out, want, BF16)
    assert cublaslt.chosen(x, w, out, transb=True, c=residual) == 0


@pytest.mark.gpu
def test_in_place_decode_accumulation_is_never_tuned(draw, lt, monkeypatch):
    from barerl.ops.cuda import cublaslt

    x, w, _, _ = operands(draw)
    acc = draw.normal((ROWS, N), FP32)
    want = acc + f32(x) @ f32(w).T
    monkeypatch.setattr(cublaslt._Lt, "algorithm", lambda *args: pytest.fail("in-place accumulation tuned"))
    cublaslt.matmul(x, w, acc, transb=True, beta=1.0)
    assert_close("acc += x w^T", acc, want, BF16)


@pytest.mark.gpu
@pytest.mark.parametrize(("n", "k"), [(1024, 3072), (4096, 1024), (1024, 2048)], ids=["down", "qkv", "o_proj"])
def test_batch_invariant_rows_have_the_same_bits_at_any_row_count(draw, lt, n, k):
    """down_proj's shape at 16-64 rows is one where cuBLASLt proposes only split-K algorithms (H200)."""
    import cupy

    from barerl.ops.cuda import cublaslt

    x, w, residual = draw.normal((4096, k), BF16), draw.normal((n, k), BF16, 0.02), draw.normal((4096, n), BF16)
    big = cublaslt.matmul(x, w, cupy.empty((4096, n), BF16), transb=True, beta=1.0, c=residual, batch_invariant=True)
    for rows in (1, 16, 64, 256):
        out = cupy.empty((rows, n), BF16)
        configs = cublaslt.candidate_configs(x[:rows], w, out, transb=True, c=residual[:rows], batch_invariant=True)
        assert configs and all(c["splitk"] <= 1 for c in configs)
        cublaslt.matmul(x[:rows], w, out, transb=True, beta=1.0, c=residual[:rows], batch_invariant=True)
        assert (out.view(np.uint16) == big[:rows].view(np.uint16)).all(), rows


@pytest.mark.parametrize("decode", [False, True])
def test_deferred_tuning_spares_decode_sized_products_only(monkeypatch, decode):
    """Inside defer_decode_tuning() (an engine step that is not pure decode) a decode-sized product does not
    time its candidates; a larger one still does, and outside it both do."""
    from barerl.ops.cuda import cublaslt

    monkeypatch.setattr(cublaslt, "_capturing", lambda stream: False)
    plan, _, _ = fake_plan([10.0, 1.0], decode)
    assert cublaslt._may_tune(plan, None)
    with cublaslt.defer_decode_tuning():
        assert cublaslt._may_tune(plan, None) is not decode
        with cublaslt.defer_decode_tuning():
            pass
        assert cublaslt._may_tune(plan, None) is not decode  # nested scopes keep the outer one
    assert cublaslt._may_tune(plan, None)


@pytest.mark.gpu
def test_a_deferred_decode_sized_product_takes_the_first_pick_and_stays_untuned(draw, lt, monkeypatch):
    import cupy

    from barerl.ops.cuda import cublaslt

    x, w, residual, want = operands(draw)
    out = cupy.empty((ROWS, N), BF16)
    real_copies = cublaslt._cold_copies
    monkeypatch.setattr(cublaslt, "_cold_copies", lambda b, stream: pytest.fail("timed inside the deferral"))
    with cublaslt.defer_decode_tuning():
        cublaslt.matmul(x, w, out, transb=True, beta=1.0, c=residual)
    assert_close("first pick", out, want, BF16)
    plan = cublaslt._plan_for(x, w, out, False, True, residual, None, False)[0]
    assert plan.chosen is None and plan.tuning_key not in lt.choices  # left for a decode step to tune
    monkeypatch.setattr(cublaslt, "_cold_copies", real_copies)
    cublaslt.matmul(x, w, out, transb=True, beta=1.0, c=residual)
    assert plan.chosen is not None and plan.tuning_key in lt.choices
