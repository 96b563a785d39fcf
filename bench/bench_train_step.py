"""Workload T1 (shared/WORKLOADS.md): one optimizer step of the Qwen3-0.6B architecture on 64 packed
sequences of 1,152 tokens (73,728 tokens), forward + backward with per-layer recomputation + AdamW.

Prints barerl's step time, tokens/s, TFLOP/s and MFU (against an 8192^3 bf16 product measured in the same
run), peak GPU memory and phase times, then the same for torch + transformers (bf16 weights, gradient
checkpointing, fused AdamW, micro-batch 16) and the ratio. The loss is SFT-like (d loss / d log-prob =
-1/n at every token), so barerl's LM head runs each chunk's backward inside its forward unless
--unfused-head (the forward, then the backward recomputing the logits). Usage:
python bench/bench_train_step.py [--quick] [--unfused-head]
"""

from __future__ import annotations

import argparse
import json
import time

import numpy as np

QWEN3_06B = {
    "architectures": ["Qwen3ForCausalLM"], "vocab_size": 151936, "hidden_size": 1024, "intermediate_size": 3072,
    "num_hidden_layers": 28, "num_attention_heads": 16, "num_key_value_heads": 8, "head_dim": 128,
    "rms_norm_eps": 1e-6, "rope_theta": 1e6, "tie_word_embeddings": True, "max_position_embeddings": 40960,
}


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


def training_flops(cfg: dict, num_params: int, seqs: int, seqlen: int) -> float:
    tokens = seqs * seqlen
    attention = 3 * (4 * seqlen**2 / 2 * cfg["head_dim"] * cfg["num_attention_heads"]) * cfg["num_hidden_layers"]
    return 6 * num_params * tokens + attention * seqs


def bench_barerl(cfg_dict: dict, seqs: int, seqlen: int, micro: int, repeats: int, keep=("attention",),
                 fused_head: bool = True) -> dict:
    import cupy as cp

    from barerl.config import ModelConfig
    from barerl.model.model import Model, PackedBatch
    from barerl.train.optimizer import AdamW

    cp.get_default_memory_pool().free_all_blocks()  # a variant's peak is its own: not the last one's cache
    cfg = ModelConfig.from_dict(cfg_dict, source="Qwen3-0.6B shape")
    model = Model.random(cfg, device="cuda", dtype="bfloat16", seed=0)
    optimizer = AdamW(model.params, model.backend, weight_decay=0.0, max_grad_norm=1.0)
    rng = np.random.default_rng(1)
    batches = [PackedBatch.from_sequences(rng.integers(0, cfg.vocab_size, (micro, seqlen)).tolist())
               for _ in range(seqs // micro)]
    n = float(seqs * (seqlen - 1))

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


def bench_torch(cfg_dict: dict, seqs: int, seqlen: int, micro: int, repeats: int) -> dict:
    import torch
    import transformers

    config = transformers.Qwen3Config(**{k: v for k, v in cfg_dict.items() if k != "architectures"})
    torch.manual_seed(0)
    model = transformers.AutoModelForCausalLM.from_config(config, dtype=torch.bfloat16).cuda()
    model.gradient_checkpointing_enable()
    model.config.use_cache = False
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-5, fused=True)
    ids = torch.randint(0, cfg_dict["vocab_size"], (seqs, seqlen), device="cuda")

    def step() -> float:
        torch.cuda.synchronize()
        t0 = time.perf_counter()
        optimizer.zero_grad(set_to_none=True)
        for i in range(0, seqs, micro):
            chunk = ids[i : i + micro]
            (model(input_ids=chunk, labels=chunk).loss * micro / seqs).backward()
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
    parser.add_argument("--quick", action="store_true", help="8 sequences, 1 repeat (a smoke test)")
    parser.add_argument("--skip-torch", action="store_true")
    parser.add_argument("--keep", nargs="+", default=["attention"], metavar="OPS",
                        help="ops kept through recomputation, comma-separated; several sets: one barerl row each "
                             "(the first is the row named barerl)")
    parser.add_argument("--unfused-head", action="store_true",
                        help="the LM head's backward after the loss, recomputing each chunk's logits")
    parser.add_argument("--json", default=None, help="also write the results to this file")
    args = parser.parse_args()
    seqs, seqlen, micro, repeats = (8, 1152, 8, 1) if args.quick else (64, 1152, 16, 3)
    import cupy as cp

    rate = matmul_rate(cp)
    variants = []
    for i, keep in enumerate(args.keep):
        ops = tuple(filter(None, keep.split(",")))
        variants.append(bench_barerl(QWEN3_06B, seqs, seqlen, micro, repeats, ops, not args.unfused_head))
        if i:
            variants[-1]["system"] = f"barerl, keeps {keep}"
    ours = variants[0]
    flops = training_flops(QWEN3_06B, ours["num_params"], seqs, seqlen)
    peer = None if args.skip_torch else bench_torch(QWEN3_06B, seqs, seqlen, micro, repeats)
    rows = variants + ([] if peer is None else [peer])
    print(f"T1: {seqs} x {seqlen} tokens, Qwen3-0.6B shape, bf16 matmul ceiling {rate:.0f} TFLOP/s")
    print(f"{'system':<32}{'step s':>9}{'tok/s':>10}{'TFLOP/s':>9}{'MFU':>7}{'peak GiB':>10}")
    for r in rows:
        r["tokens_per_s"] = seqs * seqlen / r["step_s"]
        r["tflops"] = flops / r["step_s"] / 1e12
        r["mfu"] = r["tflops"] / rate
        print(f"{r['system']:<32}{r['step_s']:>9.3f}{r['tokens_per_s']:>10.0f}{r['tflops']:>9.1f}"
              f"{r['mfu']:>7.1%}{r['peak_gib']:>10.1f}")
    print(f"barerl phases: forward (no-grad pass) {ours['forward_s']:.3f}s, forward+backward "
          f"{ours['fwd_bwd_s']:.3f}s, optimizer {ours['optimizer_s']:.3f}s")
    for r in variants if peer is not None else []:
        print(f"speed ratio {r['system']} / torch+transformers: {peer['step_s'] / r['step_s']:.2f}x")
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"matmul_tflops": rate, "rows": rows}, f, indent=1)


if __name__ == "__main__":
    main()
