"""Multi-turn GRPO end to end on the tiny chat model: episodes' metrics and the per-turn mismatch are logged,
an environment's rewards need no reward function, a resumed run equals the uninterrupted one, and on the
GPU with batch_invariant the mismatch stays at the single-turn level over 4-turn episodes."""

import json
import os

import numpy as np
import pytest

from barerl.model.model import Model
from barerl.train.config import GRPOConfig
from barerl.train.environments import Environment, Observation
from barerl.train.grpo import train_grpo

ROWS = [{"prompt": f"Count to {i}."} for i in range(8)]


class FourTurns(Environment):
    """Asks for more three times; the last turn's reward is the share of distinct characters in it."""

    def reset(self, row):
        self.turns = 0
        return [{"role": "user", "content": row["prompt"]}]

    def step(self, text):
        self.turns += 1
        if self.turns == 4:
            return Observation(done=True, reward=len(set(text)) / max(len(text), 1))
        return Observation([{"role": "user", "content": "More."}])


def config(tmp_path, **kw) -> GRPOConfig:
    base = {"output_dir": str(tmp_path), "max_steps": 2, "learning_rate": 1e-3, "num_generations": 4,
            "per_device_train_batch_size": 8, "max_prompt_length": 32, "max_completion_length": 128,
            "environment_factory": "tests.train.test_multi_turn_grpo:FourTurns", "max_turns": 5,
            "max_tokens_per_turn": 8, "lr_scheduler_type": "constant", "save_steps": 0, "seed": 7,
            "log_completions_steps": 0}
    return GRPOConfig(**{**base, **kw})


def run(cfg, model, tokenizer, num_kv_blocks=512):
    return train_grpo(cfg, model=model, tokenizer=tokenizer, rows=ROWS, show_progress=False,
                      engine_args={"num_kv_blocks": num_kv_blocks})


def metrics(output_dir) -> list[dict]:
    with open(os.path.join(output_dir, "metrics.jsonl")) as f:
        rows = [json.loads(line) for line in f]
    return [{k: v for k, v in r.items() if not k.startswith("time") and "per_second" not in k} for r in rows]


def test_multi_turn_grpo_logs_its_episodes_and_resumes_as_if_never_stopped(tmp_path, chat_model, chat_tokenizer):
    def go(folder, steps, resume=None):
        return run(config(folder, max_steps=steps, save_steps=2, resume_from_checkpoint=resume), chat_model(),
                   chat_tokenizer)

    full = go(tmp_path / "full", 3)
    with open(tmp_path / "full" / "metrics.jsonl") as f:
        records = [json.loads(line) for line in f]
    for r in records:
        assert r["rewards/environment/mean"] == r["reward"] > 0  # the environment's reward alone
        assert r["episodes/turns_mean"] >= 3 and r["engine/prefix_cache_hit_rate"] == 1.0
        assert r["episodes/environment_tokens_mean"] > 0 and r["tools/call_frequency"] == 0
        for k in range(3):
            assert r[f"mismatch/turn_{k}_max"] < 1e-4  # fp32 on the CPU: engine and trainer run the same ops
        assert 0 <= r["time/gpu_idle_share"] < 1 and r["time/environment"] >= 0 and r["time/engine"] > 0
    go(tmp_path / "cut", 2)
    resumed = go(tmp_path / "cut", 3, resume="latest")
    assert metrics(tmp_path / "cut") == metrics(tmp_path / "full")  # bit for bit: the CPU loop is deterministic
    weights = [Model.from_pretrained(r.checkpoint).params.flat for r in (full, resumed)]
    np.testing.assert_array_equal(weights[0], weights[1])


@pytest.mark.gpu
def test_batch_invariant_multi_turn_mismatch_stays_at_the_single_turn_level(tmp_path, chat_model, chat_tokenizer):
    """bf16 on the GPU with batch_invariant: continued turns' prefill against the cached earlier turns and
    their decode steps give the trainer's log-probs to ~1e-6 in every turn of 4-turn episodes."""
    cfg = config(tmp_path, device="cuda", dtype="bfloat16", batch_invariant=True, max_tokens_per_turn=48,
                 max_completion_length=320, num_generations=8, per_device_train_batch_size=64)
    run(cfg, chat_model(device="cuda", dtype="bfloat16"), chat_tokenizer, num_kv_blocks=4096)
    with open(tmp_path / "metrics.jsonl") as f:
        records = [json.loads(line) for line in f]
    for r in records:
        assert r["episodes/turns_mean"] >= 4, r["episodes/turns_mean"]
        assert r["engine/prefix_cache_hit_rate"] == 1.0
        turns = [r[f"mismatch/turn_{k}_max"] for k in range(4)]
        assert max(turns) < 1e-5 and r["mismatch/max"] < 1e-5, turns
