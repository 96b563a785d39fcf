"""Workloads G1, G2 and G3 (generation) on barerl's engine, random bf16 weights (sizes: shapes.py).

G1: Qwen3-0.6B, 8 prompts x 8 samples (64 sequences), 128-token prompts, 1,024 new tokens each; G2: Qwen3-0.6B,
256 prompts x 1 sample, 128-token prompts, 512 new tokens; G3: Qwen3-4B, 8 x 8, 256-token prompts, 4,096 new
tokens (one process runs one model shape: G3 alone; `--shape` runs a workload's sizes on another shape).
Temperature 1, ignore EOS, so every sequence runs to its length. Per workload: a warm-up call of the same shape
(compiles kernels, captures the decode graphs), then timed calls on fresh prompts. Prints and records new
tokens/s, ms per decode step, the HBM-bandwidth floor and the fraction of it reached (weights + live KV read
once per step, over the copy bandwidth measured in this process), peak device memory (common.DeviceMemory) and
the cold start: seconds from process start to the first generated token (one prompt, one token, before anything
else touches the GPU). Peers: generate_vllm.py, generate_transformers.py.

    PYTHONPATH=src python bench/generate_barerl.py [--workload G1 G2 | G3] [--shape SHAPE] [--quick] [--out DIR]
        [--model DIR] [--num-scheduler-steps 8] [--batch-invariant off] [--timed 2]
"""

from __future__ import annotations

import time

from common import (
    DeviceMemory,
    caches_at_start,
    ceilings,
    check_model_folder,
    generation_parser,
    generation_workloads,
    report_generation_floor,
    since_process_start,
    timed_runs,
    write_record,
)
from shapes import Generation, shape_dict


def barerl_api():
    """barerl's entry points used here (one place, for the layout move)."""
    from barerl import LLM, SamplingParams
    from barerl.config import ModelConfig
    from barerl.model.model import Model

    return LLM, SamplingParams, ModelConfig, Model


def random_prompts(vocab_size: int, count: int, length: int, seed: int) -> list[list[int]]:
    import numpy as np

    return np.random.default_rng(seed).integers(2, vocab_size, (count, length)).tolist()


def run_workload(model, key: str, work: Generation, args, first_in_process: bool) -> dict:
    LLM, SamplingParams, _, _ = barerl_api()
    seqs, new_tokens, length = work.sequences, work.new_tokens, work.prompt_len
    start = time.perf_counter()
    llm = LLM(model, max_num_seqs=seqs, max_model_len=length + new_tokens, gpu_memory_utilization=0.6,
              num_scheduler_steps=args.num_scheduler_steps, batch_invariant=args.batch_invariant == "on")
    vocab, metrics = model.cfg.vocab_size, {}
    if first_in_process:  # the first token of this process: one prompt, one token
        llm.generate(random_prompts(vocab, 1, length, 99), SamplingParams(max_tokens=1, ignore_eos=True),
                     use_tqdm=False)
        metrics["cold_start_first_token_s"] = since_process_start()
    params = SamplingParams(n=work.samples, temperature=1.0, max_tokens=new_tokens, ignore_eos=True, seed=0)
    llm.generate(random_prompts(vocab, work.prompts, length, 1), params, use_tqdm=False)  # compiles, captures
    warm_s = time.perf_counter() - start
    rates = timed_runs(lambda trial: random_prompts(vocab, work.prompts, length, 10 + trial),
                       lambda prompts: sum(len(o.token_ids) for r in llm.generate(prompts, params, use_tqdm=False)
                                           for o in r.outputs), args.timed, f"{key} barerl")
    return {**metrics, "new_tok_s": max(rates), "new_tok_s_each": rates, "new_tokens": seqs * new_tokens,
            "ms_per_step": 1e3 * seqs / max(rates), "engine_start_and_warmup_s": warm_s}


def load_model(args, shape: str):
    """The benchmark model: from make_model.py's folder (what the peers load too) or made here, random."""
    _, _, ModelConfig, Model = barerl_api()
    device, dtype = ("cpu", "float32") if args.quick else ("cuda", "bfloat16")
    if args.model:
        check_model_folder(args.model, shape_dict(shape, args.quick))
        return Model.from_pretrained(args.model, device=device, dtype=dtype)
    cfg = ModelConfig.from_dict(shape_dict(shape, args.quick), source=f"{shape} shape")
    return Model.random(cfg, device=device, dtype=dtype, seed=0)


def main() -> None:
    parser = generation_parser(__doc__, timed=2)
    parser.add_argument("--model", default=None, help="a folder written by make_model.py (default: random weights)")
    parser.add_argument("--num-scheduler-steps", type=int, default=8, help="decode steps per graph launch")
    parser.add_argument("--batch-invariant", default="off", choices=("on", "off"),
                        help="the engine's batch_invariant (GRPO turns it on; plain generation leaves it off)")
    args = parser.parse_args()
    works = generation_workloads(parser, args)

    caches = caches_at_start()
    memory = DeviceMemory().start()
    model = load_model(args, next(iter(works.values())).shape)
    runs = {}
    for i, (key, work) in enumerate(works.items()):
        memory.reset_peak()
        runs[key] = run_workload(model, key, work, args, first_in_process=i == 0)
        runs[key]["peak_gib"] = memory.peak_gib()
        pool = getattr(model.xp, "get_default_memory_pool", None)
        if pool is not None:  # the engine is gone: the next workload's starts from an empty pool
            pool().free_all_blocks()
    memory.stop()
    rates = {} if args.quick else ceilings("cupy")  # after the timed work: the cold start is not delayed by it
    settings = {"num_scheduler_steps": args.num_scheduler_steps, "batch_invariant": args.batch_invariant,
                "async_scheduling": True, "cuda_graphs": not args.quick, "gpu_memory_utilization": 0.6,
                "dtype": str(model.dtype), "weights": args.model or "random (seed 0)"}
    label = f"CUDA graphs, {args.num_scheduler_steps} decode steps a launch" + (
        ", batch_invariant" if args.batch_invariant == "on" else "")
    for i, (key, metrics) in enumerate(runs.items()):
        if i == 0:
            metrics["caches_at_start"] = caches
        if rates:
            report_generation_floor(key, works[key], metrics, rates["copy_tbs"], "barerl")
        write_record(args.out, "barerl", key, "barerl", label, settings, {**metrics, **rates})


if __name__ == "__main__":
    main()
