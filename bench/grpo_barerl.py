"""Workloads R1, R2, R3 and L1 (one GRPO step) on barerl, random bf16 weights (sizes: shapes.py): the engine's
rollouts (random weights almost never emit EOS), a cheap reward, then training on them (recomputation, AdamW),
one update per step. R1: Qwen3-0.6B, 8 prompts x 8 samples, 128 + 1,024 tokens, micro-batches of 16; R2:
Qwen3-4B, 8 x 8, 256 + 4,096, micro-batches of 4; R3: Qwen3-8B, 8 x 8, 256 + 2,048, micro-batches of 4, 10% of the
optimizer state streamed from host memory; L1: Qwen3-1.7B, 4 x 4, 256 + 16,384, one completion per pass.
`--shape` runs a workload's sizes on another model shape.

barerl's loop runs as a user runs it (`train_grpo`, no checkpoints: R3's would not fit the disk), in its default
setting unless told otherwise (`batch_invariant` on, the workload's optimizer placement). Timing, the same on
both sides (peer: grpo_trl.py): the wall clock between the ends of consecutive steps by the trainer's own clock
(metrics.jsonl's cumulative `time`), so everything in a step counts (engine wake and sleep, offload, generation,
scoring, packing, training, logging); the first step also compiles kernels and captures graphs, so the figure is
the median of the later steps. Recorded too: the phases (generate / score / train) from metrics.jsonl,
completion lengths, the engine/trainer log-prob mismatch over all completion tokens of the step, peak device
memory (common.DeviceMemory) beside the trainer's own reading (CuPy's pool + KV cache + graph pool) and the
memory plan's, the cold start (seconds from process start to the end of the first step), and on the GPU the
step's floor (decode at the copy bandwidth plus training at the matrix rate, both measured after the run), the
training phase's MFU and, with the optimizer offloaded, the host link's rate. A run that does not fit is
recorded as such (common.write_failure).

    PYTHONPATH=src python bench/grpo_barerl.py [--workload R1|R2|R3|L1] [--shape SHAPE] [--steps 3]
        [--batch-invariant on|off] [--quick] [--out DIR] [--model DIR] [--offload-optimizer [RATIO]]
        [--keep attention,linear] [--num-scheduler-steps 8] [--micro-batch N]
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import sys
import tempfile
from pathlib import Path

import numpy as np
from common import (
    DeviceMemory,
    caches_at_start,
    ceilings,
    cheap_reward,
    check_model_folder,
    gib,
    host_link_gbs,
    numbered_tokenizer,
    prompt_rows,
    since_process_start,
    write_failure,
    write_record,
)
from shapes import (
    GRPO,
    SHAPES,
    Grpo,
    decode_floor_seconds,
    model_config,
    shape_dict,
    training_flops,
    training_utilisation,
    utilisation_words,
    workload,
)


def barerl_api():
    """barerl's entry points used here (one place, for the layout move)."""
    from barerl.model.model import Model
    from barerl.train import metrics
    from barerl.train.config import GRPOConfig
    from barerl.train.grpo import train_grpo
    from barerl.train.memory_plan import plan_training

    return Model, GRPOConfig, train_grpo, metrics.MetricsLogger, plan_training


def stamp_first_log() -> dict:
    """Seconds from process start to the trainer's first log line (the end of its first step)."""
    MetricsLogger = barerl_api()[3]
    stamps: dict = {}
    log = MetricsLogger.log

    def stamped(self, step, metrics):
        record = log(self, step, metrics)
        stamps.setdefault("first_step_end_s", since_process_start())
        return record
    MetricsLogger.log = stamped
    return stamps


def resolve(args) -> tuple[str, Grpo]:
    """The workload's record name and sizes, with --shape, --quick, --micro-batch and --offload-optimizer."""
    key, work = workload(GRPO, args.workload, args.shape, args.quick)
    if args.micro_batch:
        work = dataclasses.replace(work, micro_batch=args.micro_batch)
    if args.offload_optimizer is not None:
        work = dataclasses.replace(work, offload=args.offload_optimizer)
    return key, work


