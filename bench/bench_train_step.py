"""Workloads T1 and T2 (shared/WORKLOADS.md): one optimizer step, forward + backward with per-layer
recomputation + AdamW, random bf16 weights (sizes: bench/shapes.py). T1: Qwen3-0.6B, 64 packed sequences of
1,152 tokens (73,728 tokens), micro-batches of 16; T2: Qwen3-4B, 64 x 4,352 tokens (278,528), the loss on the
last 4,096 of each, micro-batches of 4. `--shape` runs a workload's sizes on another model shape.

Prints the floor (the useful FLOP at the matrix rate measured in the same run by an 8192^3 bf16 product),
barerl's step time, tokens/s, TFLOP/s, MFU (against that rate and against the 989 TFLOP/s datasheet), the
fraction of the floor and the peak GPU memory with phase times, then the same for torch + transformers (bf16
weights, gradient checkpointing, fused AdamW, the same micro-batches) and the ratio. The loss is SFT-like
(d loss / d log-prob = -1/n at every loss token), so barerl's LM head runs each chunk's backward inside its
forward unless --unfused-head (the forward, then the backward recomputing the logits). Usage:
python bench/bench_train_step.py [--workload T1|T2] [--shape SHAPE] [--quick] [--unfused-head]
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import time
from types import SimpleNamespace

import numpy as np
from shapes import QWEN3_06B, SHAPES, SPEC_BF16_TFLOPS, TRAINING, Training, model_config, training_flops

__all__ = ["QWEN3_06B", "matmul_rate"]  # for the other scripts


def matmul_rate(cp) -> float:
    """bf16 TFLOP/s of an 8192^3 product through CuPy (cuBLAS), median of 10."""
    import ml_dtypes

    n = 8192
    a = cp.asarray(np.random.default_rng(0).standard_normal((n, n), np.float32).astype(ml_dtypes.bfloat16))
    b = a.T.copy()
    for _ in range(3):
        a @ b
    times = []
    for _ in range(10):
        start, end = cp.cuda.Event(), cp.cuda.Event()
        start.record()
        a @ b
        end.record()
        end.synchronize()
        times.append(cp.cuda.get_elapsed_time(start, end) / 1e3)
    return 2 * n**3 / float(np.median(times)) / 1e12


def packed_batches(vocab_size: int, t: Training) -> list:
    """t.sequences random sequences in micro-batches of t.micro_batch, the loss on the last t.loss_tokens of each
    (every token when None)."""
    from barerl.model.model import PackedBatch

    rng = np.random.default_rng(1)
    trained = t.loss_tokens or t.seqlen
    mask = [0] * (t.seqlen - trained) + [1] * trained

    def batch():
        ids = rng.integers(0, vocab_size, (t.micro_batch, t.seqlen)).tolist()
        return PackedBatch.from_examples([SimpleNamespace(input_ids=s, loss_mask=mask) for s in ids])

    return [batch() for _ in range(t.sequences // t.micro_batch)]


def bench_barerl(t: Training, repeats: int, keep=("attention",), fused_head: bool = True) -> dict:
    import cupy as cp

    from barerl.model.model import Model
    from barerl.train.optimizer import AdamW

    cp.get_default_memory_pool().free_all_blocks()  # a variant's peak is its own: not the last one's cache
    cfg = model_config(t.shape)
    model = Model.random(cfg, device="cuda", dtype="bfloat16", seed=0)
    optimizer = AdamW(model.params, model.backend, weight_decay=0.0, max_grad_norm=1.0)
    batches = packed_batches(cfg.vocab_size, t)
    n = float(sum(b.num_loss_tokens for b in batches))

    def token_grad(logp, start, stop):
        return cp.full(stop - start, -1.0 / n, cp.float32)

    def loss_fn(logp, entropy):
        return float(-logp.sum()) / n, token_grad(logp, 0, logp.shape[0]), {}

    def step() -> dict:
        t0 = time.perf_counter()
        optimizer.zero_grad()
        loss = sum(model.forward_backward(b, loss_fn, optimizer.grads, checkpoint=True, keep_ops=keep,
                                          token_grad=token_grad if fused_head else None)[0]
                   for b in batches)
        cp.cuda.Device().synchronize()
        t1 = time.perf_counter()
        optimizer.step(1e-5)
        cp.cuda.Device().synchronize()
        return {"loss": loss, "fwd_bwd": t1 - t0, "optimizer": time.perf_counter() - t1}

    step()  # warm-up: kernel compilation, cuBLAS handles, pool growth
    runs = [step() for _ in range(repeats)]
    t0 = time.perf_counter()
    for b in batches:
        model.logprobs(b)
    cp.cuda.Device().synchronize()
    forward = time.perf_counter() - t0
    total = [r["fwd_bwd"] + r["optimizer"] for r in runs]
    return {"system": "barerl", "step_s": float(np.median(total)), "forward_s": forward,
            "fwd_bwd_s": float(np.median([r["fwd_bwd"] for r in runs])),
            "optimizer_s": float(np.median([r["optimizer"] for r in runs])),
            "peak_gib": cp.get_default_memory_pool().total_bytes() / 2**30, "loss": runs[-1]["loss"],
            "num_params": cfg.num_parameters(), "fused_head": fused_head}


def bench_torch(t: Training, repeats: int) -> dict:
    import torch
    import transformers

    config = transformers.Qwen3Config(**{k: v for k, v in SHAPES[t.shape].items() if k != "architectures"})
    seqs, seqlen, micro = t.sequences, t.seqlen, t.micro_batch
    torch.manual_seed(0)
    model = transformers.AutoModelForCausalLM.from_config(config, dtype=torch.bfloat16).cuda()
    model.gradient_checkpointing_enable()
    model.config.use_cache = False
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-5, fused=True)
    ids = torch.randint(0, config.vocab_size, (seqs, seqlen), device="cuda")

    def step() -> float:
        torch.cuda.synchronize()
        t0 = time.perf_counter()
        optimizer.zero_grad(set_to_none=True)
        for i in range(0, seqs, micro):
            chunk = ids[i : i + micro]
            labels = chunk.clone()
            labels[:, : seqlen - (t.loss_tokens or seqlen)] = -100  # no loss on the prompt part
            (model(input_ids=chunk, labels=labels).loss * micro / seqs).backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        optimizer.step()
        torch.cuda.synchronize()
        return time.perf_counter() - t0

    step()
    torch.cuda.reset_peak_memory_stats()
    times = [step() for _ in range(repeats)]
    result = {"system": "torch+transformers", "step_s": float(np.median(times)),
              "peak_gib": torch.cuda.max_memory_allocated() / 2**30}
    return result


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--workload", default="T1", choices=list(TRAINING))
    parser.add_argument("--shape", default=None, choices=list(SHAPES),
                        help="model shape (default: the workload's own, bench/shapes.py)")
    parser.add_argument("--micro-batch", type=int, default=None, help="sequences per forward/backward pass "
                        "(default: the workload's)")
    parser.add_argument("--quick", action="store_true", help="8 sequences, 1 repeat (a smoke test)")
    parser.add_argument("--skip-torch", action="store_true")
    parser.add_argument("--keep", nargs="+", default=["attention"], metavar="OPS",
                        help="ops kept through recomputation, comma-separated; several sets: one barerl row each "
                             "(the first is the row named barerl)")
    parser.add_argument("--unfused-head", action="store_true",
                        help="the LM head's backward after the loss, recomputing each chunk's logits")
    parser.add_argument("--json", default=None, help="also write the results to this file")
    args = parser.parse_args()
    t = TRAINING[args.workload]
    t = dataclasses.replace(t, shape=args.shape or t.shape, micro_batch=args.micro_batch or t.micro_batch)
    if args.quick:
        t = dataclasses.replace(t, sequences=8, micro_batch=min(t.micro_batch, 8))
    repeats = 1 if args.quick else 3
    seqs, seqlen = t.sequences, t.seqlen
    import cupy as cp

    rate = matmul_rate(cp)
    flops = training_flops(model_config(t.shape), t)
    variants = []
    for i, keep in enumerate(args.keep):
        ops = tuple(filter(None, keep.split(",")))
        variants.append(bench_barerl(t, repeats, ops, not args.unfused_head))
        if i:
            variants[-1]["system"] = f"barerl, keeps {keep}"
    ours = variants[0]
    peer = None if args.skip_torch else bench_torch(t, repeats)
    rows = variants + ([] if peer is None else [peer])
    floor = flops / (rate * 1e12)
    print(f"{args.workload}: {seqs} x {seqlen} tokens ({t.loss_tokens or seqlen} with a loss each), {t.shape} shape, "
          f"micro-batches of {t.micro_batch}; bf16 matmul rate {rate:.0f} TFLOP/s: floor {floor:.2f} s "
          f"({flops:.3g} FLOP)")
    print(f"{'system':<32}{'step s':>9}{'tok/s':>10}{'TFLOP/s':>9}{'MFU':>7}{'of spec':>8}{'of floor':>9}"
          f"{'peak GiB':>10}")
    for r in rows:
        r["tokens_per_s"] = seqs * seqlen / r["step_s"]
        r["tflops"] = flops / r["step_s"] / 1e12
        r["mfu"] = r["tflops"] / rate
        r["of_spec"] = r["tflops"] / SPEC_BF16_TFLOPS
        r["of_floor"] = floor / r["step_s"]
        print(f"{r['system']:<32}{r['step_s']:>9.3f}{r['tokens_per_s']:>10.0f}{r['tflops']:>9.1f}"
              f"{r['mfu']:>7.1%}{r['of_spec']:>8.1%}{r['of_floor']:>9.1%}{r['peak_gib']:>10.1f}")
    print(f"barerl phases: forward (no-grad pass) {ours['forward_s']:.3f}s, forward+backward "
          f"{ours['fwd_bwd_s']:.3f}s, optimizer {ours['optimizer_s']:.3f}s")
    for r in variants if peer is not None else []:
        print(f"speed ratio {r['system']} / torch+transformers: {peer['step_s'] / r['step_s']:.2f}x")
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"matmul_tflops": rate, "rows": rows}, f, indent=1)


if __name__ == "__main__":
    main()
