"""Cascade groups: `shared_prefixes` finds the runs of sequences that begin with the same KV blocks, every
result is a true statement about the step (the reference's `check_shared_prefix`), `prepare_step` groups
the decodes of a prompt's n samples, and the engine generates the same tokens with and without them."""

import dataclasses

import numpy as np
import pytest
from engine_helpers import PagedMockModel, naive_generate

from barerl import LLM, SamplingParams
from barerl.backend.ref import MAX_SHARED_PREFIX_MEMBERS, SharedPrefix
from barerl.backend.ref.nn import check_shared_prefix
from barerl.engine.block_manager import BlockManager
from barerl.engine.model_runner import MIN_SHARED_PREFIX_TOKENS, ModelRunner, prepare_step, shared_prefixes
from barerl.engine.scheduler import Scheduler
from barerl.engine.sequence import Request

BLOCK = 16


def padded(rows):
    """Block tables as block_tables(batch) gives them: (S, max_blocks) int32, -1 past each row's end."""
    width = max(len(r) for r in rows)
    return np.array([r + [-1] * (width - len(r)) for r in rows], np.int32)


def siblings(num, shared, own=2, first_own=100):
    """num block tables sharing blocks 0..shared-1, then `own` blocks of their own each."""
    return [list(range(shared)) + [first_own + own * i + j for j in range(own)] for i in range(num)]


def groups(rows, context_lens, max_members=8):
    """shared_prefixes of the padded rows, checked against the reference's statement of truth."""
    tables, lens = padded(rows), np.array(context_lens, np.int32)
    prefix, sizes = shared_prefixes(tables, lens, BLOCK, max_members)
    assert prefix.dtype == sizes.dtype == np.int32 and prefix.shape == sizes.shape == (len(rows),)
    check_shared_prefix(SharedPrefix(prefix, sizes), tables, lens, len(rows), BLOCK)
    return prefix.tolist(), sizes.tolist()


def test_eight_siblings_sharing_eight_blocks_are_one_group():
    prefix, sizes = groups(siblings(8, 8), [8 * BLOCK + 20 + i for i in range(8)])
    assert sizes == [8, 0, 0, 0, 0, 0, 0, 0]
    assert prefix == [8 * BLOCK] * 8


@pytest.mark.parametrize(("num", "max_members", "want_sizes"), [
    (8, 3, [3, 0, 0, 3, 0, 0, 2, 0]),
    (7, 3, [3, 0, 0, 3, 0, 0, 0]),  # the last run of one shares nothing
    (9, 8, [8, 0, 0, 0, 0, 0, 0, 0, 0]),
    (5, 2, [2, 0, 2, 0, 0]),
])
def test_runs_are_cut_at_max_members(num, max_members, want_sizes):
    prefix, sizes = groups(siblings(num, 5), [6 * BLOCK] * num, max_members)
    assert sizes == want_sizes
    in_group = [s for start, n in enumerate(sizes) for s in range(start, start + n)]
    assert prefix == [5 * BLOCK if s in in_group else 0 for s in range(num)]


def test_the_shortest_context_caps_the_prefix():
    rows = [list(range(8)) for _ in range(3)]  # eight equal columns, more than the contexts fill
    prefix, sizes = groups(rows, [120, 80, 100])
    assert sizes == [3, 0, 0] and prefix == [80, 80, 80]


def test_different_first_blocks_split_groups():
    rows = siblings(3, 5) + [[50 + j for j in range(5)] + [200 + i] for i in range(2)] + siblings(2, 5)
    prefix, sizes = groups(rows, [6 * BLOCK] * 7)
    assert sizes == [3, 0, 0, 2, 0, 2, 0]  # the third run has the first run's blocks: not adjacent to it
    assert prefix == [5 * BLOCK] * 7


def test_prefixes_under_one_tile_share_nothing():
    assert MIN_SHARED_PREFIX_TOKENS == 4 * BLOCK
    assert groups(siblings(4, 3), [5 * BLOCK] * 4) == ([0] * 4, [0] * 4)
    assert groups(siblings(4, 4), [6 * BLOCK] * 4) == ([4 * BLOCK] * 4, [4, 0, 0, 0])


def test_padded_tables():
    rows = [[1, 2, 3, 4, 5, 6, 7], [1, 2, 3, 4, 8], [1, 2, 3, 4, 5], [9]]
    prefix, sizes = groups(rows, [7 * BLOCK, 5 * BLOCK, 5 * BLOCK - 3, 1])
    assert sizes == [3, 0, 0, 0] and prefix == [64, 64, 64, 0]
    assert groups([[], []], [0, 0]) == ([0, 0], [0, 0])  # -1 columns are never shared blocks


