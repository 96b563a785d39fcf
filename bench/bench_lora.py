"""LoRA GRPO on one GPU: grpo_barerl.py's run with LoRA adapters (rank --lora-r, lora_alpha 2 r, every linear
layer), its step time and peak memory beside the run's memory plan, against full-parameter training.

Workloads (random bf16 weights, 8 prompts x 8 samples, 128-token prompts, `train_grpo` as a user runs it, the
first step a warm-up):
- R1 (default): R1 itself (Qwen3-0.6B shape, 1,024-token completions, micro-batches of 16) with the adapters;
  the full-parameter figure to compare with is grpo_barerl.py's with the same --model (run_all.py's stage
  `lora` runs the two back to back).
- lora-8b: the Qwen3-8B shape (bench/shapes.py) with 4,096-token completions (8 x 8 x 4,096), micro-batches of
  4 unless --micro-batch says otherwise. Full-parameter training of this shape does not fit one H200 with its
  optimizer resident (docs/MEMORY.md, R3); with LoRA the plan is ~53 GiB while generating.

    PYTHONPATH=src python bench/bench_lora.py [--model DIR] [--lora-r 16] [--out DIR] [grpo_barerl.py's options]
    PYTHONPATH=src python bench/bench_lora.py --workload lora-8b --steps 2
    PYTHONPATH=src python bench/bench_lora.py --quick --steps 2          # a CPU smoke test of the script
"""

from __future__ import annotations

from common import PROMPT_LEN, DeviceMemory, caches_at_start, write_record
from grpo_barerl import build_parser, describe, run, stamp_first_log, summarize
from shapes import SHAPES

# workload -> (shape, None: R1's; completion tokens; micro-batch unless given)
WORKLOADS = {"R1": (None, 1024, 16), "lora-8b": ("qwen3-8b", 4096, 4)}


def keep_plan() -> dict:
    """The memory plan `train_grpo` makes at its start, as each phase's GiB (filled in when the run starts)."""
    from barerl.train import grpo

    phases: dict = {}
    plan_run = grpo.plan_run

    def kept(*args, **kwargs):
        plan = plan_run(*args, **kwargs)
        phases.update({f"plan_{phase.name}_gib": phase.nbytes / 2**30 for phase in plan.phases} if plan else {})
        return plan
    grpo.plan_run = kept
    return phases


def main() -> None:
    parser = build_parser()
    parser.description = __doc__.splitlines()[0]
    parser.add_argument("--workload", default="R1", choices=list(WORKLOADS))
    parser.add_argument("--lora-r", type=int, default=16, help="LoRA rank on every linear layer (lora_alpha 2 r)")
    parser.set_defaults(micro_batch=None)  # the workload's
    args = parser.parse_args()
    if args.lora_r < 1:
        parser.error("--lora-r: a LoRA rank is at least 1 (full-parameter training is grpo_barerl.py)")
    shape, new_tokens, micro = WORKLOADS[args.workload]
    args.micro_batch = args.micro_batch or micro
    overrides = {"lora_r": args.lora_r, "lora_alpha": 2.0 * args.lora_r, "lora_target_modules": ("all-linear",)}
    if new_tokens != 1024 and not args.quick:  # grpo_barerl.py's lengths are R1's
        overrides.update(max_completion_length=new_tokens,
                         max_tokens_per_microbatch=args.micro_batch * (PROMPT_LEN + new_tokens))

    caches = caches_at_start()
    memory = DeviceMemory().start()
    stamps, plan = stamp_first_log(), keep_plan()
    metrics = summarize(run(args, overrides=overrides, shape=shape and SHAPES[shape]))
    metrics.update(peak_gib=memory.peak_gib(), cold_start_first_step_end_s=stamps.get("first_step_end_s"),
                   caches_at_start=caches, **plan)
    memory.stop()
    peak = "-" if metrics["peak_gib"] is None else f"{metrics['peak_gib']:.1f}"
    name, label, settings = describe(args)
    name = name.replace("barerl", f"barerl-lora-r{args.lora_r}", 1)
    label = f"LoRA r={args.lora_r} all-linear" + ("" if label.startswith("default") else f", {label}")
    settings.update(overrides, shape=shape or "qwen3-0.6b")
    print(f"LoRA {args.workload} {name}: {metrics['step_s']:.2f} s/step (generate {metrics['generate']:.2f}, train "
          f"{metrics['train']:.2f}), {metrics['completion_tokens']:.0f} completion tokens; peak {peak} GiB, the trainer's generate / train {metrics['trainer_generate_gib']:.1f} / "
          f"{metrics['trainer_train_gib']:.1f} GiB against the plan's {plan.get('plan_generate_gib', 0):.1f} / "
          f"{plan.get('plan_train_gib', 0):.1f}; mismatch max {metrics['mismatch_max']:.2e}", flush=True)
    write_record(args.out, name, args.workload, "barerl", label, settings, metrics)


if __name__ == "__main__":
    main()
