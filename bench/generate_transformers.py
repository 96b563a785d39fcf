"""Workloads G1, G2 and G3 on transformers' `generate` (a generation peer), in one of two settings:

- `compiled` (its best): a static KV cache (`cache_implementation="static"`), with which `generate` compiles
  the decoding forward itself (torch.compile with transformers' CompileConfig: fullgraph, mode
  "reduce-overhead", i.e. CUDA graphs);
- `default`: the growing dynamic cache, eager.

Same model shape (random bf16 weights, torch seed 0), prompt length, sampling (temperature 1, no top-k / top-p)
and counts as generate_barerl.py (`--workload`, `--shape`: shapes.py); every sequence is held to its length
(min_new_tokens). A warm-up call of the same shape first (compilation happens there; in a process whose
allocator is cold the first eager run is 2-3x slower), then timed calls on fresh prompts. Records new tokens/s,
the warm-up's seconds, peak device memory (common.DeviceMemory, and torch's max_memory_allocated beside it) and,
after the last workload, the HBM floor and the fraction of it reached (as generate_barerl.py counts it).

    python bench/generate_transformers.py [--setting compiled|default] [--workload G1 G2 | G3] [--shape SHAPE]
        [--quick] [--out DIR]
"""

from __future__ import annotations

import time

from common import (
    DeviceMemory,
    ceilings,
    generation_parser,
    generation_workloads,
    report_generation_floor,
    write_record,
)
from shapes import hf_config_kwargs, shape_dict

SETTINGS = {"compiled": "static cache + torch.compile", "default": "default (dynamic cache, eager)"}


def timed_generate(model, ids, new_tokens: int, setting: str) -> tuple[float, int]:
    import torch

    extra = {"cache_implementation": "static"} if setting == "compiled" else {}
    if ids.is_cuda:
        torch.cuda.synchronize()
    start = time.perf_counter()
    with torch.no_grad():
        out = model.generate(ids, attention_mask=torch.ones_like(ids), do_sample=True, temperature=1.0, top_k=0,
                             top_p=1.0, max_new_tokens=new_tokens, min_new_tokens=new_tokens, pad_token_id=0,
                             **extra)
    if ids.is_cuda:
        torch.cuda.synchronize()
    return time.perf_counter() - start, (out.shape[1] - ids.shape[1]) * ids.shape[0]


def main() -> None:
    parser = generation_parser(__doc__, timed=1)
    parser.add_argument("--setting", default="compiled", choices=list(SETTINGS))
    args = parser.parse_args()
    works = generation_workloads(parser, args)

    memory = DeviceMemory().start()
    import torch
    import transformers

    cuda = torch.cuda.is_available() and not args.quick
    shape = shape_dict(next(iter(works.values())).shape, args.quick)
    torch.manual_seed(0)
    model = transformers.Qwen3ForCausalLM(transformers.Qwen3Config(**hf_config_kwargs(shape)))
    model = model.to("cuda", torch.bfloat16) if cuda else model
    model.eval()
    compile_config = transformers.CompileConfig() if args.setting == "compiled" else None
    settings = {"setting": SETTINGS[args.setting], "dtype": str(model.dtype), "device": str(model.device),
                "compile_config": vars(compile_config) if compile_config else None,
                "attn_implementation": model.config._attn_implementation}
    runs = {}
    for key, work in works.items():
        new_tokens = work.new_tokens
        rng = torch.Generator().manual_seed(1)
        prompts = torch.randint(2, shape["vocab_size"], (work.prompts, work.prompt_len), generator=rng)
        ids = prompts.repeat_interleave(work.samples, dim=0).to(model.device)
        warm_s, _ = timed_generate(model, ids, new_tokens, args.setting)
        each = []
        for _ in range(args.timed):
            ids = torch.randint(2, shape["vocab_size"], ids.shape, generator=rng).to(model.device)
            seconds, tokens = timed_generate(model, ids, new_tokens, args.setting)
            each.append(tokens / seconds)
            print(f"{key} transformers {args.setting}: {each[-1]:.0f} new tok/s ({seconds:.2f} s; warm-up "
                  f"{warm_s:.1f} s)", flush=True)
        runs[key] = {"new_tok_s": max(each), "new_tok_s_each": each, "warmup_s": warm_s,
                     "ms_per_step": 1e3 * ids.shape[0] / max(each), "peak_gib": memory.peak_gib(),
                     "torch_max_allocated_gib": torch.cuda.max_memory_allocated() / 2**30 if cuda else None,
                     "new_tokens": ids.shape[0] * new_tokens}
    memory.stop()
    rates = ceilings("torch") if cuda else {}  # after the timed work: its peak memory is not the workloads'
    for key, metrics in runs.items():
        if rates:
            report_generation_floor(key, works[key], metrics, rates["copy_tbs"], f"transformers {args.setting}")
        write_record(args.out, f"transformers-{args.setting}", key,
                     f"transformers {transformers.__version__} generate", SETTINGS[args.setting], settings,
                     {**metrics, **rates}, ("torch", "transformers"))


if __name__ == "__main__":
    main()