def grpo_config(work: Grpo, output_dir: str, steps: int = 3, keep: tuple[str, ...] = ("attention",),
                batch_invariant: bool = True, lora_r: int = 0):
    """The GRPOConfig this script runs for `work` (memory_plans.py plans it too); `lora_r` > 0: LoRA adapters of
    that rank on every linear layer (lora_alpha 2 r), the base frozen."""
    GRPOConfig = barerl_api()[1]
    micro, length = work.micro_batch, work.prompt_len + work.completion_len
    return GRPOConfig(
        output_dir=output_dir, max_steps=steps, num_generations=work.samples, per_device_train_batch_size=micro,
        gradient_accumulation_steps=work.completions // micro, max_prompt_length=work.prompt_len,
        max_completion_length=work.completion_len, temperature=1.0, learning_rate=1e-6, lr_scheduler_type="constant",
        gradient_checkpointing=True, max_tokens_per_microbatch=micro * length, loss_type="dapo", beta=0.0,
        save_strategy="no", log_completions_steps=0, seed=0, shuffle_dataset=False,
        offload_optimizer=work.offload is not None, offload_optimizer_ratio=work.offload or 1.0,
        gradient_checkpointing_keep=keep, batch_invariant=batch_invariant,
        lora_r=lora_r, lora_alpha=2.0 * lora_r if lora_r else 32.0, lora_target_modules=("all-linear",),
    )


def describe(args, work: Grpo) -> tuple[str, str, dict]:
    """The record's name, its label (the setting in words) and its settings."""
    preset = GRPO[args.workload]
    settings = {"weights": args.model or "random (seed 0)", "batch_invariant": args.batch_invariant,
                "offload_optimizer": work.offload, "gradient_checkpointing_keep": args.keep,
                "num_scheduler_steps": args.num_scheduler_steps, "micro_batch": work.micro_batch, "loss_type": "dapo",
                "beta": 0.0, "learning_rate": 1e-6, "lora_r": args.lora_r}
    parts = []  # (name part, words), each only where the setting is not the workload's default
    if args.lora_r:
        parts.append((f"lora-r{args.lora_r}", f"LoRA r={args.lora_r} all-linear"))
    if args.batch_invariant != "on":
        parts.append((f"batch-invariant-{args.batch_invariant}", f"batch_invariant {args.batch_invariant}"))
    if work.offload != preset.offload:  # --offload-optimizer RATIO, not the workload's own
        parts.append((f"offload-{work.offload:g}", f"optimizer offloaded ({work.offload:g})"))
    if args.keep != "attention":
        parts.append((f"keep-{args.keep.replace(',', '-')}", f"keeps {args.keep}"))
    if args.num_scheduler_steps != 8:
        parts.append((f"lookahead-{args.num_scheduler_steps}", f"{args.num_scheduler_steps} decode steps a launch"))
    if work.micro_batch != preset.micro_batch:
        parts.append((f"micro-{work.micro_batch}", f"micro-batches of {work.micro_batch}"))
    name = "-".join(["barerl", *(p for p, _ in parts)])
    offloaded = f", {preset.offload:g} of the optimizer state offloaded" if preset.offload else ""
    return name, ", ".join(w for _, w in parts) or f"default (batch_invariant on{offloaded})", settings


def run(args, num_prompts: int | None = None, output_dir: Path | None = None,
        overrides: dict | None = None) -> list[dict] | None:
    """The run's metrics.jsonl records; `num_prompts` per step in all (default: the workload's; under mpirun,
    shared by the ranks: bench_data_parallel.py), `overrides` of the config. None on ranks other than the first
    (which logs)."""
    from barerl.distributed import process_group

    Model, _, train_grpo, _, _ = barerl_api()
    key, work = resolve(args)
    device, dtype = ("cpu", "float32") if args.quick else ("cuda", "bfloat16")
    if args.model:  # make_model.py's folder, which the peer loads too
        check_model_folder(args.model, shape_dict(work.shape, args.quick))
        model = Model.from_pretrained(args.model, device=device, dtype=dtype)
    else:
        model = Model.random(model_config(work.shape, args.quick), device=device, dtype=dtype, seed=0)
    cfg = model.cfg
    out = output_dir or Path(tempfile.mkdtemp(prefix=f"{key.lower()}-"))
    config = grpo_config(work, str(out), args.steps, tuple(args.keep.split(",")), args.batch_invariant == "on",
                         args.lora_r)
    config = dataclasses.replace(config, **(overrides or {}))
    num_prompts = num_prompts or work.prompts
    train_grpo(config, model=model, tokenizer=numbered_tokenizer(cfg.vocab_size),
               rows=prompt_rows(cfg.vocab_size, num_prompts * args.steps, work.prompt_len),
               reward_funcs=[cheap_reward], show_progress=False,
               engine_args={"num_scheduler_steps": args.num_scheduler_steps})
    if not process_group().is_main:
        return None
    return [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]


