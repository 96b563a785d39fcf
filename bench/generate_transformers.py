"""Workloads G1 and G2 on transformers' `generate` (a generation peer), in one of two settings:

- `compiled` (its best): a static KV cache (`cache_implementation="static"`), with which `generate` compiles
  the decoding forward itself (torch.compile with transformers' CompileConfig: fullgraph, mode
  "reduce-overhead", i.e. CUDA graphs);
- `default`: the growing dynamic cache, eager.

Same model shape (random bf16 weights, torch seed 0), prompt length, sampling (temperature 1, no top-k / top-p)
and counts as generate_barerl.py; every sequence is held to its length (min_new_tokens). A warm-up call of the
same shape first (compilation happens there; in a process whose allocator is cold the first eager run is 2-3x slower),
then timed calls on fresh prompts. Records new tokens/s, the warm-up's seconds and peak device memory
(common.DeviceMemory, and torch's max_memory_allocated beside it).

    python bench/generate_transformers.py [--setting compiled|default] [--workloads G1 G2] [--quick] [--out DIR]
"""

from __future__ import annotations

import time

from common import (
    GENERATION,
    PROMPT_LEN,
    QUICK_NEW_TOKENS,
    DeviceMemory,
    generation_parser,
    hf_config_kwargs,
    model_shape,
    write_record,
)

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

    memory = DeviceMemory().start()
    import torch
    import transformers

    cuda = torch.cuda.is_available() and not args.quick
    shape = model_shape(args.quick)
    torch.manual_seed(0)
    model = transformers.Qwen3ForCausalLM(transformers.Qwen3Config(**hf_config_kwargs(shape)))
    model = model.to("cuda", torch.bfloat16) if cuda else model
    model.eval()
    compile_config = transformers.CompileConfig() if args.setting == "compiled" else None
    settings = {"setting": SETTINGS[args.setting], "dtype": str(model.dtype), "device": str(model.device),
                "compile_config": vars(compile_config) if compile_config else None,
                "attn_implementation": model.config._attn_implementation}
    for name in args.workloads:
        num_prompts, samples, new_tokens = GENERATION[name]
        new_tokens = QUICK_NEW_TOKENS if args.quick else new_tokens
        rng = torch.Generator().manual_seed(1)
        prompts = torch.randint(2, shape["vocab_size"], (num_prompts, PROMPT_LEN), generator=rng)
        ids = prompts.repeat_interleave(samples, dim=0).to(model.device)
        warm_s, _ = timed_generate(model, ids, new_tokens, args.setting)
        each = []
        for _ in range(args.timed):
            ids = torch.randint(2, shape["vocab_size"], ids.shape, generator=rng).to(model.device)
            seconds, tokens = timed_generate(model, ids, new_tokens, args.setting)
            each.append(tokens / seconds)
            print(f"{name} transformers {args.setting}: {each[-1]:.0f} new tok/s ({seconds:.2f} s; warm-up "
                  f"{warm_s:.1f} s)", flush=True)
        metrics = {"new_tok_s": max(each), "new_tok_s_each": each, "warmup_s": warm_s,
                   "ms_per_step": 1e3 * ids.shape[0] / max(each), "peak_gib": memory.peak_gib(),
                   "torch_max_allocated_gib": torch.cuda.max_memory_allocated() / 2**30 if cuda else None}
        write_record(args.out, f"transformers-{args.setting}", name,
                     f"transformers {transformers.__version__} generate", SETTINGS[args.setting], settings,
                     metrics, ("torch", "transformers"))
    memory.stop()


if __name__ == "__main__":
    main()
