"""RL fidelity at scale, on the GPU: with `batch_invariant`, the engine's sampling log-probs equal the trainer's
packed forward's at the Qwen3-4B shape and at 16K-token contexts, full depth, random bf16 weights.

The engine generates (decode in CUDA graphs; at 16K the prompt is prefilled in two chunks, the second against
the first's cached keys, and its samples share its blocks); the trainer's forward then recomputes every
completion token's log-prob inside one packed batch of all the sequences, as a GRPO micro-batch does. Each test
prints the mismatch (max, mean, p99 of |trainer - engine| over every completion token); the bound is the fp32
log-softmax's summation order (~1e-6; R1 measured 1.9e-6 max over 65,536 tokens, bench/RESULTS.md).
"""

from __future__ import annotations

import numpy as np
import pytest

from barerl.config import ModelConfig

pytestmark = pytest.mark.gpu

QWEN3 = {"architectures": ["Qwen3ForCausalLM"], "vocab_size": 151936, "num_key_value_heads": 8, "head_dim": 128,
         "rms_norm_eps": 1e-6, "rope_theta": 1e6, "max_position_embeddings": 40960, "tie_word_embeddings": True}
CASES = {  # shape (config.json of the model), prompts, samples, prompt tokens, new tokens
    "qwen3-4b, 8 x 8 x (256 + 256)": ({"hidden_size": 2560, "intermediate_size": 9728, "num_hidden_layers": 36,
                                        "num_attention_heads": 32}, 8, 8, 256, 256),
    "qwen3-1.7b, 2 x 2 x (16,128 + 256)": ({"hidden_size": 2048, "intermediate_size": 6144, "num_hidden_layers": 28,
                                             "num_attention_heads": 16}, 2, 2, 16128, 256),
}


@pytest.mark.parametrize("case", list(CASES))
def test_engine_and_trainer_log_probs_agree(case):
    from barerl import LLM, SamplingParams
    from barerl.model.batch import PackedBatch
    from barerl.model.model import Model
    from barerl.train.losses import logprob_mismatch

    shape, prompts, samples, prompt_len, new_tokens = CASES[case]
    cfg = ModelConfig.from_dict({**QWEN3, **shape})
    model = Model.random(cfg, "cuda", "bfloat16", seed=0, batch_invariant=True)  # the engine's and the trainer's
    llm = LLM(model, max_num_seqs=prompts * samples, max_model_len=prompt_len + new_tokens, gpu_memory_utilization=0.5)
    rng = np.random.default_rng(0)
    prompt_ids = rng.integers(0, cfg.vocab_size, (prompts, prompt_len)).tolist()
    params = SamplingParams(n=samples, temperature=1.0, max_tokens=new_tokens, ignore_eos=True, logprobs=True,
                            seed=1)
    outputs = llm.generate(prompt_ids, params, use_tqdm=False)
    sequences, engine = [], []
    for prompt, output in zip(prompt_ids, outputs):
        for sample in output.outputs:
            sequences.append(prompt + list(sample.token_ids))
            engine.append(sample.logprobs)
    batch = PackedBatch.from_sequences(sequences)
    trainer, _ = model.logprobs(batch)
    engine_logp = np.zeros(batch.num_tokens, np.float32)
    mask = np.zeros(batch.num_tokens, np.float32)
    for start, logps in zip(batch.cu_seqlens[:-1], engine):
        first = start + prompt_len - 1  # the target of position prompt_len - 1 is the first completion token
        engine_logp[first : first + len(logps)] = logps
        mask[first : first + len(logps)] = 1
    stats = logprob_mismatch(model.xp.asarray(engine_logp), trainer, model.xp.asarray(mask))
    print(f"mismatch, {case}: max {stats['max']:.2e}, mean {stats['mean']:.2e}, p99 {stats['p99']:.2e}, "
          f"KL {stats['kl']:.1e} over {int(mask.sum())} completion tokens")
    assert stats["max"] < 1e-5, stats
