"""The engine on real models: greedy outputs equal transformers' greedy `generate` token for token (tiny
random models of each family, and SmolLM2-135M-Instruct); scheduling changes nothing; in-place weight
updates show in the next call."""

import numpy as np
import pytest

from barerl import LLM, SamplingParams
from barerl.model.model import Model

torch = pytest.importorskip("torch")

PROMPTS = [[5, 17, 3, 88, 41], [9, 9, 60, 2, 71, 33, 14, 50, 6, 77, 12], list(range(20, 37))]
GREEDY = SamplingParams(temperature=0, max_tokens=20, ignore_eos=True)


def hf_greedy(torch_model, prompt, max_new_tokens):
    torch_model.generation_config.eos_token_id = None  # run the full length, as ignore_eos does
    with torch.no_grad():
        out = torch_model.generate(torch.tensor([prompt]), max_new_tokens=max_new_tokens, do_sample=False,
                                   pad_token_id=0)
    return out[0, len(prompt):].tolist()


def test_greedy_equals_transformers(tiny_hf_model, tiny_hf_family, tmp_path):
    folder, torch_model = tiny_hf_model(tiny_hf_family, tmp_path)
    llm = LLM(Model.from_pretrained(folder), block_size=4, max_model_len=64, max_num_batched_tokens=16)
    outputs = llm.generate(PROMPTS, GREEDY, use_tqdm=False)
    for prompt, out in zip(PROMPTS, outputs):
        assert out.outputs[0].token_ids == hf_greedy(torch_model, prompt, 20)


ENGINE_CONFIGS = [
    {"max_num_seqs": 1, "enable_prefix_caching": False, "enable_chunked_prefill": False},
    {"max_num_seqs": 64, "max_num_batched_tokens": 7},
    {"num_kv_blocks": 16},  # forces preemption
]


def completions(outputs):
    return [c for o in outputs for c in o.outputs]


@pytest.mark.parametrize("n", [1, 3])
def test_scheduling_does_not_change_sampled_outputs(tiny_hf_model, tmp_path, n):
    folder, _ = tiny_hf_model("qwen3", tmp_path)
    model = Model.from_pretrained(folder)
    shared = [7, 8, 9, 10, 11, 12, 13, 14]
    prompts = [*PROMPTS, shared + [1, 2], shared + [3]]
    params = SamplingParams(n=n, temperature=1.0, top_p=0.95, max_tokens=12, seed=11, logprobs=True)
    results = []
    for config in ENGINE_CONFIGS:
        config = {**config, "max_num_seqs": max(config.get("max_num_seqs", 64), n)}
        llm = LLM(model, block_size=4, max_model_len=64, **config)
        results.append(completions(llm.generate(prompts, params, use_tqdm=False)))
        if "num_kv_blocks" in config:
            assert llm.stats["num_preemptions"] > 0
    for outputs in results[1:]:
        for want, got in zip(results[0], outputs):
            assert got.token_ids == want.token_ids
            np.testing.assert_allclose(got.logprobs, want.logprobs, rtol=1e-4, atol=1e-5)


def test_in_place_weight_update_shows_in_the_next_generate(tiny_hf_model, tmp_path):
    folder, _ = tiny_hf_model("llama3", tmp_path)
    model = Model.from_pretrained(folder)
    llm = LLM(model, block_size=4, max_model_len=64)
    before = llm.generate(PROMPTS, GREEDY, use_tqdm=False)
    rng = np.random.default_rng(0)
    model.params.flat[...] += rng.normal(0, 0.05, model.params.flat.shape).astype(model.params.flat.dtype)
    after = llm.generate(PROMPTS, GREEDY, use_tqdm=False)
    updated = Model.from_pretrained(folder)
    updated.params.flat[...] = model.params.flat
    fresh = LLM(updated, block_size=4, max_model_len=64).generate(PROMPTS, GREEDY, use_tqdm=False)
    assert [o.outputs[0].token_ids for o in after] == [o.outputs[0].token_ids for o in fresh]
    assert [o.outputs[0].token_ids for o in after] != [o.outputs[0].token_ids for o in before]


def test_sleep_and_wake_on_a_real_model(tiny_hf_model, tmp_path):
    folder, _ = tiny_hf_model("qwen2", tmp_path)
    llm = LLM(Model.from_pretrained(folder), block_size=4, max_model_len=64)
    before = llm.generate(PROMPTS, GREEDY, use_tqdm=False)
    llm.sleep()
    llm.wake()
    after = llm.generate(PROMPTS, GREEDY, use_tqdm=False)
    assert [o.outputs[0].token_ids for o in after] == [o.outputs[0].token_ids for o in before]


CONVERSATIONS = [
    [{"role": "user", "content": "What is the capital of France?"}],
    [{"role": "system", "content": "You are a helpful assistant."},
     {"role": "user", "content": "Write a haiku about the sea."}],
]


def test_smollm2_chat_equals_transformers(smollm2_gguf_path, smollm2_hf_model):
    llm = LLM(smollm2_gguf_path, max_model_len=256)
    outputs = llm.chat(CONVERSATIONS, SamplingParams(temperature=0, max_tokens=20), use_tqdm=False)
    for out in outputs:
        with torch.no_grad():
            prompt = torch.tensor([out.prompt_token_ids])
            hf = smollm2_hf_model.generate(prompt, max_new_tokens=20, do_sample=False)
        expected = hf[0, len(out.prompt_token_ids):].tolist()
        completion = out.outputs[0]
        assert completion.token_ids == expected
        assert completion.text == llm.tokenizer.decode(expected, skip_special_tokens=True)
        assert completion.text.strip()
