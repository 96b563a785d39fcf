"""Workload T1 (one optimizer step) on barerl: the Qwen3-0.6B architecture, 64 packed sequences of 1,152 tokens
(73,728 tokens) in micro-batches of 16, forward + backward with per-layer recomputation, then AdamW.

One row per recomputation setting (`--keep`, barerl's `gradient_checkpointing_keep`): `attention` (the
default: each layer is recomputed in backward but for its attention output and lse, and the down product,
whose output is the next layer's input), `none` (everything recomputed: the same work as torch's plain
gradient checkpointing), `attention,linear` (no matrix product recomputed). Optimizer: AdamW with fp32 master
weights, fp32 moments and fp32 gradient accumulation, bf16 working weights (rounded to nearest), weight decay
0, gradients clipped at norm 1. The loss is SFT-like (d loss / d log-prob = -1/n at every token), so the LM
head runs each chunk's backward inside its forward. Step time is the median of 3 steps after a warm-up.
MFU = useful FLOP (common.training_flops: 6 N tokens + causal attention, recomputation not counted) / step
time, over the bf16 matrix rate measured in this process and over the 989 TFLOP/s spec. Peer: train_torch.py.

    PYTHONPATH=src python bench/train_barerl.py [--keep attention none attention,linear] [--quick] [--out DIR]
"""

from __future__ import annotations

import argparse
import time

import numpy as np
from common import SPEC_BF16_TFLOPS, DeviceMemory, ceilings, model_shape, training_flops, write_record

SEQS, SEQLEN, MICRO = 64, 1152, 16
QUICK = (4, 64, 2)  # sequences, length, micro-batch of the CPU smoke test


def barerl_api():
    """barerl's entry points used here (one place, for the layout move)."""
    from barerl.config import ModelConfig
    from barerl.model.model import Model, PackedBatch
    from barerl.train.optimizer import AdamW

    return ModelConfig, Model, PackedBatch, AdamW


def step_seconds(shape: dict, quick: bool, keep: tuple[str, ...], repeats: int) -> dict:
    ModelConfig, Model, PackedBatch, AdamW = barerl_api()
    seqs, seqlen, micro = QUICK if quick else (SEQS, SEQLEN, MICRO)
    cfg = ModelConfig.from_dict(shape, source="Qwen3-0.6B shape")
    model = Model.random(cfg, device="cpu" if quick else "cuda", dtype="float32" if quick else "bfloat16", seed=0)
    xp = model.xp
    optimizer = AdamW(model.params, model.backend, weight_decay=0.0, max_grad_norm=1.0)
    rng = np.random.default_rng(1)
    batches = [PackedBatch.from_sequences(rng.integers(0, cfg.vocab_size, (micro, seqlen)).tolist())
               for _ in range(seqs // micro)]
    n = float(seqs * (seqlen - 1))

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
            "pool_gib": pool().total_bytes() / 2**30 if pool else None, "tokens": seqs * seqlen}


def free_pool() -> None:
    """Hand CuPy's cached blocks back, so that the next row's peak is its own."""
    try:
        import cupy
    except ImportError:
        return
    cupy.get_default_memory_pool().free_all_blocks()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--keep", nargs="+", default=["attention", "none", "attention,linear"], metavar="OPS",
                        help="recomputation settings, one row each: ops kept (comma-separated), or none")
    parser.add_argument("--quick", action="store_true", help="a tiny model and batch on the CPU (a smoke test)")
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--out", default=None, help="folder for the JSON records")
    args = parser.parse_args()

    shape = model_shape(args.quick)
    memory = DeviceMemory().start()
    rates = {} if args.quick else ceilings("cupy")
    for keep in args.keep:
        free_pool()
        memory.reset_peak()
        ops = () if keep == "none" else tuple(filter(None, keep.split(",")))
        r = step_seconds(shape, args.quick, ops, 1 if args.quick else args.repeats)
        flops = training_flops(shape, r["num_params"], *((QUICK if args.quick else (SEQS, SEQLEN, MICRO))[:2]))
        tflops = flops / r["step_s"] / 1e12
        metrics = {**r, "tokens_per_s": r["tokens"] / r["step_s"], "tflops": tflops, "useful_flop": flops,
                   "mfu_measured": tflops / rates["matmul_tflops"] if rates else None,
                   "mfu_spec": tflops / SPEC_BF16_TFLOPS, **rates, "peak_gib": memory.peak_gib()}
        settings = {"recompute": "per layer", "keep": keep, "micro_batch": MICRO, "optimizer": (
            "AdamW, fp32 master + moments + gradients, bf16 working weights, weight decay 0, clip 1.0"),
            "head": "fused (backward inside forward)"}
        print(f"T1 barerl keep={keep}: {r['step_s']:.3f} s, {tflops:.0f} TFLOP/s"
              + (f", MFU {metrics['mfu_measured']:.1%} of measured" if rates else ""), flush=True)
        label = {"none": "recomputes all", "attention": "keeps attention (default)"}.get(keep, f"keeps {keep}")
        write_record(args.out, f"barerl-keep-{keep.replace(',', '-')}", "T1", "barerl", label, settings, metrics)
    memory.stop()


if __name__ == "__main__":
    main()
