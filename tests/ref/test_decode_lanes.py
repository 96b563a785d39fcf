"""`Model.forward_paged` in decode lanes: a decode step cut into parts that run on lanes of their own gives the
logits and the KV cache of one batch, and the parts' attentions take turns in issue order."""

import numpy as np
import pytest
from test_forward_paged_fresh import BLOCK, tiny_model

from barerl.backend import ref
from barerl.model import model as model_module

SEQS = 40  # >= 2 lanes x DECODE_LANE_ROWS


def decode_step(model, kv_cache, contexts, rng):
    """One decode step of len(contexts) sequences whose first contexts[s] - 1 tokens are in the cache (filled
    by a prefill of random tokens first), each sequence with blocks of its own."""
    per_seq = -(-max(contexts) // BLOCK)
    tables = np.arange(len(contexts) * per_seq, dtype=np.int32).reshape(len(contexts), per_seq)
    positions = np.array(contexts, np.int32) - 1
    slots = tables[np.arange(len(contexts)), positions // BLOCK] * BLOCK + positions % BLOCK
    ids = rng.integers(0, model.cfg.vocab_size, len(contexts)).astype(np.int32)
    cu = np.arange(len(contexts) + 1, dtype=np.int32)
    return model.forward_paged(ids, positions, cu, np.array(contexts, np.int32), tables, slots.astype(np.int32),
                               kv_cache)


def filled_cache(model, contexts, seed=1):
    rng = np.random.default_rng(seed)
    per_seq = -(-max(contexts) // BLOCK)
    cache = model.allocate_kv_cache(len(contexts) * per_seq, BLOCK)
    cache[...] = rng.standard_normal(cache.shape).astype(cache.dtype)
    return cache


@pytest.mark.parametrize("lanes", [2, 3])
def test_lanes_give_the_logits_and_cache_of_one_batch(lanes):
    model = tiny_model()
    contexts = np.random.default_rng(0).integers(1, 14, SEQS).tolist()
    results = []
    for count in (1, lanes):
        model.decode_lanes = count
        cache = filled_cache(model, contexts)
        results.append((decode_step(model, cache, contexts, np.random.default_rng(2)), cache))
    # NumPy's fp32 products may round differently for fewer rows: close, not equal (GPU test: bitwise)
    np.testing.assert_allclose(results[1][0], results[0][0], rtol=1e-5, atol=1e-5)
    np.testing.assert_allclose(results[1][1], results[0][1], rtol=1e-5, atol=1e-5)


class LaneRecorder:
    """The reference backend, logging (lane, op) for attentions and lane waits / marks."""

    def __init__(self, log):
        self.log, self.lane = log, None

    def __getattr__(self, name):
        return getattr(ref, name)

    def lanes(self, count):
        recorder = self

        class Recorded(ref.Lanes):
            def on(self, lane):
                recorder.lane = lane
                return super().on(lane)

            def mark(self):
                recorder.log.append((recorder.lane, "mark"))
                return len(recorder.log) - 1

            def wait(self, mark):
                recorder.log.append((recorder.lane, f"wait {mark}"))

        return Recorded(count)

    def paged_attention(self, *args):
        self.log.append((self.lane, "attention"))
        return ref.paged_attention(*args)


def test_lanes_attentions_take_turns_in_issue_order(monkeypatch):
    monkeypatch.setattr(model_module, "DECODE_LANES_TAKE_TURNS", True)
    model = tiny_model()
    model.decode_lanes = 2
    log = []
    model.backend = LaneRecorder(log)
    contexts = [5] * SEQS
    decode_step(model, filled_cache(model, contexts), contexts, np.random.default_rng(2))
    attentions = [i for i, (_, op) in enumerate(log) if op == "attention"]
    layers = model.cfg.num_hidden_layers
    assert [log[i][0] for i in attentions] == [0, 1] * layers  # layer by layer, lane by lane
    for before, after in zip(attentions, attentions[1:]):  # each waits for the mark of the one before it
        assert log[before + 1] == (log[before][0], "mark")
        assert log[after - 1] == (log[after][0], f"wait {before + 1}")


def test_small_decode_steps_and_prefills_run_in_one_lane():
    model = tiny_model()
    model.decode_lanes = 2
    log = []
    model.backend = LaneRecorder(log)
    contexts = [5] * (2 * model_module.DECODE_LANE_ROWS - 1)
    decode_step(model, filled_cache(model, contexts), contexts, np.random.default_rng(2))
    assert {lane for lane, _ in log} == {None}
