"""A Hugging Face folder of a benchmark model for the peers that load one (vLLM, TRL): a shape of shapes.py
(default the Qwen3-0.6B architecture) with random bf16 weights (torch seed 0) and the numbered tokenizer (token i
is the word "t<i>"). Written before a peer's process starts, so that its cold start counts loading, not making,
the model.

    python bench/make_model.py DIR [--shape qwen3-4b] [--quick]
"""

from __future__ import annotations

import argparse
from pathlib import Path

from common import numbered_tokenizer
from shapes import SHAPES, hf_config_kwargs, shape_dict


def make_model(folder: str, shape_name: str = "qwen3-0.6b", quick: bool = False) -> None:
    import torch
    import transformers

    shape = shape_dict(shape_name, quick)
    torch.manual_seed(0)
    config = transformers.Qwen3Config(**hf_config_kwargs(shape))
    config.architectures = ["Qwen3ForCausalLM"]
    with torch.device("cuda" if torch.cuda.is_available() else "cpu"):  # random init is slow on a CPU
        model = transformers.Qwen3ForCausalLM(config).to(torch.bfloat16)
    model.save_pretrained(folder, safe_serialization=True)
    numbered_tokenizer(shape["vocab_size"]).save_pretrained(folder)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("folder")
    parser.add_argument("--shape", default="qwen3-0.6b", choices=list(SHAPES))
    parser.add_argument("--quick", action="store_true", help="the tiny width of the CPU smoke tests")
    args = parser.parse_args()
    if (Path(args.folder) / "config.json").exists():
        print(f"{args.folder}: already there")
        return
    make_model(args.folder, args.shape, args.quick)
    print(f"{args.folder}: written")


if __name__ == "__main__":
    main()
