"""Workloads R1, R2, R3 and L1 (shared/WORKLOADS.md): one GRPO step with random bf16 weights (sizes:
bench/shapes.py): the engine's rollouts (random weights almost never emit EOS), a cheap reward, then training on
them (recomputation, AdamW, one optimizer step). R1: Qwen3-0.6B, 8 prompts x 8 samples, 128 + 1,024 tokens,
micro-batches of 16; R2: Qwen3-4B, 8 x 8, 256 + 4,096, micro-batches of 4; R3: Qwen3-8B, 8 x 8, 256 + 2,048,
micro-batches of 4, 10% of the optimizer state streamed from host memory; L1: Qwen3-1.7B, 4 x 4, 256 + 16,384,
one completion per pass. `--shape` runs a workload's sizes on another model shape.

barerl's whole loop runs as a user would run it (`train_grpo`, no checkpoints); the first step also compiles
kernels and captures graphs, so the reported figure is the median of the later steps, split into generate /
score / train from metrics.jsonl. Printed beside it: the memory plan and the peaks measured against it, the
floor (decode at the copy bandwidth measured here + training at the bf16 matrix rate measured here) and the
fraction of it reached, the training phase's MFU, and with an offloaded optimizer the host link's rate measured
here. The peer (TRL's GRPOTrainer) runs in its own process: bench/bench_grpo_trl.py.

    PYTHONPATH=src python bench/bench_grpo_step.py [--workload R1|R2|R3|L1] [--shape SHAPE] [--steps 3] [--quick]
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import tempfile
import time
import zlib
from pathlib import Path

import numpy as np
from shapes import GRPO, SHAPES, Grpo, decode_floor_seconds, model_config, training_flops, utilisation


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


def host_link_rate(gib: int = 2) -> float:
    """Bytes per second each way of pinned host <-> GPU copies running both ways at once (what the streamed
    optimizer step does), median of 5."""
    import cupy
    import cupyx

    n = gib << 30
    host_up, host_down = cupyx.empty_pinned(n, np.uint8), cupyx.empty_pinned(n, np.uint8)
    device_up, device_down = cupy.empty(n, np.uint8), cupy.zeros(n, np.uint8)
    up, down, times = cupy.cuda.Stream(non_blocking=True), cupy.cuda.Stream(non_blocking=True), []
    rt = cupy.cuda.runtime
    for _ in range(6):
        cupy.cuda.Device().synchronize()
        start = time.perf_counter()
        rt.memcpyAsync(device_up.data.ptr, host_up.ctypes.data, n, rt.memcpyHostToDevice, up.ptr)
        rt.memcpyAsync(host_down.ctypes.data, device_down.data.ptr, n, rt.memcpyDeviceToHost, down.ptr)
        up.synchronize()
        down.synchronize()
        times.append(time.perf_counter() - start)
    return n / float(np.median(times[1:]))


def grpo_config(work: Grpo, steps: int, output_dir: str, num_scheduler_steps: int, offload: float | None,
                keep: tuple[str, ...], batch_invariant: bool):
    from barerl.train.config import GRPOConfig

    micro, completions = work.micro_batch, work.prompts * work.samples
    return GRPOConfig(
        output_dir=output_dir, max_steps=steps, num_generations=work.samples, per_device_train_batch_size=micro,
        gradient_accumulation_steps=completions // micro, max_prompt_length=work.prompt_len,
        max_completion_length=work.completion_len, temperature=1.0, learning_rate=1e-6, lr_scheduler_type="constant",
        gradient_checkpointing=True, max_tokens_per_microbatch=micro * (work.prompt_len + work.completion_len),
        loss_type="dapo", beta=0.0, save_strategy="no", log_completions_steps=0, seed=0, shuffle_dataset=False,
        offload_optimizer=offload is not None, offload_optimizer_ratio=offload or 1.0,
        gradient_checkpointing_keep=keep, batch_invariant=batch_invariant,
    )


def run(work: Grpo, quick: bool, steps: int, device: str, num_scheduler_steps: int = 8,
        offload_optimizer: float | None = None, keep: tuple[str, ...] = ("attention",), batch_invariant: bool = True,
        micro_batch: int | None = None) -> dict:
    from barerl.config import ModelConfig
    from barerl.model.model import Model
    from barerl.train.grpo import train_grpo
    from barerl.train.memory_plan import GIB, plan_training

    cfg_dict = dict(SHAPES[work.shape])
    work = dataclasses.replace(work, micro_batch=micro_batch or work.micro_batch)
    if quick:  # a smoke test of this script on a CPU
        cfg_dict.update(vocab_size=512, hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                        num_attention_heads=4, num_key_value_heads=2, head_dim=16)
        work = dataclasses.replace(work, prompt_len=16, completion_len=16)
    cfg = ModelConfig.from_dict(cfg_dict, source=f"{work.shape} shape")
    dtype = "bfloat16" if device == "cuda" else "float32"
    config = grpo_config(work, steps, tempfile.mkdtemp(prefix="grpo-"), num_scheduler_steps, offload_optimizer,
                         keep, batch_invariant)
    plan = plan_training(cfg, dtype, config)
    print(plan.render(), flush=True)
    model = Model.random(cfg, device=device, dtype=dtype, seed=0)
    rng = np.random.default_rng(0)
    rows = [{"prompt": " ".join(f"t{i}" for i in rng.integers(2, cfg.vocab_size, work.prompt_len))}
            for _ in range(work.prompts * steps)]
    out = Path(config.output_dir)
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
        f", micro-batches of {micro_batch}" if micro_batch else "")
    result = {"system": system, "step_s": sum(phases.values()), **phases, "wall_all_steps_s": wall,
              "completion_tokens": float(np.median([r["completions/mean_length"] for r in timed]))
              * work.prompts * work.samples,
              "mismatch_max": max(r["mismatch/max"] for r in timed),
              **{f"mismatch_{key}": float(np.median([r[f"mismatch/{key}"] for r in timed]))
                 for key in ("mean", "p99", "kl")}}
    # the trainer's own readings (zeros on the CPU): CuPy's pool + the engine's KV cache and graph pool, at the
    # end of generating and the training phase's high-water mark; "used" counts the pool's live arrays only
    for key, metric in (("peak_gib", "gpu_gib"), ("generate_gib", "generate_gib"), ("train_gib", "train_gib"),
                        ("used_gib", "gpu_used_gib")):
        result[key] = max(r[f"memory/{metric}"] for r in records)
    result.update({f"planned_{p.name}_gib": p.nbytes / GIB for p in plan.phases})
    return result


def report_floors(work: Grpo, r: dict) -> None:
    """The step's floor (decode at the copy bandwidth, training at the matrix rate, both measured now), the
    fraction of it reached, the training phase's MFU, and the host link's rate when the optimizer streams."""
    import cupy
    from bench_generate import copy_bandwidth
    from bench_train_step import matmul_rate

    cfg = model_config(work.shape)
    bandwidth, tflops = copy_bandwidth(), matmul_rate(cupy)
    flops = training_flops(cfg, work.training)
    decode, train = decode_floor_seconds(cfg, work.generation, bandwidth), flops / (tflops * 1e12)
    r.update(copy_tb_s=bandwidth / 1e12, matmul_tflops=tflops, floor_s=decode + train, floor_generate_s=decode,
             floor_train_s=train)
    print(f"floor {decode + train:.2f} s (decode {decode:.2f} s at {bandwidth / 1e12:.2f} TB/s, training {train:.2f} s "
          f"at {tflops:.0f} TFLOP/s): {r['floor_s'] / r['step_s']:.1%} of it; generate {decode / r['time/generate']:.1%} "
          f"of its floor; train {utilisation(flops, r['time/train'], tflops)}; planned peak GiB "
          + ", ".join(f"{k[8:-4]} {v:.1f}" for k, v in r.items() if k.startswith("planned_")))
    if "optimizer" in r["system"]:
        r["host_link_gb_s"] = host_link_rate() / 1e9
        print(f"host link, both ways at once: {r['host_link_gb_s']:.1f} GB/s each way")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--workload", default="R1", choices=list(GRPO))
    parser.add_argument("--shape", default=None, choices=list(SHAPES),
                        help="model shape (default: the workload's own, bench/shapes.py)")
    parser.add_argument("--steps", type=int, default=3, help="GRPO steps; the first is a warm-up")
    parser.add_argument("--quick", action="store_true", help="a tiny model and short sequences (CPU smoke test)")
    parser.add_argument("--device", default="cuda", choices=("cpu", "cuda"))
    parser.add_argument("--num-scheduler-steps", type=int, default=8, help="engine decode steps per graph launch")
    parser.add_argument("--offload-optimizer", type=float, nargs="?", const=1.0, default=None, metavar="RATIO",
                        help="GRPO's offload_optimizer: the fp32 state in host memory while generating; RATIO "
                        "(default 1): offload_optimizer_ratio, the share of it there (default: the workload's, "
                        "R3 0.1, the others none)")
    parser.add_argument("--keep", default="attention", metavar="OPS",
                        help="gradient_checkpointing_keep, comma-separated (e.g. attention,linear)")
    parser.add_argument("--batch-invariant", default="on", choices=("on", "off"), help="GRPO's batch_invariant")
    parser.add_argument("--micro-batch", type=int, default=None, choices=(1, 2, 4, 8, 16, 32, 64),
                        help="completions per micro-batch (the optimizer step still sees them all; default: the "
                        "workload's)")
    parser.add_argument("--json", default=None)
    args = parser.parse_args()
    work = GRPO[args.workload]
    work = dataclasses.replace(work, shape=args.shape or work.shape)
    offload = args.offload_optimizer if args.offload_optimizer is not None else work.offload
    r = run(work, args.quick, args.steps, args.device, args.num_scheduler_steps, offload,
            tuple(args.keep.split(",")), args.batch_invariant == "on", args.micro_batch)
    print(f"{args.workload} ({work.shape}) {r['system']}: {r['step_s']:.2f} s/step (generate {r['time/generate']:.2f}, "
          f"score {r['time/score']:.3f}, "
          f"train {r['time/train']:.2f}), {r['completion_tokens']:.0f} completion tokens, "
          f"engine/trainer log-prob mismatch max {r['mismatch_max']:.2e}, mean {r['mismatch_mean']:.2e}, "
          f"p99 {r['mismatch_p99']:.2e}, KL {r['mismatch_kl']:.1e}"
          + (f", peak {r['peak_gib']:.1f} GiB (generate {r['generate_gib']:.1f}, train {r['train_gib']:.1f}; "
             f"in use {r['used_gib']:.1f})" if args.device == "cuda" else ""))
    if args.device == "cuda" and not args.quick:
        report_floors(work, r)
    if args.json:
        with open(args.json, "w") as f:
            json.dump(r, f, indent=1)


if __name__ == "__main__":
    main()
