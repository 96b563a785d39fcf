"""The calculator task on the CPU in a few minutes: a tiny model made on the spot learns to use the tool.

SmolLM2-135M trains too slowly on a 2-core CPU for a before/after in minutes, so this runs the task as
`barerl demo` runs addition: a character-level tokenizer with a ChatML template (tool results in the `tool`
role), a small Qwen3-architecture model and SFT on the training questions: half of them answered with a
`<tool_call>` to `calculate`, the tool's answer and `\\boxed{value}`, the other half answered at once with
`\\boxed{value}` (which a model this size cannot compute). It leaves a model that calls the tool in about half
of its sampled answers (greedy: a fifth) and copies expressions and results imperfectly. Then multi-turn
GRPO with the real tool (calculator.py) and the math_accuracy reward. Before and after GRPO it plays the 64
test questions greedily and prints the share of episodes with a successful tool call (a call that was
well-formed and returned a value), calls per episode, and accuracy. docs/LOG.md has the figures
(2026-12-01: 20.3% -> 89.1% of episodes with a successful call, accuracy 3.1% -> 23.4%).

    OPENBLAS_NUM_THREADS=1 PYTHONPATH=src python examples/calculator/tiny.py [--sft_steps 600] [--grpo_steps 30]

The questions are the example's (train.jsonl, test.jsonl) without its system prompt: the tiny model knows
its one tool from SFT, so its template lists no tools.
"""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path

import numpy as np
from tool_accuracy import describe, tool_accuracy

HERE = Path(__file__).parent
TOOL = f"{HERE / 'calculator.py'}:calculate"
SPECIAL = ("<|endoftext|>", "<|im_start|>", "<|im_end|>")
ADDED = ("<tool_call>", "</tool_call>")
TEMPLATE = ("{% for m in messages %}<|im_start|>{{ m.role }}\n{{ m.content }}<|im_end|>\n{% endfor %}"
            "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}")


def make_tokenizer():
    """Characters (printable ASCII and newline) plus ChatML's special tokens and the tool-call tags."""
    from tokenizers import AddedToken, Regex, decoders, models, pre_tokenizers
    from tokenizers import Tokenizer as Backend

    from barerl.tokenizer import Tokenizer

    chars = [chr(c) for c in range(32, 127)] + ["\n"]
    vocab = {token: i for i, token in enumerate(SPECIAL + ADDED + tuple(chars))}
    backend = Backend(models.WordLevel(vocab, unk_token="<|endoftext|>"))
    backend.add_special_tokens(list(SPECIAL))
    backend.add_tokens([AddedToken(t, special=False, normalized=False) for t in ADDED])
    backend.pre_tokenizer = pre_tokenizers.Split(Regex("."), behavior="isolated")
    backend.decoder = decoders.Fuse()
    return Tokenizer(backend, {"eos_token": "<|im_end|>", "pad_token": "<|endoftext|>"}, chat_template=TEMPLATE,
                     source="calculator tiny", add_bos_token=False, add_eos_token=False)


def make_model(tokenizer, seed: int):
    from barerl.config import ModelConfig
    from barerl.model.model import Model

    cfg = ModelConfig.from_dict({
        "architectures": ["Qwen3ForCausalLM"], "vocab_size": tokenizer.vocab_size, "hidden_size": 128,
        "intermediate_size": 384, "num_hidden_layers": 2, "num_attention_heads": 4, "num_key_value_heads": 2,
        "head_dim": 32, "tie_word_embeddings": True, "max_position_embeddings": 256,
        "eos_token_id": tokenizer.eos_token_id, "rope_theta": 10000.0,
    }, source="calculator tiny")
    return Model.random(cfg, seed=seed)


def questions(name: str) -> list[dict]:
    """The example's rows, the question alone as the prompt."""
    rows = [json.loads(line) for line in (HERE / name).read_text().splitlines()]
    return [{"prompt": [m for m in row["prompt"] if m["role"] == "user"], "answer": row["answer"]} for row in rows]