def summarize(records: list[dict], completions: int = 64) -> dict:
    """The step's figures from metrics.jsonl (`completions` per step: R1's 64 unless told)."""
    ends = [r["time"] for r in records]
    steps = np.diff([0.0, *ends]).tolist()  # the first includes the engine's first graphs and the kernels' compiles
    later = records[1:] or records
    median = lambda key: float(np.median([r[key] for r in later]))
    metrics = {"step_s": float(np.median(steps[1:] or steps)), "step_s_each": steps,
               **{key: median(f"time/{key}") for key in ("generate", "score", "train")},
               "completion_mean_length": median("completions/mean_length"),
               "completion_min_length": min(r["completions/min_length"] for r in later),
               "completion_max_length": max(r["completions/max_length"] for r in later),
               "completion_tokens": median("completions/mean_length") * completions,
               "trained_tokens": median("num_tokens"),
               "mismatch_max": max(r["mismatch/max"] for r in later),
               **{f"mismatch_{key}": median(f"mismatch/{key}") for key in ("mean", "p99", "kl")}}
    for key, metric in (("trainer_peak_gib", "gpu_gib"), ("trainer_generate_gib", "generate_gib"),
                        ("trainer_train_gib", "train_gib"), ("trainer_used_gib", "gpu_used_gib")):
        metrics[key] = max(r[f"memory/{metric}"] for r in records)  # zeros on the CPU
    return metrics


def add_floor(work: Grpo, metrics: dict, rates: dict) -> None:
    """The step's floor (decode at the copy bandwidth, training at the matrix rate, `rates` as measured), the
    training phase's utilisation, and with the optimizer offloaded the host link's rate, into `metrics`."""
    cfg = model_config(work.shape)
    decode = decode_floor_seconds(cfg, work.generation, rates["copy_tbs"] * 1e12)
    train = training_utilisation(training_flops(cfg, work.training), metrics["train"], rates)
    metrics.update(floor_s=decode + train["floor_s"], floor_generate_s=decode, floor_train_s=train["floor_s"],
                   of_floor=(decode + train["floor_s"]) / metrics["step_s"],
                   train_mfu_measured=train["mfu_measured"], train_mfu_spec=train["mfu_spec"])
    if work.offload is not None:
        metrics["host_link_gb_s"] = host_link_gbs()


