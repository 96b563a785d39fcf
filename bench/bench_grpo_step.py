"""Workload R1 (shared/WORKLOADS.md): one GRPO step on the Qwen3-0.6B architecture with random bf16 weights:
8 prompts x 8 samples, 128-token prompts, 1,024-token completions (random weights almost never emit EOS), a
cheap reward, then T1's training (64 sequences, micro-batches of 16 unless --micro-batch, recomputation, AdamW).

barerl's whole loop runs as a user would run it (`train_grpo`); the first step also compiles kernels and
captures graphs, so the reported figure is the median of the later steps, split into generate / score /
train from metrics.jsonl. The peer (TRL's GRPOTrainer) runs in its own process: bench/bench_grpo_trl.py.

    PYTHONPATH=src python bench/bench_grpo_step.py [--steps 3] [--quick]
"""

from __future__ import annotations

import argparse
import json
import tempfile
import time
import zlib
from pathlib import Path

import numpy as np
from bench_train_step import QWEN3_06B


def numbered_tokenizer(vocab_size: int):
    """Token i is the word "t<i>" (0 and 1: pad and eos): any token id of a random model decodes, and prompts
    encode exactly; special tokens are no prefix of a word (a tokenizer matches them inside words)."""
    from tokenizers import Tokenizer as Backend
    from tokenizers import decoders, models, pre_tokenizers

    from barerl.tokenizer import Tokenizer

    vocab = {"<pad>": 0, "</s>": 1} | {f"t{i}": i for i in range(2, vocab_size)}
    backend = Backend(models.WordLevel(vocab, unk_token="<pad>"))
    backend.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    backend.decoder = decoders.WordPiece(prefix="##", cleanup=False)  # joins words with spaces
    return Tokenizer(backend, special_tokens={"eos_token": "</s>", "pad_token": "<pad>"}, source="bench",
                     add_bos_token=False, add_eos_token=False)


def cheap_reward(prompts, completions, **_) -> list[float]:
    """A deterministic reward that varies across samples (so advantages are not all zero)."""
    return [zlib.crc32(c.encode()) % 100 / 100 for c in completions]


