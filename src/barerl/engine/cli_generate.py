"""`barerl generate`: completions from the command line, with a progress bar and a throughput line.

Sampling flags come from `SamplingParams`' fields and engine flags from `EngineConfig`'s, so defaults live
in one place; `--device` and `--dtype` default to auto, as in every command (the GPU when CuPy finds one). Prompts: `--prompt` (repeatable) or `--prompts-file` JSONL, one per line: a string, or an
object with "prompt" (text), "prompt_token_ids" or "messages" (a conversation). `--chat` wraps text prompts
as a user message and applies the model's chat template. Output: JSONL with `--output`, else the texts.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import sys

from barerl.device import DEVICES, resolve_auto_dtype, resolve_device
from barerl.engine.config import EngineConfig
from barerl.engine.sampling_params import SamplingParams

_SKIP_SAMPLING = {"stop_strings"}
_SKIP_ENGINE = {"seed", "device", "dtype"}  # --seed is the sampling seed; device and dtype: auto, below


def add_dataclass_flags(group, cls, skip: set[str]) -> None:
    for f in dataclasses.fields(cls):
        if f.name in skip or not f.init:
            continue
        flag, kind = "--" + f.name.replace("_", "-"), str(f.type)
        if kind.startswith("bool"):  # logprobs (bool | int) too: the CLI returns the sampled token's only
            group.add_argument(flag, action=argparse.BooleanOptionalAction, default=None)
        elif kind.startswith(("list", "str | list")):
            item = int if "int" in kind else str
            group.add_argument(flag, action="append", type=item, default=None, help="repeatable")
        else:
            scalar = int if kind.startswith("int") else float if kind.startswith("float") else str
            group.add_argument(flag, type=scalar, default=None, help=f"default {f.default!r}")


def given_fields(args, cls, skip: set[str]) -> dict:
    names = {f.name for f in dataclasses.fields(cls) if f.init} - skip
    return {k: v for k, v in vars(args).items() if k in names and v is not None}


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--model", required=True, help="Hugging Face model folder or .gguf file")
    source = parser.add_mutually_exclusive_group(required=True)
    source.add_argument("--prompt", action="append", help="a prompt (repeatable)")
    source.add_argument("--prompts-file", help="JSONL: strings, or objects with prompt / prompt_token_ids / "
                        "messages")
    parser.add_argument("--chat", action="store_true", help="apply the chat template to text prompts")
    parser.add_argument("--output", help="write one JSON object per prompt to this JSONL file")
    parser.add_argument("--device", default="auto", choices=DEVICES, help="auto: cuda if CuPy finds a GPU")
    parser.add_argument("--dtype", default="auto", choices=("auto", "float32", "bfloat16", "float16"),
                        help="auto: bfloat16 on cuda, float32 on cpu")
    add_dataclass_flags(parser.add_argument_group("sampling"), SamplingParams, _SKIP_SAMPLING)
    add_dataclass_flags(parser.add_argument_group("engine"), EngineConfig, _SKIP_ENGINE)


def _read_prompts(args) -> list:
    if args.prompt:
        return list(args.prompt)
    prompts = []
    with open(args.prompts_file, encoding="utf-8") as f:
        for number, line in enumerate(f, 1):
            if not line.strip():
                continue
            try:
                prompts.append(json.loads(line))
            except json.JSONDecodeError as e:
                raise ValueError(f"{args.prompts_file}:{number}: not valid JSON ({e})") from None
    if not prompts:
        raise ValueError(f"{args.prompts_file}: no prompts")
    return prompts


def _to_engine_prompt(llm, item, chat: bool):
    """A prompt for LLM.generate; conversations and --chat prompts rendered with the chat template."""
    messages = item.get("messages") if isinstance(item, dict) else None
    text = item if isinstance(item, str) else item.get("prompt") if isinstance(item, dict) else None
    if messages is None and chat and text is not None:
        messages = [{"role": "user", "content": text}]
    if messages is None:
        return item
    if llm.tokenizer is None:
        raise ValueError("chat prompts need a tokenizer")
    rendered = llm.tokenizer.apply_chat_template(messages, add_generation_prompt=True, tokenize=False)
    return {"prompt": rendered, "prompt_token_ids": llm.tokenizer.encode(rendered, add_special_tokens=False)}


def run(args) -> int:
    from barerl.engine.llm import LLM

    params = SamplingParams(**given_fields(args, SamplingParams, _SKIP_SAMPLING))
    items = _read_prompts(args)
    device = resolve_device(args.device)
    llm = LLM(args.model, device=device, dtype=resolve_auto_dtype(args.dtype, device),
              **given_fields(args, EngineConfig, _SKIP_ENGINE))
    outputs = llm.generate([_to_engine_prompt(llm, item, args.chat) for item in items], params)
    if args.output:
        with open(args.output, "w", encoding="utf-8") as f:
            f.writelines(json.dumps(_as_record(out), ensure_ascii=False) + "\n" for out in outputs)
    else:
        for out in outputs:
            for c in out.outputs:
                print(c.text if c.text else c.token_ids)
    s = llm.stats
    print(f"{s['num_requests']} prompts, {s['num_prompt_tokens']} prompt tokens, "
          f"{s['num_generated_tokens']} new tokens in {s['elapsed_s']:.2f} s: "
          f"{s['tokens_per_s']:.1f} new tok/s", file=sys.stderr)
    return 0


def _as_record(out) -> dict:
    return {
        "prompt": out.prompt,
        "prompt_token_ids": out.prompt_token_ids,
        "outputs": [dataclasses.asdict(c) for c in out.outputs],
    }
