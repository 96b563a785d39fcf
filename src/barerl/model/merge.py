"""`barerl merge`: a base model and a PEFT LoRA adapter -> one merged Hugging Face checkpoint.

Each targeted weight becomes W + scale B A (lora_alpha / r, or lora_alpha / sqrt(r) with rsLoRA), computed
in fp32 on the CPU and rounded once to the output dtype (by default the base's own), as peft's
`merge_and_unload` computes it; the base's tokenizer is copied beside it. The result loads in transformers (or barerl) as a plain model.
"""

from __future__ import annotations

import argparse

from barerl.formats.safetensors import DTYPES
from barerl.model.checkpoint import save_checkpoint
from barerl.model.lora import merge_lora
from barerl.model.model import Model
from barerl.model.peft_format import load_adapter


def merge(base: str, adapter: str, output: str, dtype: str = "auto") -> None:
    model = Model.from_pretrained(base, device="cpu", dtype="float32")
    load_adapter(model, adapter)
    merge_lora(model)
    from barerl.tokenizer import load_tokenizer

    disk_dtype = model.cfg.torch_dtype if dtype == "auto" else dtype
    save_checkpoint(output, model.cfg, model.params, tokenizer=load_tokenizer(base),
                    dtype=disk_dtype if disk_dtype in DTYPES else "float32")


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--model", required=True, help="the base model: a Hugging Face folder or .gguf file")
    parser.add_argument("--adapter", required=True, help="a PEFT LoRA adapter folder (adapter_config.json + "
                        "adapter_model.safetensors), e.g. a LoRA run's checkpoint")
    parser.add_argument("--output", required=True, help="the folder to write the merged checkpoint to")
    parser.add_argument("--dtype", default="auto", choices=("auto", *DTYPES),
                        help="dtype of the written weights (auto: the base's torch_dtype)")


def run(args: argparse.Namespace) -> int:
    merge(args.model, args.adapter, args.output, args.dtype)
    print(f"merged {args.adapter} into {args.model}: {args.output}")
    return 0
