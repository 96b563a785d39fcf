"""Workload R1 (one GRPO step) on barerl: the Qwen3-0.6B architecture with random bf16 weights, 8 prompts x 8
samples, 128-token prompts, 1,024-token completions (random weights almost never emit EOS), a cheap reward,
then T1's training on them (64 sequences, micro-batches of 16, recomputation, AdamW), one update per step.

barerl's loop runs as a user runs it (`train_grpo`), in its default setting unless told otherwise
(`batch_invariant` on, optimizer resident). Timing, the same on both sides (peer: grpo_trl.py): the wall
clock between the ends of consecutive steps by the trainer's own clock (metrics.jsonl's cumulative `time`),
so everything in a step counts (engine wake and sleep, offload, generation, scoring, packing, training,
logging); the first step also compiles kernels and captures graphs, so the figure is the median of the later
steps. Recorded too: the phases (generate / score / train) from metrics.jsonl, completion lengths, the
engine/trainer log-prob mismatch over all completion tokens of the step, peak device memory
(common.DeviceMemory) beside the trainer's own reading (CuPy's pool + KV cache + graph pool), and the cold
start: seconds from process start to the end of the first step.

    PYTHONPATH=src python bench/grpo_barerl.py [--steps 3] [--batch-invariant on|off] [--quick] [--out DIR]
        [--offload-optimizer [RATIO]] [--keep attention,linear] [--num-scheduler-steps 8] [--micro-batch 16]
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import tempfile
from pathlib import Path

import numpy as np
from common import (
    PROMPT_LEN,
    DeviceMemory,
    caches_at_start,
    cheap_reward,
    model_shape,
    numbered_tokenizer,
    prompt_rows,
    since_process_start,
    write_record,
)

NEW_TOKENS, QUICK_LENGTHS = 1024, (16, 16)  # completion length; (prompt, completion) of the CPU smoke test


def barerl_api():
    """barerl's entry points used here (one place, for the layout move)."""
    from barerl.config import ModelConfig
    from barerl.model.model import Model
    from barerl.train import metrics
    from barerl.train.config import GRPOConfig
    from barerl.train.grpo import train_grpo

    return ModelConfig, Model, GRPOConfig, train_grpo, metrics.MetricsLogger


def stamp_first_log() -> dict:
    """Seconds from process start to the trainer's first log line (the end of its first step)."""
    *_, MetricsLogger = barerl_api()
    stamps: dict = {}
    log = MetricsLogger.log

    def stamped(self, step, metrics):
        record = log(self, step, metrics)
        stamps.setdefault("first_step_end_s", since_process_start())
        return record
    MetricsLogger.log = stamped
    return stamps


def describe(args) -> tuple[str, str, dict]:
    """The record's name, its label (the setting in words) and its settings."""
    settings = {"weights": args.model or "random (seed 0)", "batch_invariant": args.batch_invariant, "offload_optimizer": args.offload_optimizer,
                "gradient_checkpointing_keep": args.keep, "num_scheduler_steps": args.num_scheduler_steps,
                "micro_batch": args.micro_batch, "loss_type": "dapo", "beta": 0.0, "learning_rate": 1e-6}
    parts = []  # (name part, words), each only where the setting is not the default
    if args.batch_invariant != "on":
        parts.append((f"batch-invariant-{args.batch_invariant}", f"batch_invariant {args.batch_invariant}"))
    if args.offload_optimizer is not None:
        parts.append((f"offload-{args.offload_optimizer:g}", f"optimizer offloaded ({args.offload_optimizer:g})"))
    if args.keep != "attention":
        parts.append((f"keep-{args.keep.replace(',', '-')}", f"keeps {args.keep}"))
    if args.num_scheduler_steps != 8:
        parts.append((f"lookahead-{args.num_scheduler_steps}", f"{args.num_scheduler_steps} decode steps a launch"))
    if args.micro_batch != 16:
        parts.append((f"micro-{args.micro_batch}", f"micro-batches of {args.micro_batch}"))
    name = "-".join(["barerl", *(p for p, _ in parts)])
    return name, ", ".join(w for _, w in parts) or "default (batch_invariant on)", settings


