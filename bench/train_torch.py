"""Workloads T1 and T2 (one optimizer step) on torch + transformers, at equal work with train_barerl.py: the
same model shape, sequences, micro-batches and loss (T2's on the last 4,096 tokens of each sequence: the others
labelled -100), one AdamW step (`--workload`, `--shape`: shapes.py).

A row is `RECOMPUTE[+liger][+compile][:bf16]`:
- RECOMPUTE: `full` (transformers' gradient checkpointing: each layer recomputed in backward, the work of
  barerl's `--keep none`), `attention` (the same with torch's selective checkpointing saving the SDPA
  outputs: the closest to barerl's default, which keeps attention and the down product's output), `none`;
- `+liger`: Liger-Kernel's Qwen3 kernels (fused linear cross-entropy, RMSNorm, SwiGLU, RoPE), patched into
  transformers' classes before the model is made (so such a row runs last in its process);
- `+compile`: each decoder layer compiled (`nn.Module.compile`, inductor);
- optimizer state: fp32 by default, barerl's semantics (fp32 weights = master, fp32 gradients and moments,
  bf16 autocast for the compute); `:bf16` trains bf16 weights with bf16 gradients and moments (the lighter
  setting TRL uses with bf16 weights). AdamW fused, weight decay 0, gradients clipped at norm 1.
Step time is the median of 3 steps after a warm-up (compilation happens there); MFU and the floor as in
train_barerl.py, over the matrix rate measured in this process (through torch) and over the 989 TFLOP/s spec.

    python bench/train_torch.py [--workload T1|T2] [--shape SHAPE] [--rows full attention] [--repeats 3]
        [--quick] [--out DIR]
"""

from __future__ import annotations

import argparse
import functools
import time

import numpy as np
from common import DeviceMemory, ceilings, print_training_floor, write_record
from shapes import (
    SHAPES,
    TRAINING,
    Training,
    hf_config_kwargs,
    model_config,
    shape_dict,
    training_flops,
    training_utilisation,
    workload,
)

SDPA_OPS = ("_scaled_dot_product_flash_attention", "_scaled_dot_product_efficient_attention",
            "_scaled_dot_product_cudnn_attention", "_scaled_dot_product_flash_attention_for_cpu")


def parse_row(spec: str) -> dict:
    body, _, state = spec.partition(":")
    recompute, *extras = body.split("+")
    if recompute not in ("full", "attention", "none") or set(extras) - {"liger", "compile"} or state not in ("", "bf16"):
        raise SystemExit(f"train_torch: bad row {spec!r}: RECOMPUTE[+liger][+compile][:bf16], RECOMPUTE in "
                         "full / attention / none")
    return {"recompute": recompute, "liger": "liger" in extras, "compile": "compile" in extras,
            "state": state or "fp32"}


def attention_kept_context():
    """torch's selective checkpointing: save the SDPA ops' outputs (attention output and lse), recompute the rest."""
    import torch
    from torch.utils.checkpoint import CheckpointPolicy, create_selective_checkpoint_contexts

    saved = {getattr(torch.ops.aten, name).default for name in SDPA_OPS if hasattr(torch.ops.aten, name)}

    def policy(ctx, op, *args, **kwargs):
        return CheckpointPolicy.MUST_SAVE if op in saved else CheckpointPolicy.PREFER_RECOMPUTE
    return functools.partial(create_selective_checkpoint_contexts, policy)


def make_model(shape: dict, row: dict, cuda: bool):
    import torch
    import transformers

    if row["liger"]:
        from liger_kernel.transformers import apply_liger_kernel_to_qwen3

        apply_liger_kernel_to_qwen3()  # rope, rms_norm, swiglu, fused_linear_cross_entropy
    torch.manual_seed(0)
    dtype = torch.bfloat16 if row["state"] == "bf16" and cuda else torch.float32
    with torch.device("cuda" if cuda else "cpu"):
        model = transformers.Qwen3ForCausalLM(transformers.Qwen3Config(**hf_config_kwargs(shape))).to(dtype)
    model.config.use_cache = False
    model.train()
    if row["recompute"] != "none":
        kwargs = {"use_reentrant": False}
        if row["recompute"] == "attention":
            kwargs["context_fn"] = attention_kept_context()
        model.gradient_checkpointing_enable(gradient_checkpointing_kwargs=kwargs)
    if row["compile"]:
        for layer in model.model.layers:
            layer.compile()
    return model