def test_a_member_diverging_early_shrinks_its_groups_prefix():
    rows = siblings(4, 8)
    rows[2][5:] = [300, 301, 302, 303, 304]
    prefix, sizes = groups(rows, [10 * BLOCK] * 4)
    assert sizes == [4, 0, 0, 0] and prefix == [5 * BLOCK] * 4


def test_nothing_to_share():
    assert groups(siblings(1, 8), [9 * BLOCK]) == ([0], [0])
    assert groups(siblings(4, 8), [9 * BLOCK] * 4, max_members=1) == ([0] * 4, [0] * 4)


@pytest.mark.parametrize("seed", range(20))
def test_random_tables_give_true_statements(seed):
    """Rows copy a random prefix of the row before (or of an older one), then go their own way."""
    rng = np.random.default_rng(seed)
    block_size = int(rng.choice([4, 16, 32]))
    rows, lens, fresh = [], [], iter(range(10_000))
    for _ in range(int(rng.integers(1, 40))):
        length = int(rng.integers(1, 12))
        source = rows[-int(rng.integers(1, 3))] if len(rows) >= 2 and rng.random() < 0.8 else []
        keep = int(rng.integers(0, min(len(source), length) + 1))
        rows.append(source[:keep] + [next(fresh) for _ in range(length - keep)])
        lens.append(int(rng.integers((length - 1) * block_size + 1, length * block_size + 1)))
    max_members = int(rng.choice([2, 4, MAX_SHARED_PREFIX_MEMBERS]))
    tables, context_lens = padded(rows), np.array(lens, np.int32)
    prefix, sizes = shared_prefixes(tables, context_lens, block_size, max_members)
    check_shared_prefix(SharedPrefix(prefix, sizes), tables, context_lens, len(rows), block_size)
    assert ((prefix == 0) | (prefix >= MIN_SHARED_PREFIX_TOKENS)).all()
    assert not (sizes == 1).any()


# ---------------------------------------------------------------------------------------------------------
# prepare_step and the runner


def decode_of_siblings(prompt_len, n=8):
    """A scheduler whose next batch is the first decode step of a prompt's n samples (block size 16)."""
    sched = Scheduler(BlockManager(64, BLOCK), max_num_seqs=16, max_num_batched_tokens=256, max_model_len=256)
    request = Request(0, None, list(range(1, prompt_len + 1)), SamplingParams(n=n, max_tokens=20), seed=1)
    sched.add(request)
    prefill = sched.schedule()
    assert prepare_step(prefill, BLOCK, max_group_members=8).group_sizes.tolist() == [0]  # not a decode step
    sched.update(prefill, list(range(n)), [0.0] * n)
    return sched.schedule(), request


def test_prepare_step_groups_the_decodes_of_eight_siblings():
    batch, request = decode_of_siblings(70)
    step = prepare_step(batch, BLOCK, max_group_members=8)
    assert step.is_decode_only
    # four full prompt blocks are shared; the fifth (6 tokens) was copied on write by all but one sample
    assert step.group_sizes.tolist() == [8, 0, 0, 0, 0, 0, 0, 0]
    assert step.prefix_lens.tolist() == [64] * 8
    assert (step.block_tables[:, :4] == request.sequences[0].block_table[:4]).all()
    assert prepare_step(batch, BLOCK, max_group_members=4).group_sizes.tolist() == [4, 0, 0, 0, 4, 0, 0, 0]
    off = prepare_step(batch, BLOCK)
    assert not off.group_sizes.any() and not off.prefix_lens.any()


def test_prepare_step_leaves_a_short_prompts_samples_ungrouped():
    batch, _ = decode_of_siblings(63)
    step = prepare_step(batch, BLOCK, max_group_members=8)
    assert not step.group_sizes.any() and not step.prefix_lens.any()


def mock_with_heads(heads, kv_heads):
    model = PagedMockModel()
    model.cfg.num_attention_heads, model.cfg.num_key_value_heads = heads, kv_heads
    return model


@pytest.mark.parametrize(("cascade", "want"), [(True, MAX_SHARED_PREFIX_MEMBERS), (False, 0)])
def test_max_group_members(cascade, want):
    runner = ModelRunner(mock_with_heads(4, 2), 8, 4, cascade_attention=cascade)
    assert runner.max_group_members == want


def test_the_runner_passes_groups_of_cached_decode_steps_only():
    batch, _ = decode_of_siblings(70)
    runner = ModelRunner(mock_with_heads(4, 2), 64, BLOCK)
    step = prepare_step(batch, BLOCK, runner.max_group_members)
    shared = runner.shared_prefix(step)
    assert shared.group_sizes.tolist() == step.group_sizes.tolist()
    assert shared.lens.tolist() == step.prefix_lens.tolist()
    assert shared.arrivals.dtype == np.int32 and shared.arrivals.shape == (8 * 2,) and not shared.arrivals.any()
    assert runner.shared_prefix(dataclasses.replace(step, fresh_from=7)) is None
    assert runner.shared_prefix(dataclasses.replace(step, group_sizes=np.zeros(8, np.int32))) is None