def conversation(row: dict, use_tool: bool) -> dict:
    """An SFT example: the question, then the call, the tool's answer and the boxed result, or the boxed
    result at once."""
    answer = {"role": "assistant", "content": f"\\boxed{{{row['answer']}}}"}
    if not use_tool:
        return {"messages": row["prompt"] + [answer]}
    expression = row["prompt"][0]["content"].removeprefix("What is ").removesuffix("?")
    call = json.dumps({"name": "calculate", "arguments": {"expression": expression}})
    return {"messages": row["prompt"] + [{"role": "assistant", "content": f"<tool_call>\n{call}\n</tool_call>"},
                                         {"role": "tool", "content": row["answer"]}, answer]}


def grpo_config(output_dir: Path, steps: int, seed: int):
    from barerl.train.config import GRPOConfig

    return GRPOConfig(output_dir=str(output_dir), max_steps=steps, learning_rate=2e-4, num_generations=8,
                      per_device_train_batch_size=64, max_prompt_length=48, max_completion_length=160,
                      temperature=1.0, beta=0.0, loss_type="dapo", lr_scheduler_type="constant", save_steps=steps,
                      seed=seed, log_completions_steps=10, reward_funcs=("math_accuracy",), tools=(TOOL,),
                      max_turns=3, max_tokens_per_turn=96, max_tool_calls_per_turn=1, tool_timeout=5)


def show(when: str, result: dict) -> None:
    print(f"      {when}: {describe(result)}", flush=True)


def main(argv: list[str] | None = None) -> dict:
    from barerl.engine.llm import LLM
    from barerl.train.config import SFTConfig
    from barerl.train.grpo import train_grpo
    from barerl.train.sft import train_sft

    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sft_steps", type=int, default=600)
    parser.add_argument("--grpo_steps", type=int, default=30)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--output_dir", default="runs/calculator-tiny")
    args = parser.parse_args(argv)
    started, out = time.perf_counter(), Path(args.output_dir)
    tokenizer = make_tokenizer()
    model = make_model(tokenizer, args.seed)
    train, test = questions("train.jsonl"), questions("test.jsonl")
    cfg = grpo_config(out / "grpo", args.grpo_steps, args.seed)
    print(f"[1/3] SFT from scratch on {len(train)} questions (half with the tool), {args.sft_steps} steps", flush=True)
    sft = SFTConfig(output_dir=str(out / "sft"), max_steps=args.sft_steps, learning_rate=3e-3, warmup_steps=20,
                    lr_scheduler_type="constant", per_device_train_batch_size=32, packing=False, save_steps=0,
                    seed=args.seed, assistant_only_loss=True, max_length=256)
    sft_rows = [conversation(row, use_tool=i % 2 == 0) for i, row in enumerate(train)]
    train_sft(sft, model=model, tokenizer=tokenizer, rows=sft_rows, show_progress=False)
    llm = LLM(model, tokenizer, max_model_len=208, num_kv_blocks=1024, max_num_seqs=64, seed=args.seed)
    before = tool_accuracy(llm, tokenizer, test, cfg)
    show("after SFT", before)
    print(f"[2/3] multi-turn GRPO with the calculator tool, {args.grpo_steps} steps x 8 questions x 8 episodes",
          flush=True)
    result = train_grpo(cfg, model=model, tokenizer=tokenizer, rows=train, show_progress=False,
                        engine_args={"num_kv_blocks": 1024})
    after = tool_accuracy(llm, tokenizer, test, cfg)
    print(f"[3/3] {len(test)} test questions, greedy (train reward {np.mean(result.rewards[:3]):.2f} -> "
          f"{np.mean(result.rewards[-3:]):.2f})")
    show("after SFT ", before)
    show("after GRPO", after)
    print(f"      total time {time.perf_counter() - started:.0f}s; metrics: {out / 'grpo' / 'metrics.jsonl'}")
    return {"before": before, "after": after}


if __name__ == "__main__":
    main()
