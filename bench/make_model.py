"""A Hugging Face folder of the benchmark model for the peers that load one (vLLM, TRL): the Qwen3-0.6B
architecture with random bf16 weights (torch seed 0) and the numbered tokenizer (token i is the word "t<i>").
Written before a peer's process starts, so that its cold start counts loading, not making, the model.

    python bench/make_model.py DIR [--quick]
"""

from __future__ import annotations

import argparse
from pathlib import Path

from common import hf_config_kwargs, model_shape, numbered_tokenizer


def make_model(folder: str, quick: bool = False) -> None:
    import torch
    import transformers

    shape = model_shape(quick)
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
    parser.add_argument("--quick", action="store_true", help="the tiny shape of the CPU smoke tests")
    args = parser.parse_args()
    if (Path(args.folder) / "config.json").exists():
        print(f"{args.folder}: already there")
        return
    make_model(args.folder, args.quick)
    print(f"{args.folder}: written")


if __name__ == "__main__":
    main()