# ---------------------------------------------------------------------------------------------------------
# the engine


LONG_PROMPTS = [np.random.default_rng(0).integers(1, 32, 70).tolist(), list(range(1, 21)),
                np.random.default_rng(1).integers(1, 32, 90).tolist()]
LONG_PARAMS = [SamplingParams(n=8, temperature=1.0, max_tokens=14, seed=3, logprobs=True),
               SamplingParams(n=2, temperature=1.0, max_tokens=10, seed=4, logprobs=True),
               SamplingParams(n=5, temperature=0.8, top_k=6, max_tokens=12, seed=5, logprobs=True)]


@pytest.mark.parametrize("num_steps", [1, 4])
def test_every_decode_step_of_the_samples_passes_their_group(num_steps):
    """Single steps, lookahead calls and their continuations (num_steps=4) alike."""
    model = PagedMockModel()
    llm = LLM(model, block_size=4, max_model_len=128, num_scheduler_steps=num_steps)
    llm.generate(LONG_PROMPTS[:1], SamplingParams(n=8, max_tokens=14, seed=3), use_tqdm=False)
    assert model.num_forward_tokens == 70 + 13 * 8  # one prefill, then 13 decode steps of the 8 samples
    assert model.shared_prefixes == [([68] * 8, [8, 0, 0, 0, 0, 0, 0, 0])] * 13  # 17 full blocks of 4


@pytest.mark.parametrize("num_steps", [1, 4])
def test_mock_engine_with_groups_matches_the_naive_oracle(num_steps):
    """The mock reads every history back from the cache and checks each statement of shared blocks."""
    model = PagedMockModel()
    results = {}
    for disable in (False, True):
        model.shared_prefixes.clear()
        llm = LLM(model, block_size=4, max_model_len=128, max_num_seqs=16, num_scheduler_steps=num_steps,
                  disable_cascade_attn=disable)
        results[disable] = llm.generate(LONG_PROMPTS, LONG_PARAMS, use_tqdm=False)
        group_sizes = [n for _, sizes in model.shared_prefixes for n in sizes]
        assert (8 in group_sizes and 5 in group_sizes) != disable
    for with_groups, without, prompt, params in zip(results[False], results[True], LONG_PROMPTS, LONG_PARAMS):
        want = naive_generate(model, prompt, params, params.seed)
        for got, plain, (want_tokens, want_logprobs) in zip(with_groups.outputs, without.outputs, want):
            assert got.token_ids == plain.token_ids == want_tokens
            np.testing.assert_allclose(got.logprobs, want_logprobs, rtol=1e-6)


@pytest.mark.parametrize("num_steps", [1, 4])
def test_cascade_changes_no_token_of_a_real_model(num_steps):
    """A tiny random Qwen3 (4 query heads on 2 kv heads: groups of up to 8), 8 samples of a 75-token prompt:
    the reference validates the groups in every decode step's attention and attends as without them."""
    from barerl.config import ModelConfig
    from barerl.model.model import Model

    cfg = ModelConfig.from_dict({
        "architectures": ["Qwen3ForCausalLM"], "vocab_size": 50, "hidden_size": 32, "intermediate_size": 64,
        "num_hidden_layers": 2, "num_attention_heads": 4, "num_key_value_heads": 2, "head_dim": 8,
        "max_position_embeddings": 128,
    })
    model = Model.random(cfg, seed=0)
    forward_paged, seen = model.forward_paged, []

    def recording(*args, shared_prefix=None, **kwargs):
        seen.append(0 if shared_prefix is None else int(shared_prefix.group_sizes.max()))
        return forward_paged(*args, shared_prefix=shared_prefix, **kwargs)

    model.forward_paged = recording
    prompts = [np.random.default_rng(2).integers(1, 50, 75).tolist(), list(range(1, 9))]
    params = [SamplingParams(n=8, temperature=1.0, max_tokens=12, ignore_eos=True, seed=7, logprobs=True),
              SamplingParams(temperature=0, max_tokens=12, ignore_eos=True, logprobs=True)]
    outputs = {}
    for disable in (False, True):
        seen.clear()
        llm = LLM(model, block_size=8, max_model_len=128, num_scheduler_steps=num_steps,
                  disable_cascade_attn=disable)
        result = llm.generate(prompts, params, use_tqdm=False)
        outputs[disable] = [(c.token_ids, c.logprobs) for o in result for c in o.outputs]
        assert seen == [0] + [0 if disable else 8] * 11  # the prefill, then every decode step
    assert [t for t, _ in outputs[False]] == [t for t, _ in outputs[True]]
    for (_, with_groups), (_, without) in zip(outputs[False], outputs[True]):
        np.testing.assert_allclose(with_groups, without, rtol=1e-6, atol=1e-7)
