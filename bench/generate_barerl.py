"""Workloads G1 and G2 (generation) on barerl's engine: the Qwen3-0.6B architecture with random bf16 weights.

G1: 8 prompts x 8 samples (64 sequences), 128-token prompts, 1,024 new tokens each; G2: 256 prompts x 1 sample,
128-token prompts, 512 new tokens. Temperature 1, ignore EOS, so every sequence runs to its length. Per
workload: a warm-up call of the same shape (compiles kernels, captures the decode graphs), then timed calls on
fresh prompts. Prints and records new tokens/s, ms per decode step, the fraction of the HBM-bandwidth bound
(weights + live KV read once per step, over the copy bandwidth measured in this process), peak device memory
(common.DeviceMemory) and the cold start: seconds from process start to the first generated token (one prompt,
one token, before anything else touches the GPU). Peers: generate_vllm.py, generate_transformers.py.

    PYTHONPATH=src python bench/generate_barerl.py [--workloads G1 G2] [--quick] [--out DIR]
        [--num-scheduler-steps 8] [--batch-invariant off] [--timed 2]
"""

from __future__ import annotations

import time

from common import (
    GENERATION,
    PROMPT_LEN,
    QUICK_NEW_TOKENS,
    DeviceMemory,
    caches_at_start,
    ceilings,
    generation_parser,
    model_shape,
    since_process_start,
    timed_runs,
    write_record,
)


def barerl_api():
    """barerl's entry points used here (one place, for the layout move)."""
    from barerl import LLM, SamplingParams
    from barerl.config import ModelConfig
    from barerl.model.model import Model

    return LLM, SamplingParams, ModelConfig, Model


def hbm_bound_seconds(shape: dict, num_params: int, seqs: int, new_tokens: int, copy_tbs: float) -> float:
    """Time to read all weights and every live token's K and V once per decode step at the copy bandwidth."""
    kv_per_token = 2 * shape["num_hidden_layers"] * shape["num_key_value_heads"] * shape["head_dim"] * 2
    context_tokens = seqs * (new_tokens * PROMPT_LEN + new_tokens * (new_tokens - 1) / 2)
    return (new_tokens * num_params * 2 + context_tokens * kv_per_token) / (copy_tbs * 1e12)


def random_prompts(vocab_size: int, count: int, seed: int) -> list[list[int]]:
    import numpy as np

    return np.random.default_rng(seed).integers(2, vocab_size, (count, PROMPT_LEN)).tolist()


def run_workload(model, name: str, quick: bool, args, first_in_process: bool) -> dict:
    LLM, SamplingParams, _, _ = barerl_api()
    num_prompts, samples, new_tokens = GENERATION[name]
    new_tokens = QUICK_NEW_TOKENS if quick else new_tokens
    seqs = num_prompts * samples
    start = time.perf_counter()
    llm = LLM(model, max_num_seqs=seqs, max_model_len=PROMPT_LEN + new_tokens, gpu_memory_utilization=0.6,
              num_scheduler_steps=args.num_scheduler_steps, batch_invariant=args.batch_invariant == "on")
    vocab, metrics = model.cfg.vocab_size, {}
    if first_in_process:  # the first token of this process: one prompt, one token
        llm.generate(random_prompts(vocab, 1, 99), SamplingParams(max_tokens=1, ignore_eos=True), use_tqdm=False)
        metrics["cold_start_first_token_s"] = since_process_start()
    params = SamplingParams(n=samples, temperature=1.0, max_tokens=new_tokens, ignore_eos=True, seed=0)
    llm.generate(random_prompts(vocab, num_prompts, 1), params, use_tqdm=False)  # same shape: compiles, captures
    warm_s = time.perf_counter() - start
    rates = timed_runs(lambda trial: random_prompts(vocab, num_prompts, 10 + trial),
                       lambda prompts: sum(len(o.token_ids) for r in llm.generate(prompts, params, use_tqdm=False)
                                           for o in r.outputs), args.timed, f"{name} barerl")
    return {**metrics, "new_tok_s": max(rates), "new_tok_s_each": rates, "new_tokens": seqs * new_tokens,
            "ms_per_step": 1e3 * seqs / max(rates), "engine_start_and_warmup_s": warm_s}


def load_model(args):
    """The benchmark model: from make_model.py's folder (what the peers load too) or made here, random."""
    _, _, ModelConfig, Model = barerl_api()
    device, dtype = ("cpu", "float32") if args.quick else ("cuda", "bfloat16")
    if args.model:
        return Model.from_pretrained(args.model, device=device, dtype=dtype)
    cfg = ModelConfig.from_dict(model_shape(args.quick), source="Qwen3-0.6B shape")
    return Model.random(cfg, device=device, dtype=dtype, seed=0)


def main() -> None:
    parser = generation_parser(__doc__, timed=2)
    parser.add_argument("--model", default=None, help="a folder written by make_model.py (default: random weights)")
    parser.add_argument("--num-scheduler-steps", type=int, default=8, help="decode steps per graph launch")
    parser.add_argument("--batch-invariant", default="off", choices=("on", "off"),
                        help="the engine's batch_invariant (GRPO turns it on; plain generation leaves it off)")
    args = parser.parse_args()

    caches = caches_at_start()
    memory = DeviceMemory().start()
    model = load_model(args)
    runs = {}
    for i, name in enumerate(args.workloads):
        memory.reset_peak()
        runs[name] = run_workload(model, name, args.quick, args, first_in_process=i == 0)
        runs[name]["peak_gib"] = memory.peak_gib()
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
    for i, (name, metrics) in enumerate(runs.items()):
        if i == 0:
            metrics["caches_at_start"] = caches
        if rates:
            num_prompts, samples, new_tokens = GENERATION[name]
            bound = hbm_bound_seconds(model_shape(False), model.cfg.num_parameters(), num_prompts * samples,
                                      new_tokens, rates["copy_tbs"])
            metrics["of_hbm_bound"] = bound * metrics["new_tok_s"] / metrics["new_tokens"]
        write_record(args.out, "barerl", name, "barerl", label, settings, {**metrics, **rates})


if __name__ == "__main__":
    main()
