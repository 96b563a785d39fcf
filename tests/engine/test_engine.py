"""The whole engine on a mock model that reads every sequence back from the paged cache, against a naive
one-sequence-at-a-time oracle: batching, chunking, prefix caching, forking and preemption change nothing."""

import dataclasses

import numpy as np
import pytest
from engine_helpers import PagedMockModel, naive_generate

from barerl import LLM, SamplingParams
from barerl.engine.engine import Engine

BASE = {"block_size": 4, "max_model_len": 64, "max_num_seqs": 16, "num_scheduler_steps": 1}
ENGINE_CONFIGS = {
    "default": {},
    "no-prefix-cache": {"enable_prefix_caching": False},
    "max-num-seqs-3": {"max_num_seqs": 3},
    "chunked-5-tokens": {"max_num_batched_tokens": 5},
    "unchunked": {"enable_chunked_prefill": False, "max_num_batched_tokens": 64},
    "preemption": {"num_kv_blocks": 16},
    "preemption-no-cache": {"num_kv_blocks": 16, "enable_prefix_caching": False},
    "block-size-3": {"block_size": 3, "max_model_len": 63},
    "lookahead-4": {"num_scheduler_steps": 4},
    "lookahead-3-max-num-seqs-3": {"num_scheduler_steps": 3, "max_num_seqs": 3},
    "lookahead-4-preemption": {"num_scheduler_steps": 4, "num_kv_blocks": 16},
    "lookahead-4-synchronous": {"num_scheduler_steps": 4, "async_scheduling": False},
}
SHARED = list(range(1, 10))
PROMPTS = [list(range(3, 8)), list(range(11, 24)), [5], SHARED + [20, 21, 22], list(range(4, 24)),
           SHARED + [30]]
PARAMS = [
    SamplingParams(temperature=0, max_tokens=12, seed=1),
    SamplingParams(n=3, temperature=1.0, max_tokens=12, seed=2),
    SamplingParams(n=2, temperature=0.7, top_k=5, max_tokens=9, seed=3),
    SamplingParams(n=3, temperature=1.2, top_p=0.8, min_p=0.05, max_tokens=12, seed=4),
    SamplingParams(temperature=1.0, max_tokens=12, seed=5),
    SamplingParams(n=2, temperature=1.0, max_tokens=10, seed=6),
]


def token_lists(outputs):
    return [[(c.token_ids, c.logprobs) for c in o.outputs] for o in outputs]


@pytest.mark.parametrize("name", ENGINE_CONFIGS)
def test_engine_matches_the_naive_oracle(name):
    model = PagedMockModel()
    llm = LLM(model, **{**BASE, **ENGINE_CONFIGS[name]})
    lookaheads, continuations = [], []
    run_steps, continue_steps = llm.engine.runner.execute_steps, llm.engine.runner.continue_steps
    llm.engine.runner.execute_steps = lambda inputs, k: lookaheads.append(k) or run_steps(inputs, k)
    llm.engine.runner.continue_steps = lambda batch, previous: continuations.append(1) or continue_steps(batch, previous)
    params = [dataclasses.replace(p, logprobs=True) for p in PARAMS]
    outputs = llm.generate(PROMPTS, params, use_tqdm=False)
    assert bool(lookaheads) == (llm.config.num_scheduler_steps > 1)
    assert bool(continuations) == (llm.config.num_scheduler_steps > 1 and llm.config.async_scheduling)
    expected = [naive_generate(model, prompt, p, p.seed) for prompt, p in zip(PROMPTS, params)]
    for i, (got, want) in enumerate(zip(token_lists(outputs), expected)):
        for j, ((tokens, logprobs), (want_tokens, want_logprobs)) in enumerate(zip(got, want)):
            assert tokens == want_tokens, f"request {i} sample {j}"
            np.testing.assert_allclose(logprobs, want_logprobs, rtol=1e-6)
        assert [c.finish_reason for c in outputs[i].outputs] == ["length"] * params[i].n
    if name.startswith("preemption"):
        assert llm.stats["num_preemptions"] > 0
    assert llm.engine.block_manager.num_free_blocks == llm.engine.block_manager.num_blocks  # everything given back


def test_n_samples_share_one_prefill():
    model = PagedMockModel()
    llm = LLM(model, **BASE)
    out = llm.generate([list(range(1, 21))], SamplingParams(n=4, max_tokens=6, seed=0), use_tqdm=False)
    assert len({tuple(c.token_ids) for c in out[0].outputs}) == 4  # four different samples
    assert model.num_forward_tokens == 20 + 4 * 5


