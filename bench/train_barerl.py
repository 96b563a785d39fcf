"""Workloads T1 and T2 (one optimizer step) on barerl, random bf16 weights (sizes: shapes.py): forward + backward
with per-layer recomputation, then AdamW. T1: Qwen3-0.6B, 64 packed sequences of 1,152 tokens (73,728 tokens) in
micro-batches of 16; T2: Qwen3-4B, 64 x 4,352 tokens (278,528), the loss on the last 4,096 of each, micro-batches
of 4. `--shape` runs a workload's sizes on another model shape.

One row per recomputation setting (`--keep`, barerl's `gradient_checkpointing_keep`): `attention` (the
default: each layer is recomputed in backward but for its attention output and lse, and the down product,
whose output is the next layer's input), `none` (everything recomputed: the same work as torch's plain
gradient checkpointing), `attention,linear` (no matrix product recomputed). Optimizer: AdamW with fp32 master
weights, fp32 moments and fp32 gradient accumulation, bf16 working weights (rounded to nearest), weight decay
0, gradients clipped at norm 1. The loss is SFT-like (d loss / d log-prob = -1/n at every loss token), so the LM
head runs each chunk's backward inside its forward. Step time is the median of 3 steps after a warm-up.
MFU = useful FLOP (shapes.training_flops: 6 N tokens + causal attention, recomputation not counted) / step
time, over the bf16 matrix rate measured in this process and over the 989 TFLOP/s spec; the floor is those FLOP
at the measured rate. The memory plan (barerl.train.memory_plan) is printed beside the measured peak. Peer:
train_torch.py.

    PYTHONPATH=src python bench/train_barerl.py [--workload T1|T2] [--shape SHAPE]
        [--keep attention none attention,linear] [--repeats 3] [--quick] [--out DIR]
"""

from __future__ import annotations

import argparse
import time
from types import SimpleNamespace

import numpy as np
from common import DeviceMemory, ceilings, print_training_floor, write_record
from shapes import SHAPES, TRAINING, Training, model_config, training_flops, training_utilisation, workload


def barerl_api():
    """barerl's entry points used here (one place, for the layout move)."""
    from barerl.model.model import Model, PackedBatch
    from barerl.train.config import SFTConfig
    from barerl.train.memory_plan import plan_training
    from barerl.train.optimizer import AdamW

    return Model, PackedBatch, AdamW, SFTConfig, plan_training


def training_config(t: Training, keep: tuple[str, ...] = ("attention",)):
    """What this script runs, as an SFT config (for the memory plan): whole sequences in micro-batches,
    recomputation keeping `keep`."""
    *_, SFTConfig, _ = barerl_api()
    return SFTConfig(per_device_train_batch_size=t.micro_batch, max_length=t.seqlen,
                     max_tokens_per_microbatch=t.micro_batch * t.seqlen, gradient_checkpointing=True,
                     gradient_checkpointing_keep=keep)