def step_seconds(shape: dict, t: Training, row: dict, quick: bool, repeats: int) -> dict:
    import torch

    cuda = torch.cuda.is_available() and not quick
    seqs, seqlen, micro = t.sequences, t.seqlen, t.micro_batch
    model = make_model(shape, row, cuda)
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-5, weight_decay=0.0, fused=cuda)
    ids = torch.randint(0, shape["vocab_size"], (seqs, seqlen), generator=torch.Generator().manual_seed(1))
    ids = ids.to(model.device)
    labels = ids.clone()
    labels[:, : seqlen - (t.loss_tokens or seqlen)] = -100  # no loss before the last loss_tokens
    autocast = torch.autocast("cuda", dtype=torch.bfloat16, enabled=cuda and row["state"] == "fp32")

    def step() -> float:
        if cuda:
            torch.cuda.synchronize()
        start = time.perf_counter()
        optimizer.zero_grad(set_to_none=True)
        for i in range(0, seqs, micro):
            with autocast:
                loss = model(input_ids=ids[i : i + micro], labels=labels[i : i + micro]).loss
            (loss * micro / seqs).backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        optimizer.step()
        if cuda:
            torch.cuda.synchronize()
        return time.perf_counter() - start

    warmup = step()  # compilation (with +compile), allocator growth
    if cuda:
        torch.cuda.reset_peak_memory_stats()
    times = [step() for _ in range(repeats)]
    return {"step_s": float(np.median(times)), "step_s_each": times, "warmup_s": warmup, "tokens": seqs * seqlen,
            "num_params": sum(p.numel() for p in model.parameters()),
            "torch_max_reserved_gib": torch.cuda.max_memory_reserved() / 2**30 if cuda else None,
            "torch_max_allocated_gib": torch.cuda.max_memory_allocated() / 2**30 if cuda else None}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--workload", default="T1", choices=list(TRAINING))
    parser.add_argument("--shape", default=None, choices=list(SHAPES),
                        help="run the workload's sizes on this model shape (default: its own)")
    parser.add_argument("--rows", nargs="+", default=["full", "attention"], metavar="ROW",
                        help="RECOMPUTE[+liger][+compile][:bf16], one row each (see the module docstring)")
    parser.add_argument("--quick", action="store_true", help="a tiny model and batch on the CPU (a smoke test)")
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--out", default=None, help="folder for the JSON records")
    args = parser.parse_args()
    rows = [parse_row(spec) for spec in args.rows]
    key, t = workload(TRAINING, args.workload, args.shape, args.quick)
    if any(r["liger"] for r in rows[:-1]):
        raise SystemExit("train_torch: a +liger row patches transformers' classes: give it last")

    memory = DeviceMemory().start()
    import torch
    import transformers

    shape, cfg = shape_dict(t.shape, args.quick), model_config(t.shape, args.quick)
    rates = {} if args.quick else ceilings("torch")
    for spec, row in zip(args.rows, rows):
        if args.quick and (row["liger"] or row["compile"]):
            print(f"{key} torch {spec}: skipped with --quick (Liger and compilation want a GPU)")
            continue
        if torch.cuda.is_available():
            torch.cuda.empty_cache()  # the last row's cached blocks are not this row's
        memory.reset_peak()
        r = step_seconds(shape, t, row, args.quick, 1 if args.quick else args.repeats)
        u = training_utilisation(training_flops(cfg, t), r["step_s"], rates)
        metrics = {**r, "tokens_per_s": r["tokens"] / r["step_s"], **u, **rates, "peak_gib": memory.peak_gib()}
        state = ("fp32 weights (master), gradients and moments, bf16 autocast" if row["state"] == "fp32"
                 else "bf16 weights, gradients and moments")
        settings = {**row, "micro_batch": t.micro_batch, "optimizer": f"AdamW (fused), {state}, weight decay 0, clip 1.0",
                    "attn_implementation": "sdpa"}
        if t.loss_tokens:
            settings["loss_tokens"] = t.loss_tokens
        print(f"{key} torch {spec}: {r['step_s']:.3f} s, {u['tflops']:.0f} TFLOP/s"
              + (f", MFU {u['mfu_measured']:.1%} of measured" if rates else ""), flush=True)
        print_training_floor(key, t, metrics, f"torch {spec}")
        label = {"full": "recomputes all", "attention": "keeps attention", "none": "no recomputation"}[row["recompute"]]
        label += (", Liger" if row["liger"] else "") + (", compiled" if row["compile"] else "") + (
            ", bf16 weights and moments" if row["state"] == "bf16" else "")
        write_record(args.out, "torch-" + spec.replace("+", "-").replace(":", "-"), key,
                     f"torch {torch.__version__} + transformers {transformers.__version__}", label, settings,
                     metrics, ("torch", "transformers", "liger-kernel"))
    memory.stop()


if __name__ == "__main__":
    main()
