"""Bad input: clear errors naming the field or the request, raised before anything runs (vLLM's choice), so
the rest of a batch is unaffected: the same call without the bad request gives what it would have given."""

import pytest
from engine_helpers import CharTokenizer, PagedMockModel

from barerl import LLM, SamplingParams

BASE = {"block_size": 4, "max_model_len": 32}


def token_ids(outputs):
    return [[c.token_ids for c in o.outputs] for o in outputs]


@pytest.mark.parametrize(("kwargs", "message"), [
    ({"n": 0}, r"SamplingParams.n: must be an integer >= 1, got 0"),
    ({"temperature": -0.5}, r"temperature: must be a finite number >= 0"),
    ({"temperature": float("nan")}, r"temperature: must be a finite number >= 0 \(0 means greedy\), got nan"),
    ({"temperature": float("inf")}, r"temperature: must be a finite number >= 0 \(0 means greedy\), got inf"),
    ({"top_p": 0.0}, r"top_p: must be in \(0, 1\]"),
    ({"top_p": 1.5}, r"top_p: must be in \(0, 1\]"),
    ({"top_k": -2}, r"top_k: must be an integer >= -1"),
    ({"min_p": 1.5}, r"min_p: must be in \[0, 1\]"),
    ({"max_tokens": 0}, r"max_tokens: must be an integer >= 1"),
    ({"min_tokens": 5, "max_tokens": 3}, r"min_tokens: must be <= max_tokens"),
    ({"stop": ["ok", ""]}, r"stop: must be a non-empty string"),
    ({"stop": 123}, r"SamplingParams.stop: must be a string or a list of strings, got 123"),
    ({"stop_token_ids": 5}, r"SamplingParams.stop_token_ids: must be a list of token ids, got 5"),
    ({"stop_token_ids": [-1]}, r"stop_token_ids: must be a list of token ids"),
    ({"logprobs": -1}, r"logprobs: must be a bool"),
])
def test_sampling_params_validation(kwargs, message):
    with pytest.raises(ValueError, match=message):
        SamplingParams(**kwargs)


@pytest.mark.parametrize(("bad_prompt", "message"), [
    ([], r"request 1: empty prompt"),
    (list(range(1, 40)), r"request 1: the prompt has 39 tokens, more than max_model_len=32"),
    ([3, 99], r"request 1: prompt token id 99 is outside the vocabulary \[0, 32\)"),
    ("text", r"request 1: a text prompt needs a tokenizer"),
    ({"text": "x"}, r"request 1: a prompt is a str, a list of token ids or a dict"),
])
def test_a_bad_request_raises_before_running_and_leaves_the_rest_unaffected(bad_prompt, message):
    good = [[1, 2, 3], [4, 5]]
    params = SamplingParams(n=2, max_tokens=5)  # unseeded: seeds come from the engine's generator
    llm = LLM(PagedMockModel(), **BASE)
    with pytest.raises(ValueError, match=message):
        llm.generate([good[0], bad_prompt, good[1]], params, use_tqdm=False)
    assert not llm.engine.scheduler.has_unfinished()
    after = llm.generate(good, params, use_tqdm=False)
    fresh = LLM(PagedMockModel(), **BASE).generate(good, params, use_tqdm=False)
    assert token_ids(after) == token_ids(fresh)


def test_per_request_params_errors_name_the_request():
    llm = LLM(PagedMockModel(), **{**BASE, "max_num_seqs": 4})
    with pytest.raises(ValueError, match=r"request 1: n=5 is more than max_num_seqs=4"):
        llm.generate([[1], [2]], [SamplingParams(), SamplingParams(n=5)], use_tqdm=False)
    with pytest.raises(ValueError, match=r"request 0: stop strings need a tokenizer"):
        llm.generate([[1]], SamplingParams(stop="x"), use_tqdm=False)
    with pytest.raises(ValueError, match=r"request 0: stop token id 40 is outside the vocabulary"):
        llm.generate([[1]], SamplingParams(stop_token_ids=[40]), use_tqdm=False)
    with pytest.raises(TypeError, match=r"request 0: sampling params must be a SamplingParams"):
        llm.generate([[1]], [{"temperature": 0}], use_tqdm=False)
    with pytest.raises(ValueError, match=r"got 2 prompts but 1 sampling params"):
        llm.generate([[1], [2]], [SamplingParams()], use_tqdm=False)
    with pytest.raises(ValueError, match=r"prompts must be a non-empty list, got int"):
        llm.generate(42, use_tqdm=False)
    with pytest.raises(ValueError, match=r"request 0: empty prompt"):
        llm.generate([], use_tqdm=False)  # [] reads as one prompt of no tokens


def test_empty_text_prompt_with_a_tokenizer():
    llm = LLM(PagedMockModel(), tokenizer=CharTokenizer(), **BASE)
    with pytest.raises(ValueError, match=r"request 0: empty prompt"):
        llm.generate("", use_tqdm=False)


@pytest.mark.parametrize(("kwargs", "message"), [
    ({"num_kv_blocks": 4}, r"the KV cache holds 4 blocks x 4 tokens, fewer than max_model_len=32"),
    ({"max_num_seqs": 0}, r"max_num_seqs must be a positive integer"),
    ({"gpu_memory_utilization": 1.5}, r"gpu_memory_utilization must be in \(0, 1\]"),
    ({"async_scheduling": "false"}, r"async_scheduling must be True or False, got 'false'"),
    ({"enforce_eager": 1}, r"enforce_eager must be True or False"),
    ({"batch_invariant": "yes"}, r"batch_invariant must be True or False"),
    ({"enable_chunked_prefill": False, "max_num_batched_tokens": 8}, r"needs enable_chunked_prefill=True"),
])
def test_engine_config_errors(kwargs, message):
    with pytest.raises(ValueError, match=message):
        LLM(PagedMockModel(), **{**BASE, **kwargs})
