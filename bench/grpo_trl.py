"""Workloads R1, R2, R3 and L1 (one GRPO step) on TRL's GRPOTrainer, the peer of grpo_barerl.py: the same
model shape (a folder written by make_model.py of the workload's shape: random bf16 weights, the numbered
tokenizer), prompts, lengths, batch (all completions of a step, the workload's micro-batches, one update per
generation), loss (DAPO, beta 0), learning rate and reward (`--workload`, `--shape`: shapes.py).

Generation, `--vllm`:
- `colocate` (the default, how TRL's GRPO is run for speed): `use_vllm=True, vllm_mode="colocate"`, vLLM in
  this process at `vllm_gpu_memory_utilization`, by default the share of the GPU that holds the weights and one
  round's KV cache with 2 GiB to spare, in steps of 0.05 (R1: 0.1, 64 x 1,152 tokens = 8.5 GB of KV; R2 0.35,
  R3 0.3, L1 0.25 on an H200; TRL's default is 0.3), TRL's default importance-sampling correction;
- `off`: TRL's own transformers `generate`.
Timing, the same as grpo_barerl.py: the wall clock between the ends of consecutive steps (TRL's `on_step_end`
callback), everything in the step, median of the steps after the first. Phases: time inside TRL's generate
call (vLLM's or the model's) and its weight sync to vLLM, inside the reward, and the rest (training).
Mismatch, over every completion token of each step: with vLLM, vLLM's sampling log-probs against the log-probs
TRL's training forward computes for its importance-sampling ratio (`sampling_per_token_logps` and
`old_per_token_logps` of the batch TRL builds), in barerl's statistics (max, mean, p99 of |difference|, k3 KL);
TRL's own logged `sampling/sampling_logp_difference` beside them. Without vLLM, TRL keeps no sampling
log-probs: after training, completions are sampled with `generate(output_logits=True)` and compared with a
training forward over the same sequences. Peak device memory as barerl's (common.DeviceMemory; vLLM's
reserved KV cache counts), torch's max reserved / allocated beside it; cold start: process start to the end
of the first step. A run that does not fit or cannot start (vLLM's KV cache, an out-of-memory error while
training) is recorded as such with its error (common.write_failure), and the script exits with status 1.
`--lora-r R`: peft's LoRA adapters of rank R on every linear layer (lora_alpha 2 R, no dropout: grpo_barerl.py's
`--lora-r`), the base frozen; TRL merges them into vLLM's copy of the weights at every sync.

    python bench/grpo_trl.py --model DIR [--workload R1|R2|R3|L1] [--shape SHAPE] [--vllm colocate|off]
        [--vllm-gpu-memory-utilization F] [--lora-r R] [--steps 3] [--quick] [--out DIR]
"""

from __future__ import annotations

import argparse
import importlib.util
import math
import os
import sys
import tempfile
import time

import numpy as np
from common import (
    DeviceMemory,
    caches_at_start,
    cheap_reward,
    check_model_folder,
    gib,
    prompt_rows,
    since_process_start,
    write_failure,
    write_record,
)
from shapes import GRPO, SHAPES, Grpo, model_config, shape_dict, workload

SPARE_BYTES = 2 << 30  # vLLM's activations, graphs and sampler beside its weights and KV cache


def logprob_stats(engine_logp, trainer_logp, mask) -> dict:
    """barerl's engine/trainer mismatch statistics (one definition for both systems)."""
    from barerl.train.losses import logprob_mismatch

    return logprob_mismatch(engine_logp, trainer_logp, mask)


class Phases:
    """Seconds spent inside wrapped calls, by phase (CUDA synchronized on both ends)."""

    def __init__(self, cuda: bool):
        self.cuda, self.spans = cuda, {}

    def wrap(self, fn, key: str):
        import torch

        def timed(*args, **kwargs):
            if self.cuda:
                torch.cuda.synchronize()
            start = time.perf_counter()
            out = fn(*args, **kwargs)
            if self.cuda:
                torch.cuda.synchronize()
            self.spans.setdefault(key, []).append(time.perf_counter() - start)
            return out
        return timed