def packed_batches(vocab_size: int, t: Training) -> list:
    """t.sequences random sequences in micro-batches of t.micro_batch, the loss on the last t.loss_tokens of each
    (every next token when None)."""
    _, PackedBatch, *_ = barerl_api()
    rng = np.random.default_rng(1)
    trained = t.loss_tokens or t.seqlen
    mask = [0] * (t.seqlen - trained) + [1] * trained

    def batch():
        ids = rng.integers(0, vocab_size, (t.micro_batch, t.seqlen)).tolist()
        return PackedBatch.from_examples([SimpleNamespace(input_ids=s, loss_mask=mask) for s in ids])
    return [batch() for _ in range(t.sequences // t.micro_batch)]


def step_seconds(t: Training, quick: bool, keep: tuple[str, ...], repeats: int) -> dict:
    Model, _, AdamW, _, _ = barerl_api()
    cfg = model_config(t.shape, quick)
    model = Model.random(cfg, device="cpu" if quick else "cuda", dtype="float32" if quick else "bfloat16", seed=0)
    xp = model.xp
    optimizer = AdamW(model.params, model.backend, weight_decay=0.0, max_grad_norm=1.0)
    batches = packed_batches(cfg.vocab_size, t)
    n = float(sum(b.num_loss_tokens for b in batches))

    def token_grad(logp, start, stop):
        return xp.full(stop - start, -1.0 / n, xp.float32)

    def loss_fn(logp, entropy):
        return float(-logp.sum()) / n, token_grad(logp, 0, logp.shape[0]), {}

    def sync():
        if not quick:
            xp.cuda.Device().synchronize()

    def step() -> float:
        sync()
        start = time.perf_counter()
        optimizer.zero_grad()
        for b in batches:
            model.forward_backward(b, loss_fn, optimizer.grads, checkpoint=True, keep_ops=keep, token_grad=token_grad)
        optimizer.step(1e-5)
        sync()
        return time.perf_counter() - start

    step()  # warm-up: kernel compilation, cuBLASLt tuning, pool growth
    times = [step() for _ in range(repeats)]
    pool = getattr(xp, "get_default_memory_pool", None)
    return {"step_s": float(np.median(times)), "step_s_each": times, "num_params": cfg.num_parameters(),
            "pool_gib": pool().total_bytes() / 2**30 if pool else None, "tokens": t.sequences * t.seqlen}


def free_pool() -> None:
    """Hand CuPy's cached blocks back, so that the next row's peak is its own."""
    try:
        import cupy
    except ImportError:
        return
    cupy.get_default_memory_pool().free_all_blocks()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--workload", default="T1", choices=list(TRAINING))
    parser.add_argument("--shape", default=None, choices=list(SHAPES),
                        help="run the workload's sizes on this model shape (default: its own)")
    parser.add_argument("--keep", nargs="+", default=["attention", "none", "attention,linear"], metavar="OPS",
                        help="recomputation settings, one row each: ops kept (comma-separated), or none")
    parser.add_argument("--quick", action="store_true", help="a tiny model and batch on the CPU (a smoke test)")
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--out", default=None, help="folder for the JSON records")
    args = parser.parse_args()

    key, t = workload(TRAINING, args.workload, args.shape, args.quick)
    *_, plan_training = barerl_api()
    cfg = model_config(t.shape, args.quick)
    memory = DeviceMemory().start()
    rates = {} if args.quick else ceilings("cupy")
    for keep in args.keep:
        free_pool()
        memory.reset_peak()
        ops = () if keep == "none" else tuple(filter(None, keep.split(",")))
        r = step_seconds(t, args.quick, ops, 1 if args.quick else args.repeats)
        u = training_utilisation(training_flops(cfg, t), r["step_s"], rates)
        planned = plan_training(cfg, "float32" if args.quick else "bfloat16", training_config(t, ops)).peak
        metrics = {**r, "tokens_per_s": r["tokens"] / r["step_s"], **u, **rates, "peak_gib": memory.peak_gib(),
                   "planned_gib": planned.nbytes / 2**30}
        settings = {"recompute": "per layer", "keep": keep, "micro_batch": t.micro_batch, "optimizer": (
            "AdamW, fp32 master + moments + gradients, bf16 working weights, weight decay 0, clip 1.0"),
            "head": "fused (backward inside forward)"}
        if t.loss_tokens:
            settings["loss_tokens"] = t.loss_tokens
        print(f"{key} barerl keep={keep}: {r['step_s']:.3f} s, {u['tflops']:.0f} TFLOP/s"
              + (f", MFU {u['mfu_measured']:.1%} of measured" if rates else ""), flush=True)
        print_training_floor(key, t, metrics, f"barerl keep={keep}")
        label = {"none": "recomputes all", "attention": "keeps attention (default)"}.get(keep, f"keeps {keep}")
        write_record(args.out, f"barerl-keep-{keep.replace(',', '-')}", key, "barerl", label, settings, metrics)
    memory.stop()


if __name__ == "__main__":
    main()
