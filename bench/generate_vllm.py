"""Workloads G1, G2 and G3 on vLLM (the generation peer): the same model shape, prompt lengths, sampling and
counts as generate_barerl.py (`--workload`, `--shape`: shapes.py), from a folder written beforehand by
make_model.py (of the workload's shape: G3's is `make_model.py DIR --shape qwen3-4b`).

vLLM runs as a user would run it for offline generation: `LLM(model, dtype="bfloat16")` with its defaults
(CUDA graphs, torch.compile, prefix caching, chunked prefill; FlashAttention 3 on an H200), the same
gpu_memory_utilization as barerl (0.6), token-id prompts and no detokenization. Per workload: a warm-up call of
the same shape, then timed calls on fresh prompts. Recorded: new tokens/s, the engine's startup time, the
settings vLLM resolved (read back from its config), the HBM floor and the fraction of it reached (as
generate_barerl.py counts it), peak device memory (common.DeviceMemory) and the cold start: seconds from process
start to the engine being ready and to the first generated token. max_model_len is 2,048 (as G1 and G2 have
always run), or a longer workload's whole length (G3: 4,352).
`VLLM_USE_FLASHINFER_SAMPLER=0` is set (flashinfer is not installed on the measuring machine).

    python bench/generate_vllm.py --model DIR [--workload G1 G2 | G3] [--shape SHAPE] [--quick] [--out DIR]
"""

from __future__ import annotations

import json
import os
import time
from pathlib import Path

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

os.environ.setdefault("VLLM_USE_FLASHINFER_SAMPLER", "0")
os.environ.setdefault("VLLM_NO_USAGE_STATS", "1")
GPU_MEMORY_UTILIZATION = 0.6


def resolved_settings(llm) -> dict:
    """The settings vLLM chose, read from its engine config (missing fields are left out)."""
    fields = {"max_num_seqs": "scheduler_config.max_num_seqs",
              "max_num_batched_tokens": "scheduler_config.max_num_batched_tokens",
              "async_scheduling": "scheduler_config.async_scheduling",
              "enable_chunked_prefill": "scheduler_config.enable_chunked_prefill",
              "enable_prefix_caching": "cache_config.enable_prefix_caching",
              "block_size": "cache_config.block_size", "kv_cache_dtype": "cache_config.cache_dtype",
              "num_gpu_blocks": "cache_config.num_gpu_blocks", "enforce_eager": "model_config.enforce_eager",
              "compilation_mode": "compilation_config.mode", "cudagraph_mode": "compilation_config.cudagraph_mode",
              "attention_backend": "attention_config.backend"}
    config = getattr(getattr(llm, "llm_engine", None), "vllm_config", None)
    found = {}
    for key, path in fields.items():
        value = config
        for part in path.split("."):
            value = getattr(value, part, None)
        if value is not None:
            found[key] = value if isinstance(value, (bool, int, float)) else str(value)
    return found


def random_token_prompts(vocab_size: int, count: int, length: int, seed: int):
    import numpy as np
    from vllm.inputs import TokensPrompt

    ids = np.random.default_rng(seed).integers(2, vocab_size, (count, length)).tolist()
    return [TokensPrompt(prompt_token_ids=p) for p in ids]


def run_workload(llm, vocab: int, key: str, work: Generation, args) -> dict:
    """A warm-up call of the workload's shape, then the timed calls on fresh prompts."""
    from vllm import SamplingParams

    params = SamplingParams(n=work.samples, temperature=1.0, max_tokens=work.new_tokens, ignore_eos=True,
                            detokenize=False)
    llm.generate(random_token_prompts(vocab, work.prompts, work.prompt_len, 1), params, use_tqdm=False)
    each = timed_runs(lambda trial: random_token_prompts(vocab, work.prompts, work.prompt_len, 10 + trial),
                      lambda prompts: sum(len(c.token_ids) for o in llm.generate(prompts, params, use_tqdm=False)
                                          for c in o.outputs), args.timed, f"{key} vLLM")
    return {"new_tok_s": max(each), "new_tok_s_each": each, "new_tokens": work.sequences * work.new_tokens,
            "ms_per_step": 1e3 * work.sequences / max(each)}


def main() -> None:
    parser = generation_parser(__doc__, timed=2)
    parser.add_argument("--model", required=True, help="a folder written by make_model.py")
    args = parser.parse_args()
    works = generation_workloads(parser, args)
    first = next(iter(works.values()))
    check_model_folder(args.model, shape_dict(first.shape, args.quick))
    max_model_len = max(2048, *(w.prompt_len + w.new_tokens for w in works.values()))

    caches = caches_at_start()
    memory = DeviceMemory().start()
    import vllm
    from vllm import LLM, SamplingParams

    start = time.perf_counter()
    llm = LLM(model=args.model, dtype="bfloat16", skip_tokenizer_init=True, seed=0, max_model_len=max_model_len,
              gpu_memory_utilization=GPU_MEMORY_UTILIZATION)
    startup_s = time.perf_counter() - start
    ready_s = since_process_start()
    vocab = json.loads((Path(args.model) / "config.json").read_text())["vocab_size"]
    one = SamplingParams(max_tokens=1, ignore_eos=True, detokenize=False)
    llm.generate(random_token_prompts(vocab, 1, first.prompt_len, 99), one, use_tqdm=False)
    first_token_s = since_process_start()
    settings = {"gpu_memory_utilization": GPU_MEMORY_UTILIZATION, "dtype": "bfloat16", "max_model_len": max_model_len,
                "VLLM_USE_FLASHINFER_SAMPLER": os.environ["VLLM_USE_FLASHINFER_SAMPLER"], **resolved_settings(llm)}
    print(f"vLLM {vllm.__version__}: startup {startup_s:.1f} s; settings {settings}", flush=True)
    rates = ceilings("torch")
    for i, (key, work) in enumerate(works.items()):
        memory.reset_peak()
        metrics = {**run_workload(llm, vocab, key, work, args), "startup_s": startup_s, **rates,
                   "peak_gib": memory.peak_gib()}
        if i == 0:
            metrics.update(cold_start_engine_ready_s=ready_s, cold_start_first_token_s=first_token_s,
                           caches_at_start=caches)
        if rates:
            report_generation_floor(key, work, metrics, rates["copy_tbs"], "vLLM")
        label = f"defaults (CUDA graphs, torch.compile, {settings.get('attention_backend', 'its attention backend')})"
        write_record(args.out, "vllm", key, f"vLLM {vllm.__version__}", label, settings, metrics, ("vllm", "torch"))
    memory.stop()


if __name__ == "__main__":  # vLLM starts its engine core with multiprocessing spawn: the guard is needed
    main()