def test_each_finished_request_is_reported_once_and_returned_as_reported(monkeypatch):
    """on_finished(i, output) comes once per request as it finishes, with the very output generate returns:
    each one is built (detokenized) once."""
    llm = LLM(PagedMockModel(), **BASE)
    built, reported = [], []
    output = Engine.output
    monkeypatch.setattr(Engine, "output", lambda self, request, *a: built.append(request) or output(self, request, *a))
    outs = llm.generate(PROMPTS, PARAMS, use_tqdm=False, on_finished=lambda i, out: reported.append((i, out)))
    assert sorted(i for i, _ in reported) == list(range(len(PROMPTS)))
    assert all(outs[i] is out for i, out in reported)
    assert len(built) == len(PROMPTS)


def test_shared_system_prompt_is_computed_once():
    model = PagedMockModel()
    llm = LLM(model, **{**BASE, "max_num_seqs": 1})  # one at a time: each finds the previous one's blocks
    system = list(range(1, 17))
    prompts = [system + [20 + i, 21 + i] for i in range(3)]
    out = llm.generate(prompts, SamplingParams(temperature=0, max_tokens=3), use_tqdm=False)
    assert [o.metrics.num_cached_tokens for o in out] == [0, 16, 16]
    assert model.num_forward_tokens == 18 + 2 + 2 + 3 * 2
    again = llm.generate(prompts[:1], SamplingParams(temperature=0, max_tokens=3), use_tqdm=False)
    assert again[0].metrics.num_cached_tokens == 0  # the cache is reset per call: weights may have changed
    assert again[0].outputs[0].token_ids == out[0].outputs[0].token_ids


def test_unseeded_requests_follow_the_engine_seed():
    def run(seed):
        llm = LLM(PagedMockModel(), seed=seed, **BASE)
        return token_lists(llm.generate(PROMPTS[:3], SamplingParams(n=2, max_tokens=8), use_tqdm=False))

    assert run(0) == run(0)
    assert run(0) != run(1)


def test_a_seeded_request_does_not_depend_on_its_batch():
    params = SamplingParams(n=2, max_tokens=8, seed=42)
    alone = LLM(PagedMockModel(), **BASE).generate([PROMPTS[1]], params, use_tqdm=False)
    batched = LLM(PagedMockModel(), **BASE).generate(PROMPTS, params, use_tqdm=False)
    assert token_lists(alone)[0] == token_lists(batched)[1]


def test_stream_deltas_add_up_to_the_generate_output():
    params = SamplingParams(n=2, max_tokens=7, seed=3, logprobs=True)
    llm = LLM(PagedMockModel(), **BASE)
    [full] = llm.generate([PROMPTS[0]], params, use_tqdm=False)
    tokens, logprobs, finished = {0: [], 1: []}, {0: [], 1: []}, False
    for delta in llm.stream(PROMPTS[0], params):
        assert not finished
        finished = delta.finished
        for c in delta.outputs:
            tokens[c.index] += c.token_ids
            logprobs[c.index] += c.logprobs
    assert finished
    assert [tokens[0], tokens[1]] == [c.token_ids for c in full.outputs]
    assert [logprobs[0], logprobs[1]] == [c.logprobs for c in full.outputs]


def test_outputs_carry_vllm_fields_and_metrics():
    llm = LLM(PagedMockModel(), **BASE)
    [out] = llm.generate([[1, 2, 3]], SamplingParams(max_tokens=4, seed=0), use_tqdm=False)
    c = out.outputs[0]
    assert out.prompt_token_ids == [1, 2, 3] and out.finished and c.index == 0 and c.text == ""
    assert c.logprobs is None and c.cumulative_logprob < 0 and c.finish_reason == "length"
    m = out.metrics
    assert m.num_prompt_tokens == 3 and m.num_generated_tokens == 4 and 0 < m.time_to_first_token <= m.latency
    assert llm.stats["num_generated_tokens"] == 4


def test_sleep_releases_the_cache_and_wake_restores_it():
    llm = LLM(PagedMockModel(), **BASE)
    params = SamplingParams(n=2, max_tokens=5, seed=9)
    before = token_lists(llm.generate(PROMPTS[:2], params, use_tqdm=False))
    llm.sleep()
    assert llm.engine.runner.kv_cache is None
    with pytest.raises(RuntimeError, match="wake"):
        llm.generate(PROMPTS[:2], params, use_tqdm=False)
    llm.wake()
    assert token_lists(llm.generate(PROMPTS[:2], params, use_tqdm=False)) == before