def run(quick: bool, steps: int, device: str, num_scheduler_steps: int = 8, offload_optimizer: float | None = None,
        keep: tuple[str, ...] = ("attention",), batch_invariant: bool = True, micro_batch: int = 16,
        shape: dict = QWEN3_06B, new_tokens: int = 1024, options: dict | None = None) -> dict:
    """One R1-shaped run: `shape` (a config.json dict), 8 x 8 completions of `new_tokens`; `options`: more
    GRPOConfig fields (bench_lora.py's LoRA)."""
    from barerl.config import ModelConfig
    from barerl.model.model import Model
    from barerl.train.config import GRPOConfig
    from barerl.train.grpo import train_grpo

    cfg_dict = dict(shape)
    prompt_len = 128
    if quick:  # a smoke test of this script on a CPU
        cfg_dict.update(vocab_size=512, hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                        num_attention_heads=4, num_key_value_heads=2, head_dim=16)
        prompt_len, new_tokens = 16, 16
    cfg = ModelConfig.from_dict(cfg_dict, source="Qwen3-0.6B shape")
    model = Model.random(cfg, device=device, dtype="bfloat16" if device == "cuda" else "float32", seed=0)
    rng = np.random.default_rng(0)
    rows = [{"prompt": " ".join(f"t{i}" for i in rng.integers(2, cfg.vocab_size, prompt_len))}
            for _ in range(8 * steps)]
    out = Path(tempfile.mkdtemp(prefix="r1-"))
    config = GRPOConfig(
        output_dir=str(out), max_steps=steps, num_generations=8, per_device_train_batch_size=micro_batch,
        gradient_accumulation_steps=64 // micro_batch, max_prompt_length=prompt_len, max_completion_length=new_tokens,
        temperature=1.0, learning_rate=1e-6, lr_scheduler_type="constant", gradient_checkpointing=True,
        max_tokens_per_microbatch=micro_batch * (prompt_len + new_tokens), loss_type="dapo", beta=0.0, save_steps=0,
        log_completions_steps=0, seed=0, shuffle_dataset=False, offload_optimizer=offload_optimizer is not None,
        offload_optimizer_ratio=offload_optimizer or 1.0,
        gradient_checkpointing_keep=keep, batch_invariant=batch_invariant, **(options or {}),
    )
    start = time.perf_counter()
    train_grpo(config, model=model, tokenizer=numbered_tokenizer(cfg.vocab_size), rows=rows,
               reward_funcs=[cheap_reward], show_progress=False,
               engine_args={"num_scheduler_steps": num_scheduler_steps})
    wall = time.perf_counter() - start
    with open(out / "metrics.jsonl") as f:
        records = [json.loads(line) for line in f]
    timed = records[1:] or records
    phases = {key: float(np.median([r[key] for r in timed])) for key in ("time/generate", "time/score", "time/train")}
    offloaded = "" if offload_optimizer is None else " (optimizer offloaded)" if offload_optimizer == 1 else (
        f" ({offload_optimizer:g} of the optimizer state offloaded)")
    system = "barerl" + offloaded + (
        f", keeps {','.join(keep)}" if tuple(keep) != ("attention",) else "") + (
        "" if batch_invariant else ", batch_invariant off") + (
        f", micro-batches of {micro_batch}" if micro_batch != 16 else "")
    result = {"system": system, "step_s": sum(phases.values()), **phases, "wall_all_steps_s": wall,
              "completion_tokens": float(np.median([r["completions/mean_length"] for r in timed])) * 64,
              "mismatch_max": max(r["mismatch/max"] for r in timed),
              **{f"mismatch_{key}": float(np.median([r[f"mismatch/{key}"] for r in timed]))
                 for key in ("mean", "p99", "kl")}}
    # the trainer's own readings (zeros on the CPU): CuPy's pool + the engine's KV cache and graph pool, at the
    # end of generating and the training phase's high-water mark; "used" counts the pool's live arrays only
    for key, metric in (("peak_gib", "gpu_gib"), ("generate_gib", "generate_gib"), ("train_gib", "train_gib"),
                        ("used_gib", "gpu_used_gib")):
        result[key] = max(r[f"memory/{metric}"] for r in records)
    return result


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=3, help="GRPO steps; the first is a warm-up")
    parser.add_argument("--quick", action="store_true", help="a tiny model and short sequences (CPU smoke test)")
    parser.add_argument("--device", default="cuda", choices=("cpu", "cuda"))
    parser.add_argument("--num-scheduler-steps", type=int, default=8, help="engine decode steps per graph launch")
    parser.add_argument("--offload-optimizer", type=float, nargs="?", const=1.0, default=None, metavar="RATIO",
                        help="GRPO's offload_optimizer: the fp32 state in host memory while generating; RATIO "
                        "(default 1): offload_optimizer_ratio, the share of it there")
    parser.add_argument("--keep", default="attention", metavar="OPS",
                        help="gradient_checkpointing_keep, comma-separated (e.g. attention,linear)")
    parser.add_argument("--batch-invariant", default="on", choices=("on", "off"), help="GRPO's batch_invariant")
    parser.add_argument("--micro-batch", type=int, default=16, choices=(1, 2, 4, 8, 16, 32, 64),
                        help="completions per micro-batch (the optimizer step still sees all 64)")
    parser.add_argument("--json", default=None)
    args = parser.parse_args()
    r = run(args.quick, args.steps, args.device, args.num_scheduler_steps, args.offload_optimizer,
            tuple(args.keep.split(",")), args.batch_invariant == "on", args.micro_batch)
    print(f"R1 {r['system']}: {r['step_s']:.2f} s/step (generate {r['time/generate']:.2f}, "
          f"score {r['time/score']:.3f}, "
          f"train {r['time/train']:.2f}), {r['completion_tokens']:.0f} completion tokens, "
          f"engine/trainer log-prob mismatch max {r['mismatch_max']:.2e}, mean {r['mismatch_mean']:.2e}, "
          f"p99 {r['mismatch_p99']:.2e}, KL {r['mismatch_kl']:.1e}"
          + (f", peak {r['peak_gib']:.1f} GiB (generate {r['generate_gib']:.1f}, train {r['train_gib']:.1f}; "
             f"in use {r['used_gib']:.1f})" if args.device == "cuda" else ""))
    if args.json:
        with open(args.json, "w") as f:
            json.dump(r, f, indent=1)


if __name__ == "__main__":
    main()
