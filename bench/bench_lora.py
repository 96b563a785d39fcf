"""LoRA GRPO on one GPU: peak memory and step time against full-parameter training.

Workloads (random bf16 weights, 8 prompts x 8 samples, 128-token prompts, `train_grpo` as a user runs it, the
first step a warm-up; bench_grpo_step.py's harness):
- r1: R1 itself (Qwen3-0.6B shape, 1,024-token completions, micro-batches of 16) with LoRA rank --lora-r on
  every linear layer; --lora-r 0 is full-parameter R1, the figure to compare with.
- qwen3-8b: the Qwen3-8B shape (hidden 4096, 36 layers, 32 heads, 8 KV heads, head_dim 128, intermediate
  12288, vocab 151,936, untied) with 4,096-token completions (8 x 8 x 4,096), micro-batches of 4 (--micro-batch).

One workload and variant per process, so each peak is its own:

    PYTHONPATH=src python bench/bench_lora.py r1 --lora-r 0
    PYTHONPATH=src python bench/bench_lora.py r1 --lora-r 16
    PYTHONPATH=src python bench/bench_lora.py qwen3-8b --lora-r 16 --steps 2
    PYTHONPATH=src python bench/bench_lora.py r1 --quick --device cpu      # a CPU smoke test of the script
"""

from __future__ import annotations

import argparse
import json

from bench_grpo_step import run
from bench_train_step import QWEN3_06B

QWEN3_8B = {
    "architectures": ["Qwen3ForCausalLM"], "vocab_size": 151936, "hidden_size": 4096, "intermediate_size": 12288,
    "num_hidden_layers": 36, "num_attention_heads": 32, "num_key_value_heads": 8, "head_dim": 128,
    "rms_norm_eps": 1e-6, "rope_theta": 1e6, "tie_word_embeddings": False, "max_position_embeddings": 40960,
}
WORKLOADS = {"r1": (QWEN3_06B, 1024, 16), "qwen3-8b": (QWEN3_8B, 4096, 4)}  # shape, completion tokens, micro-batch


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("workload", choices=sorted(WORKLOADS))
    parser.add_argument("--lora-r", type=int, default=16, help="LoRA rank on every linear layer (0: full-parameter)")
    parser.add_argument("--steps", type=int, default=3, help="GRPO steps; the first is a warm-up")
    parser.add_argument("--micro-batch", type=int, default=None, help="completions per micro-batch")
    parser.add_argument("--keep", default="attention", help="gradient_checkpointing_keep, comma-separated")
    parser.add_argument("--batch-invariant", default="on", choices=("on", "off"))
    parser.add_argument("--num-scheduler-steps", type=int, default=8)
    parser.add_argument("--device", default="cuda", choices=("cpu", "cuda"))
    parser.add_argument("--quick", action="store_true", help="a tiny model and short sequences (CPU smoke test)")
    parser.add_argument("--json", default=None, help="write the figures to this file")
    args = parser.parse_args()
    shape, new_tokens, micro_batch = WORKLOADS[args.workload]
    lora = {"lora_r": args.lora_r, "lora_alpha": 2 * args.lora_r, "lora_target_modules": ("all-linear",)} \
        if args.lora_r else {}
    r = run(args.quick, args.steps, args.device, args.num_scheduler_steps, keep=tuple(args.keep.split(",")),
            batch_invariant=args.batch_invariant == "on", micro_batch=args.micro_batch or micro_batch, shape=shape,
            new_tokens=new_tokens, options=lora)
    r.update(workload=args.workload, lora_r=args.lora_r)
    variant = f"LoRA r={args.lora_r} all-linear" if args.lora_r else "full-parameter"
    print(f"{args.workload} {variant}: {r['step_s']:.2f} s/step (generate {r['time/generate']:.2f}, train "
          f"{r['time/train']:.2f}), {r['completion_tokens']:.0f} completion tokens, peak {r['peak_gib']:.1f} GiB "
          f"(generate {r['generate_gib']:.1f}, train {r['train_gib']:.1f}; in use {r['used_gib']:.1f}), "
          f"engine/trainer log-prob mismatch max {r['mismatch_max']:.2e}")
    if args.json:
        with open(args.json, "w") as f:
            json.dump(r, f, indent=1)


if __name__ == "__main__":
    main()