def test_an_abandoned_stream_leaves_the_engine_clean():
    llm = LLM(PagedMockModel(), **BASE)
    stream = llm.stream(PROMPTS[1], SamplingParams(n=3, max_tokens=20, seed=1))
    next(stream)
    next(stream)
    out = llm.generate(PROMPTS[:2], SamplingParams(max_tokens=3, seed=1), use_tqdm=False)
    assert all(o.finished for o in out)
    assert llm.engine.block_manager.num_free_blocks == llm.engine.block_manager.num_blocks


def test_lookahead_gives_the_single_steps_tokens_on_a_real_model():
    """Positions, rope, cache slots and sampler counters advanced between lookahead steps (advance_decode):
    a tiny random Qwen3 samples the same tokens and log-probs with 5 steps per runner call as with one."""
    from barerl.config import ModelConfig
    from barerl.model.model import Model

    cfg = ModelConfig.from_dict({
        "architectures": ["Qwen3ForCausalLM"], "vocab_size": 50, "hidden_size": 32, "intermediate_size": 64,
        "num_hidden_layers": 2, "num_attention_heads": 4, "num_key_value_heads": 2, "head_dim": 8,
        "max_position_embeddings": 128,
    })
    model = Model.random(cfg, seed=0)
    params = SamplingParams(n=3, temperature=1.0, max_tokens=23, ignore_eos=True, seed=7, logprobs=True)
    prompts = [list(range(1, 6)), list(range(7, 30))]
    outputs = {}
    for steps in (1, 5):
        llm = LLM(model, block_size=4, max_model_len=64, num_scheduler_steps=steps)
        outputs[steps] = token_lists(llm.generate(prompts, params, use_tqdm=False))
    for single, ahead in zip(outputs[1], outputs[5], strict=True):
        for (tokens, logprobs), (tokens_ahead, logprobs_ahead) in zip(single, ahead, strict=True):
            assert tokens_ahead == tokens
            np.testing.assert_allclose(logprobs_ahead, logprobs, rtol=1e-5, atol=1e-6)


def test_a_continued_conversation_finds_its_blocks_and_checks_only_its_new_ids():
    llm = LLM(PagedMockModel(), **BASE)
    engine = llm.engine
    engine.start([])

    def run(request):
        engine.add(request)
        while engine.has_unfinished():
            engine.step()
        return request

    greedy = SamplingParams(temperature=0, max_tokens=3)
    turn = run(engine.new_request(None, list(range(1, 19)), greedy)).sequences[0]  # 21 tokens, 5 full blocks
    ids = turn.token_ids + [7, 8, 9, 10, 11]
    continued, by_keys = (engine.new_request(None, ids, greedy, continues=c) for c in (turn, None))
    assert continued.sequences[0].prefix_hint == turn.released_blocks and len(turn.released_blocks) == 5
    lookup = engine.block_manager.lookup
    assert lookup(continued.sequences[0]) == lookup(by_keys.sequences[0]) == [b for b, _ in turn.released_blocks]
    assert run(continued).num_cached_tokens == 20
    assert continued.sequences[0].token_ids == run(by_keys).sequences[0].token_ids
    with pytest.raises(ValueError, match=r"prompt token id 99 is outside the vocabulary"):
        engine.new_request(None, turn.token_ids + [99], greedy, continues=turn)
    with pytest.raises(TypeError, match=r"continues must be the Sequence of an earlier request, got Request"):
        engine.new_request(None, ids, greedy, continues=continued)
    other = engine.new_request(None, [5, *turn.token_ids[1:], 7], greedy, continues=turn)
    assert other.sequences[0].prefix_hint == []  # not an extension of it: found by keys alone


@pytest.mark.parametrize("max_num_seqs, warned", [(16, True), (64, False)])
def test_batch_invariant_decode_warns_when_its_pairs_cannot_fill_the_gpu(monkeypatch, max_num_seqs, warned):
    """The start-up warning runs only on CUDA: here its condition and message, with the SM count of an H100."""
    import types
    import warnings

    from barerl.ops.cuda import launch

    monkeypatch.setattr(launch, "multiprocessors", lambda: 132)
    engine = types.SimpleNamespace(
        model=types.SimpleNamespace(batch_invariant=True, device="cuda",
                                    cfg=types.SimpleNamespace(num_key_value_heads=8)),
        config=types.SimpleNamespace(max_num_seqs=max_num_seqs))
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        Engine._warn_if_invariant_decode_is_narrow(engine)
    messages = [str(w.message) for w in caught]
    if warned:  # 16 x 8 = 128 pairs < 2 x 132
        assert len(messages) == 1 and "16 sequences x 8 kv heads = 128 CTAs for 132 SMs" in messages[0]
    else:
        assert messages == []