def print_floor(key: str, work: Grpo, m: dict) -> None:
    """Sizes, the floor and the fraction of it reached, the training phase's MFU, measured and planned peaks."""
    offload = f", {work.offload:g} of the optimizer state offloaded" if work.offload else ""
    line = (f"{key} floor ({work.shape}, {work.prompts} x {work.samples} completions of {work.completion_len} tokens "
            f"after {work.prompt_len}-token prompts, micro-batches of {work.micro_batch}{offload}): ")
    if "floor_s" in m:
        train = {"mfu_measured": m["train_mfu_measured"], "mfu_spec": m["train_mfu_spec"]}
        line += (f"{m['floor_s']:.2f} s (decode {m['floor_generate_s']:.2f} s at {m['copy_tbs']:.2f} TB/s, training "
                 f"{m['floor_train_s']:.2f} s at {m['matmul_tflops']:.0f} TFLOP/s); {m['step_s']:.2f} s/step, "
                 f"{m['of_floor']:.1%} of it; generate {m['floor_generate_s'] / m['generate']:.1%} of its floor; "
                 f"train {utilisation_words(train)}; ")
    line += (f"peak {gib(m['peak_gib'])} GiB (trainer: generate {m['trainer_generate_gib']:.1f}, train "
             f"{m['trainer_train_gib']:.1f}; planned {m['planned_generate_gib']:.1f} / {m['planned_train_gib']:.1f})")
    if m.get("host_link_gb_s"):
        line += f"; host link {m['host_link_gb_s']:.1f} GB/s each way, both ways at once"
    print(line, flush=True)


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--workload", default="R1", choices=list(GRPO))
    parser.add_argument("--shape", default=None, choices=list(SHAPES),
                        help="run the workload's sizes on this model shape (default: its own)")
    parser.add_argument("--model", default=None, help="a folder written by make_model.py (default: random weights)")
    parser.add_argument("--steps", type=int, default=3, help="GRPO steps; the first is a warm-up")
    parser.add_argument("--quick", action="store_true", help="a tiny model and short sequences on the CPU")
    parser.add_argument("--batch-invariant", default="on", choices=("on", "off"), help="GRPO's batch_invariant")
    parser.add_argument("--offload-optimizer", type=float, nargs="?", const=1.0, default=None, metavar="RATIO",
                        help="GRPO's offload_optimizer; RATIO (default 1): offload_optimizer_ratio (default: the "
                        "workload's, R3 0.1, the others resident)")
    parser.add_argument("--keep", default="attention", metavar="OPS", help="gradient_checkpointing_keep")
    parser.add_argument("--num-scheduler-steps", type=int, default=8, help="engine decode steps per graph launch")
    parser.add_argument("--micro-batch", type=int, default=None, choices=(1, 2, 4, 8, 16, 32, 64),
                        help="completions per micro-batch (default: the workload's)")
    parser.add_argument("--lora-r", type=int, default=0, help="LoRA adapters of this rank on every linear layer "
                        "(lora_alpha 2 r, the base frozen); 0: full-parameter training")
    parser.add_argument("--out", default=None, help="folder for the JSON record")
    return parser


def main() -> None:
    args = build_parser().parse_args()
    key, work = resolve(args)
    name, label, settings = describe(args, work)

    caches = caches_at_start()
    memory = DeviceMemory().start()
    stamps = stamp_first_log()
    try:
        records = run(args)
    except Exception as error:  # noqa: BLE001 (a run that does not fit is a result: recorded, not raised)
        import traceback

        traceback.print_exc()
        write_failure(args.out, name, key, "barerl", label, settings, error, "first_step_end_s" in stamps,
                      {"peak_gib": memory.peak_gib()})
        sys.exit(1)
    metrics = summarize(records, work.completions)
    metrics.update(peak_gib=memory.peak_gib(), cold_start_first_step_end_s=stamps.get("first_step_end_s"),
                   caches_at_start=caches)
    memory.stop()
    plan = barerl_api()[4](model_config(work.shape, args.quick), "float32" if args.quick else "bfloat16",
                           grpo_config(work, "unused", args.steps, tuple(args.keep.split(",")), lora_r=args.lora_r))
    metrics.update({f"planned_{p.name}_gib": p.nbytes / 2**30 for p in plan.phases})
    rates = {} if args.quick else ceilings("cupy")  # after the run: neither its cold start nor its peak sees them
    if rates:
        metrics.update(rates)
        add_floor(work, metrics, rates)
    print(f"{key} {name}: {metrics['step_s']:.2f} s/step (steps {', '.join(f'{s:.2f}' for s in metrics['step_s_each'])};"
          f" generate {metrics['generate']:.2f}, train {metrics['train']:.2f}), mismatch max "
          f"{metrics['mismatch_max']:.2e}, mean {metrics['mismatch_mean']:.2e}, cold start to the first step's end "
          f"{metrics['cold_start_first_step_end_s']:.1f} s", flush=True)
    print_floor(key, work, metrics)
    write_record(args.out, name, key, "barerl", label, settings, metrics)


if __name__ == "__main__":
    main()