def capture_mismatch(trainer, found: list) -> None:
    """Per generation batch: vLLM's sampling log-probs against TRL's training-forward log-probs, same tokens."""
    generate_and_score = trainer._generate_and_score_completions

    def wrapped(*args, **kwargs):
        out = generate_and_score(*args, **kwargs)
        if "sampling_per_token_logps" in out and "old_per_token_logps" in out:
            arrays = [out[k].float().cpu().numpy() for k in ("sampling_per_token_logps", "old_per_token_logps")]
            mask = out["completion_mask"].cpu().numpy() * ~np.isnan(arrays[0])
            found.append({**logprob_stats(np.nan_to_num(arrays[0]), arrays[1], mask), "tokens": int(mask.sum())})
        return out
    trainer._generate_and_score_completions = wrapped


def generation_vs_training_logprobs(model, rows, tokenizer, samples: int, new_tokens: int) -> dict:
    """Without vLLM: log-probs at sampling (`generate(output_logits=True)`) against a training forward over the
    same sequences (left-padded prompts, the attention mask of prompt + completion up to its EOS, no position
    ids: as TRL computes them)."""
    import torch

    device = next(model.parameters()).device
    enc = tokenizer([r["prompt"] for r in rows], return_tensors="pt", padding=True, padding_side="left",
                    add_special_tokens=False)
    ids = enc.input_ids.repeat_interleave(samples, dim=0).to(device)
    prompt_mask = enc.attention_mask.repeat_interleave(samples, dim=0).to(device)
    model.eval()
    with torch.no_grad(), torch.autocast(device.type, dtype=torch.bfloat16, enabled=device.type == "cuda"):
        out = model.generate(ids, attention_mask=prompt_mask, do_sample=True, temperature=1.0, top_k=0, top_p=1.0,
                             max_new_tokens=new_tokens, pad_token_id=tokenizer.pad_token_id,
                             eos_token_id=tokenizer.eos_token_id, output_logits=True, return_dict_in_generate=True)
        completion = out.sequences[:, ids.shape[1]:]
        is_eos = completion == tokenizer.eos_token_id
        alive = (torch.cumsum(is_eos, dim=1) - is_eos.long()) == 0  # up to and including the first EOS
        sampled = torch.stack(out.logits, dim=1).float().log_softmax(-1).gather(-1, completion[..., None])[..., 0]
        model.train()
        logits = model(out.sequences, attention_mask=torch.cat([prompt_mask, alive.long()], dim=1)).logits
        trained = logits[:, ids.shape[1] - 1:-1].float().log_softmax(-1).gather(-1, completion[..., None])[..., 0]
    mask = alive.cpu().numpy()
    return {**logprob_stats(sampled.cpu().numpy(), trained.cpu().numpy(), mask), "tokens": int(mask.sum())}


def one_round_share(work: Grpo, device_bytes: int) -> float:
    """The share of the GPU that holds vLLM's copy of the weights and one generation round's KV cache (every
    completion at its full length) with SPARE_BYTES beside them, rounded up to 0.05."""
    from barerl.train.memory_plan import kv_bytes_per_token

    cfg = model_config(work.shape)
    kv = work.completions * (work.prompt_len + work.completion_len) * kv_bytes_per_token(cfg, 2)
    return math.ceil((2 * cfg.num_parameters() + kv + SPARE_BYTES) / device_bytes * 20 - 1e-9) / 20


def trl_config(args, work: Grpo, cuda: bool):
    import trl

    vllm = {"use_vllm": args.vllm == "colocate"}
    if args.vllm == "colocate":
        vllm.update(vllm_mode="colocate", vllm_gpu_memory_utilization=args.vllm_gpu_memory_utilization,
                    vllm_max_model_length=work.prompt_len + work.completion_len)
    return trl.GRPOConfig(
        output_dir=tempfile.mkdtemp(prefix=f"{args.workload.lower()}-trl-"), max_steps=args.steps,
        num_generations=work.samples, per_device_train_batch_size=work.micro_batch,
        gradient_accumulation_steps=work.completions // work.micro_batch, max_completion_length=work.completion_len,
        temperature=1.0, learning_rate=1e-6, lr_scheduler_type="constant", gradient_checkpointing=True,
        loss_type="dapo", beta=0.0, bf16=cuda, logging_steps=1, save_strategy="no", report_to="none", seed=0,
        shuffle_dataset=False, use_cpu=not cuda, model_init_kwargs={"dtype": "bfloat16" if cuda else "float32"},
        **vllm)


