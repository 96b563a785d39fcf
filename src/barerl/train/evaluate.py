"""Accuracy of a model on a prompt dataset: greedy (or sampled) completions from the engine, scored by the
same reward functions GRPO uses. A reward of 1.0 counts as correct; the mean reward is reported too."""

from __future__ import annotations

import numpy as np

from barerl.engine.sampling_params import SamplingParams
from barerl.train.data import encode_prompt, is_conversational
from barerl.train.rewards import RewardRunner, load_rewards


def evaluate(llm, rows: list[dict], rewards, max_tokens: int, temperature: float = 0.0,
             max_prompt_length: int | None = None, seed: int = 0) -> dict:
    """Returns {"accuracy", "reward", "num_prompts", "completions"} over `rows` (each has a "prompt");
    `rewards` as `load_rewards` takes them (specs, callables or Reward objects)."""
    tokenizer = llm.get_tokenizer()
    prompt_ids = [encode_prompt(row["prompt"], tokenizer, max_prompt_length) for row in rows]
    params = SamplingParams(temperature=temperature, max_tokens=max_tokens, seed=seed)
    outputs = llm.generate([{"prompt_token_ids": ids} for ids in prompt_ids], params, use_tqdm=False)
    texts = [out.outputs[0].text for out in outputs]
    completions = [[{"role": "assistant", "content": t}] if is_conversational(r["prompt"]) else t
                   for r, t in zip(rows, texts)]
    columns = {key: [row.get(key) for row in rows] for key in rows[0] if key != "prompt"}
    with RewardRunner(load_rewards(rewards), num_workers=0) as runner:
        scores = runner([row["prompt"] for row in rows], completions, columns)
    total = scores.total
    return {"accuracy": float(np.mean(total >= 1.0)), "reward": float(np.mean(total)),
            "num_prompts": len(rows), "completions": texts}
