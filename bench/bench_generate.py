"""Workloads G1, G2 and G3 (shared/WORKLOADS.md): generation with random bf16 weights (sizes: bench/shapes.py).

G1: Qwen3-0.6B, 8 prompts x 8 samples (64 sequences), 128-token prompts, 1,024 new tokens each; G2: 256 prompts x
1 sample, 128-token prompts, 512 new tokens; G3: Qwen3-4B, 8 x 8, 256-token prompts, 4,096 new tokens. `--shape`
runs a workload's sizes on another model shape. Temperature 1, ignore EOS, so every sequence runs to its length.
barerl's engine (decode replayed from CUDA graphs) and transformers' `generate` (the peer, warmed up with a
call of the same shape first) run in the same process on the same GPU. Prints new tokens/s, ms per decode
step, peak GPU memory, the fraction of the HBM-bandwidth floor reached (weights + live KV read once per step
over the device-to-device copy bandwidth measured here), the decode's FLOP rate against the bf16 matrix rate
measured here and the datasheet's, and barerl / transformers; writes the rows as CSV.

    PYTHONPATH=src python bench/bench_generate.py [--workloads G1 G2 G3] [--shape SHAPE] [--quick] [--no-peer]
        [--csv FILE] [--num-scheduler-steps 1 8] [--async-scheduling on off]
"""

from __future__ import annotations

import argparse
import csv
import dataclasses
import time

import numpy as np
from bench_train_step import matmul_rate
from shapes import GENERATION, SHAPES, decode_floor_seconds, decode_flops, model_config, utilisation

DEFAULT_LOOKAHEAD = 8  # the engine's default num_scheduler_steps (EngineConfig)


def copy_bandwidth() -> float:
    """Bytes read + written per second by a 1 GiB device-to-device copy (median of 10)."""
    import cupy

    a = cupy.ones(1 << 30, np.uint8)
    b = cupy.empty_like(a)
    times = []
    for _ in range(11):
        start, end = cupy.cuda.Event(), cupy.cuda.Event()
        start.record()
        b[...] = a
        end.record()
        end.synchronize()
        times.append(cupy.cuda.get_elapsed_time(start, end) / 1e3)
    return 2 * a.nbytes / float(np.median(times[1:]))


def bench_barerl(cfg, prompts: list[list[int]], samples: int, new_tokens: int,
                 num_scheduler_steps: int = DEFAULT_LOOKAHEAD, async_scheduling: bool = True,
                 batch_invariant: bool = False) -> dict:
    import cupy

    from barerl.engine.cuda_graph_runner import CudaGraphRunner
    from barerl.engine.llm import LLM
    from barerl.engine.sampling_params import SamplingParams
    from barerl.model.model import Model

    model = Model.random(cfg, device="cuda", dtype="bfloat16", seed=0)
    seqs = len(prompts) * samples
    llm = LLM(model, max_num_seqs=seqs, max_model_len=len(prompts[0]) + new_tokens, gpu_memory_utilization=0.6,
              num_scheduler_steps=num_scheduler_steps, async_scheduling=async_scheduling,
              batch_invariant=batch_invariant)
    assert isinstance(llm.runner, CudaGraphRunner), "the engine should replay decode steps from CUDA graphs"
    params = SamplingParams(n=samples, temperature=1.0, max_tokens=new_tokens, ignore_eos=True, seed=0)
    warm = SamplingParams(n=samples, temperature=1.0, max_tokens=16, ignore_eos=True, seed=1)
    llm.generate(prompts, warm, use_tqdm=False)  # compiles kernels, captures the graphs
    cupy.cuda.Device().synchronize()
    start = time.perf_counter()
    outputs = llm.generate(prompts, params, use_tqdm=False)
    seconds = time.perf_counter() - start
    free, total = cupy.cuda.runtime.memGetInfo()
    generated = sum(len(o.token_ids) for r in outputs for o in r.outputs)
    result = {"system": "barerl", "seconds": seconds, "new_tokens": generated,
              "peak_gib": (total - free) / 2**30,  # held: weights, KV cache (60% of memory), pool
              "stats": dict(llm.stats), "cfg": cfg, "num_params": cfg.num_parameters()}
    del llm, model, outputs
    cupy.get_default_memory_pool().free_all_blocks()
    return result