def lora_config(rank: int):
    """peft's adapters of grpo_barerl.py's `--lora-r`: every linear layer, lora_alpha 2 r, no dropout."""
    import peft

    return peft.LoraConfig(r=rank, lora_alpha=2 * rank, lora_dropout=0.0, target_modules="all-linear",
                           task_type="CAUSAL_LM")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", required=True, help="a folder written by make_model.py (of the workload's shape)")
    parser.add_argument("--workload", default="R1", choices=list(GRPO))
    parser.add_argument("--shape", default=None, choices=list(SHAPES),
                        help="run the workload's sizes on this model shape (default: its own)")
    parser.add_argument("--vllm", default="colocate", choices=("colocate", "off"))
    parser.add_argument("--vllm-gpu-memory-utilization", type=float, default=None,
                        help="default: the weights and one round's KV cache (see the module docstring)")
    parser.add_argument("--lora-r", type=int, default=0, help="peft LoRA adapters of this rank on every linear "
                        "layer (lora_alpha 2 r, the base frozen); 0: full-parameter training")
    parser.add_argument("--steps", type=int, default=3, help="GRPO steps; the first is a warm-up")
    parser.add_argument("--quick", action="store_true", help="short sequences (with make_model.py --quick's folder)")
    parser.add_argument("--out", default=None, help="folder for the JSON record")
    args = parser.parse_args()
    if args.lora_r < 0:
        parser.error(f"--lora-r must be 0 (full-parameter training) or a positive rank, got {args.lora_r}")
    if args.lora_r and importlib.util.find_spec("peft") is None:
        parser.error("--lora-r needs peft (pip install peft)")
    key, work = workload(GRPO, args.workload, args.shape, args.quick)
    check_model_folder(args.model, shape_dict(work.shape, args.quick))

    caches = caches_at_start()
    memory = DeviceMemory().start()
    for name, value in {"MASTER_ADDR": "localhost", "MASTER_PORT": "29517", "RANK": "0", "WORLD_SIZE": "1",
                        "LOCAL_RANK": "0"}.items():
        os.environ.setdefault(name, value)  # vLLM colocated in one process
    import datasets
    import torch
    import transformers
    import trl

    cuda = torch.cuda.is_available()
    if args.vllm == "colocate" and not cuda:
        parser.error("--vllm colocate needs a GPU (on a CPU: --vllm off)")
    if args.vllm == "colocate" and args.vllm_gpu_memory_utilization is None:
        args.vllm_gpu_memory_utilization = one_round_share(work, torch.cuda.mem_get_info()[1])
    config = trl_config(args, work, cuda)
    settings = {"use_vllm": args.vllm == "colocate", "vllm_mode": "colocate" if args.vllm == "colocate" else None,
                "vllm_gpu_memory_utilization": args.vllm_gpu_memory_utilization if args.vllm == "colocate" else None,
                "vllm_importance_sampling_correction": config.vllm_importance_sampling_correction,
                "bf16": cuda, "weights": "bf16" if cuda else "fp32", "gradient_checkpointing": True,
                "loss_type": "dapo", "beta": 0.0, "learning_rate": 1e-6, "micro_batch": work.micro_batch,
                "lora_r": args.lora_r}
    name = "trl-vllm" if args.vllm == "colocate" else "trl"
    label = "TRL + vLLM colocate" if args.vllm == "colocate" else "TRL, transformers generate"
    setting = (f"vLLM colocate, vllm_gpu_memory_utilization {args.vllm_gpu_memory_utilization:g}"
               if args.vllm == "colocate" else "transformers generate (use_vllm off)")
    system, packages = f"TRL {trl.__version__}", ("torch", "transformers", "trl", "vllm", "datasets")
    if args.lora_r:
        name, label = f"{name}-lora-r{args.lora_r}", f"{label}, peft LoRA r={args.lora_r}"
        setting += f", peft LoRA r={args.lora_r} all-linear"
        packages += ("peft",)
    tokenizer = transformers.AutoTokenizer.from_pretrained(args.model)
    rows = prompt_rows(tokenizer.vocab_size, work.prompts * args.steps, work.prompt_len)
    phases, ends, mismatch, cold = Phases(cuda), [], [], {}

    class StepEnds(transformers.TrainerCallback):
        def on_train_begin(self, *_, **__):
            ends.append(time.perf_counter())

        def on_step_end(self, *_, **__):
            if cuda:
                torch.cuda.synchronize()
            ends.append(time.perf_counter())
            cold.setdefault("first_step_end_s", since_process_start())

    reward = phases.wrap(cheap_reward, "score")
    reward.__name__ = "cheap_reward"
    try:
        trainer = trl.GRPOTrainer(model=args.model, reward_funcs=[reward], processing_class=tokenizer, args=config,
                                  train_dataset=datasets.Dataset.from_list(rows), callbacks=[StepEnds()],
                                  peft_config=lora_config(args.lora_r) if args.lora_r else None)
        if args.vllm == "colocate":
            generation = trainer.vllm_generation
            generation.generate = phases.wrap(generation.generate, "generate")
            generation.sync_weights = phases.wrap(generation.sync_weights, "sync_weights")
            capture_mismatch(trainer, mismatch)
        else:
            trainer.model.generate = phases.wrap(trainer.model.generate, "generate")
        if cuda:
            torch.cuda.reset_peak_memory_stats()
        trainer.train()
    except Exception as error:  # noqa: BLE001 (not fitting is a result: recorded, and the stage goes on)
        import traceback

        traceback.print_exc()
        write_failure(args.out, name, key, system, setting, settings, error, bool(ends),
                      {"peak_gib": memory.peak_gib(), "step_s_each": np.diff(ends).tolist(),
                       "torch_max_allocated_gib": torch.cuda.max_memory_allocated() / 2**30 if cuda else None},
                      packages)
        sys.stdout.flush()
        os._exit(1)  # not interpreter shutdown: a failed colocated vLLM can hang there on its threads
    cold_start = cold.get("first_step_end_s")
    steps = np.diff(ends).tolist()
    median = lambda key: float(np.median(phases.spans.get(key, [0.0])[1:] or phases.spans.get(key, [0.0])))
    logs = [h for h in trainer.state.log_history if "completions/mean_length" in h]
    later = logs[1:] or logs
    metrics = {"step_s": float(np.median(steps[1:] or steps)), "step_s_each": steps,
               **{key: median(key) for key in ("generate", "sync_weights", "score")},
               "completion_mean_length": float(np.median([h["completions/mean_length"] for h in later])),
               "completion_min_length": min(h["completions/min_length"] for h in later),
               "completion_max_length": max(h["completions/max_length"] for h in later),
               "trl_logged_logp_difference_mean": [h.get("sampling/sampling_logp_difference/mean") for h in logs],
               "trl_logged_logp_difference_max": [h.get("sampling/sampling_logp_difference/max") for h in logs],
               "trl_step_time": [h.get("step_time") for h in logs], "cold_start_first_step_end_s": cold_start,
               "caches_at_start": caches}
    metrics["train"] = metrics["step_s"] - metrics["generate"] - metrics["sync_weights"] - metrics["score"]
    if args.vllm == "off":
        trainer.model.generate = trainer.model.__class__.generate.__get__(trainer.model)
        mismatch = [generation_vs_training_logprobs(trainer.model, rows[:work.prompts], tokenizer, work.samples,
                                                    128 if args.quick else 256)]
    later_mismatch = mismatch[1:] or mismatch
    if later_mismatch:
        metrics["mismatch_max"] = max(m["max"] for m in later_mismatch)
        metrics.update({f"mismatch_{k}": float(np.median([m[k] for m in later_mismatch])) for k in ("mean", "p99", "kl")})
        metrics["mismatch_tokens"] = later_mismatch[-1]["tokens"]
    metrics.update(peak_gib=memory.peak_gib(),
                   torch_max_reserved_gib=torch.cuda.max_memory_reserved() / 2**30 if cuda else None,
                   torch_max_allocated_gib=torch.cuda.max_memory_allocated() / 2**30 if cuda else None)
    memory.stop()
    print(f"{key} {label}: {metrics['step_s']:.2f} s/step (steps {', '.join(f'{s:.2f}' for s in steps)}; generate "
          f"{metrics['generate']:.2f}), mismatch max {metrics.get('mismatch_max', float('nan')):.3g}, mean "
          f"{metrics.get('mismatch_mean', float('nan')):.3g}, cold start {cold_start:.1f} s", flush=True)
    print(f"{key} {label}: peak {gib(metrics['peak_gib'])} GiB (torch's max allocated "
          f"{gib(metrics['torch_max_allocated_gib'])})", flush=True)
    write_record(args.out, name, key, system, setting, settings, metrics, packages)


if __name__ == "__main__":  # vLLM may start worker processes with spawn: the guard is needed
    main()