def run(args, num_prompts: int = 8, output_dir: Path | None = None, overrides: dict | None = None,
        shape: dict | None = None) -> list[dict] | None:
    """The run's metrics.jsonl records; `num_prompts` per step in all (under mpirun, shared by the ranks:
    bench_data_parallel.py), `overrides` of the config, `shape` the random model's config.json (default:
    Qwen3-0.6B's; --quick's tiny one always). None on ranks other than the first (which logs)."""
    from barerl.distributed import process_group

    ModelConfig, Model, GRPOConfig, train_grpo, _ = barerl_api()
    shape = model_shape(args.quick) if shape is None or args.quick else shape
    prompt_len, new_tokens = QUICK_LENGTHS if args.quick else (PROMPT_LEN, NEW_TOKENS)
    device, dtype = ("cpu", "float32") if args.quick else ("cuda", "bfloat16")
    if args.model:  # make_model.py's folder, which the peer loads too
        model = Model.from_pretrained(args.model, device=device, dtype=dtype)
    else:
        model = Model.random(ModelConfig.from_dict(shape, source="Qwen3-0.6B shape"), device=device, dtype=dtype, seed=0)
    cfg = model.cfg
    out = output_dir or Path(tempfile.mkdtemp(prefix="r1-"))
    micro, ratio = args.micro_batch, args.offload_optimizer
    config = GRPOConfig(
        output_dir=str(out), max_steps=args.steps, num_generations=8, per_device_train_batch_size=micro,
        gradient_accumulation_steps=64 // micro, max_prompt_length=prompt_len, max_completion_length=new_tokens,
        temperature=1.0, learning_rate=1e-6, lr_scheduler_type="constant", gradient_checkpointing=True,
        max_tokens_per_microbatch=micro * (prompt_len + new_tokens), loss_type="dapo", beta=0.0, save_steps=0,
        log_completions_steps=0, seed=0, shuffle_dataset=False, offload_optimizer=ratio is not None,
        offload_optimizer_ratio=ratio or 1.0, gradient_checkpointing_keep=tuple(args.keep.split(",")),
        batch_invariant=args.batch_invariant == "on",
    )
    config = dataclasses.replace(config, **(overrides or {}))
    train_grpo(config, model=model, tokenizer=numbered_tokenizer(cfg.vocab_size),
               rows=prompt_rows(cfg.vocab_size, num_prompts * args.steps, prompt_len), reward_funcs=[cheap_reward],
               show_progress=False, engine_args={"num_scheduler_steps": args.num_scheduler_steps})
    if not process_group().is_main:
        return None
    return [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]


def summarize(records: list[dict]) -> dict:
    ends = [r["time"] for r in records]
    steps = np.diff([0.0, *ends]).tolist()  # the first includes the engine's first graphs and the kernels' compiles
    later = records[1:] or records
    median = lambda key: float(np.median([r[key] for r in later]))
    metrics = {"step_s": float(np.median(steps[1:] or steps)), "step_s_each": steps,
               **{key: median(f"time/{key}") for key in ("generate", "score", "train")},
               "completion_mean_length": median("completions/mean_length"),
               "completion_min_length": min(r["completions/min_length"] for r in later),
               "completion_max_length": max(r["completions/max_length"] for r in later),
               "completion_tokens": median("completions/mean_length") * 64,
               "trained_tokens": median("num_tokens"),
               "mismatch_max": max(r["mismatch/max"] for r in later),
               **{f"mismatch_{key}": median(f"mismatch/{key}") for key in ("mean", "p99", "kl")}}
    for key, metric in (("trainer_peak_gib", "gpu_gib"), ("trainer_generate_gib", "generate_gib"),
                        ("trainer_train_gib", "train_gib"), ("trainer_used_gib", "gpu_used_gib")):
        metrics[key] = max(r[f"memory/{metric}"] for r in records)  # zeros on the CPU
    return metrics


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default=None, help="a folder written by make_model.py (default: random weights)")
    parser.add_argument("--steps", type=int, default=3, help="GRPO steps; the first is a warm-up")
    parser.add_argument("--quick", action="store_true", help="a tiny model and short sequences on the CPU")
    parser.add_argument("--batch-invariant", default="on", choices=("on", "off"), help="GRPO's batch_invariant")
    parser.add_argument("--offload-optimizer", type=float, nargs="?", const=1.0, default=None, metavar="RATIO",
                        help="GRPO's offload_optimizer; RATIO (default 1): offload_optimizer_ratio")
    parser.add_argument("--keep", default="attention", metavar="OPS", help="gradient_checkpointing_keep")
    parser.add_argument("--num-scheduler-steps", type=int, default=8, help="engine decode steps per graph launch")
    parser.add_argument("--micro-batch", type=int, default=16, choices=(1, 2, 4, 8, 16, 32, 64))
    parser.add_argument("--out", default=None, help="folder for the JSON record")
    return parser


def main() -> None:
    args = build_parser().parse_args()

    caches = caches_at_start()
    memory = DeviceMemory().start()
    stamps = stamp_first_log()
    metrics = summarize(run(args))
    metrics.update(peak_gib=memory.peak_gib(), cold_start_first_step_end_s=stamps.get("first_step_end_s"),
                   caches_at_start=caches)
    memory.stop()
    name, label, settings = describe(args)
    print(f"R1 {name}: {metrics['step_s']:.2f} s/step (steps {', '.join(f'{s:.2f}' for s in metrics['step_s_each'])};"
          f" generate {metrics['generate']:.2f}, train {metrics['train']:.2f}), mismatch max "
          f"{metrics['mismatch_max']:.2e}, mean {metrics['mismatch_mean']:.2e}, cold start to the first step's end "
          f"{metrics['cold_start_first_step_end_s']:.1f} s", flush=True)
    write_record(args.out, name, "R1", "barerl", label, settings, metrics)


if __name__ == "__main__":
    main()