def bench_transformers(shape: str, prompts: list[list[int]], samples: int, new_tokens: int) -> dict:
    import torch
    import transformers

    config = transformers.Qwen3Config(**{k: v for k, v in SHAPES[shape].items() if k != "architectures"})
    torch.manual_seed(0)
    model = transformers.AutoModelForCausalLM.from_config(config, dtype=torch.bfloat16).cuda().eval()
    ids = torch.tensor(prompts, device="cuda").repeat_interleave(samples, dim=0)

    def generate(model):
        with torch.no_grad():
            return model.generate(ids, attention_mask=torch.ones_like(ids), do_sample=True, temperature=1.0,
                                  top_k=0, top_p=1.0, max_new_tokens=new_tokens, min_new_tokens=new_tokens,
                                  pad_token_id=0)

    generate(model)  # same shape first: a cold allocator makes the first call 2-3x slower (GPU_FACTS.md)
    torch.cuda.synchronize()
    torch.cuda.reset_peak_memory_stats()
    start = time.perf_counter()
    out = generate(model)
    torch.cuda.synchronize()
    seconds = time.perf_counter() - start
    result = {"system": "transformers", "seconds": seconds,
              "new_tokens": (out.shape[1] - ids.shape[1]) * len(ids),
              "peak_gib": torch.cuda.max_memory_allocated() / 2**30}
    del model, out
    torch.cuda.empty_cache()
    return result


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--workloads", nargs="+", default=["G1", "G2"], choices=list(GENERATION))
    parser.add_argument("--shape", default=None, choices=list(SHAPES),
                        help="model shape (default: each workload's own, bench/shapes.py)")
    parser.add_argument("--quick", action="store_true", help="128 new tokens per sequence: a fast check")
    parser.add_argument("--no-peer", action="store_true", help="skip transformers")
    parser.add_argument("--num-scheduler-steps", type=int, nargs="+", default=[DEFAULT_LOOKAHEAD],
                        help="barerl decode steps per graph launch (lookahead); one row per value")
    parser.add_argument("--async-scheduling", nargs="+", default=["on"], choices=["on", "off"],
                        help="barerl's async_scheduling; one row per value (and lookahead)")
    parser.add_argument("--batch-invariant", nargs="+", default=["off"], choices=["on", "off"],
                        help="barerl's batch_invariant; one row per value (and lookahead, async mode)")
    parser.add_argument("--csv", default="bench_generate.csv")
    args = parser.parse_args()

    import cupy

    bandwidth, tflops = copy_bandwidth(), matmul_rate(cupy)
    print(f"device-to-device copy: {bandwidth / 1e12:.2f} TB/s; bf16 matrix rate {tflops:.0f} TFLOP/s")
    rows = []
    for name in args.workloads:
        work = GENERATION[name]
        work = dataclasses.replace(work, shape=args.shape or work.shape, new_tokens=128 if args.quick else
                                   work.new_tokens)
        num_prompts, samples, new_tokens = work.prompts, work.samples, work.new_tokens
        cfg = model_config(work.shape)
        rng = np.random.default_rng(0)
        prompts = rng.integers(0, cfg.vocab_size, (num_prompts, work.prompt_len)).tolist()
        results = []
        variants = [(k, m, b) for k in args.num_scheduler_steps for m in args.async_scheduling
                    for b in args.batch_invariant]
        for steps, mode, invariant in variants:
            ours = bench_barerl(cfg, prompts, samples, new_tokens, steps, mode == "on", invariant == "on")
            ours["system"] = ("barerl" + ("" if steps == DEFAULT_LOOKAHEAD else f" lookahead {steps}")
                              + ("" if mode == "on" else " sync") + (" invariant" if invariant == "on" else ""))
            print(f"{name} {ours['system']} engine stats: {ours['stats']}", flush=True)
            results.append(ours)
        bound = decode_floor_seconds(cfg, work, bandwidth)
        print(f"{name} ({work.shape}, {num_prompts} x {samples} x {new_tokens} new tokens): HBM floor "
              f"{bound:.2f} s ({1e3 * bound / new_tokens:.2f} ms per step, {num_prompts * samples * new_tokens / bound:.0f} "
              "new tok/s)", flush=True)
        results += [] if args.no_peer else [bench_transformers(work.shape, prompts, samples, new_tokens)]
        for r in results:
            rows.append({"workload": name, "system": r["system"], "new_tok_s": r["new_tokens"] / r["seconds"],
                         "ms_per_step": 1e3 * r["seconds"] / new_tokens, "peak_gib": r["peak_gib"],
                         "of_hbm_bound": bound / r["seconds"], "seconds": r["seconds"]})
            print(f"{name} {r['system']}: {rows[-1]['new_tok_s']:.0f} new tok/s, {rows[-1]['ms_per_step']:.2f} "
                  f"ms/step, {100 * rows[-1]['of_hbm_bound']:.1f}% of the HBM floor, "
                  f"{utilisation(decode_flops(cfg, work), r['seconds'], tflops)}, peak {r['peak_gib']:.1f} GiB",
                  flush=True)
        if not args.no_peer:
            for r in rows[-len(results):-1]:
                r["ratio_vs_transformers"] = r["new_tok_s"] / rows[-1]["new_tok_s"]

    print(f"\n{'workload':8s} {'system':20s} {'new tok/s':>10s} {'ms/step':>8s} {'peak GiB':>9s} "
          f"{'% HBM bound':>12s} {'x transformers':>15s}")
    for r in rows:
        ratio = f"{r['ratio_vs_transformers']:.1f}x" if "ratio_vs_transformers" in r else ""
        print(f"{r['workload']:8s} {r['system']:20s} {r['new_tok_s']:10.0f} {r['ms_per_step']:8.2f} "
              f"{r['peak_gib']:9.1f} {100 * r['of_hbm_bound']:11.1f}% {ratio:>15s}")
    with open(args.csv, "w", newline="") as f:
        writer = csv.DictWriter(f, fieldnames=["workload", "system", "new_tok_s", "ms_per_step", "peak_gib",
                                               "of_hbm_bound", "seconds", "ratio_vs_transformers"])
        writer.writeheader()
        writer.writerows(rows)


if __name__ == "__main__":
    main()
