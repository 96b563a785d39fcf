"""The peer for workload R1: TRL's GRPOTrainer (use_vllm off, its colocated transformers generation) on the
same model shape, tokenizer, prompts, lengths, batch and learning rate as bench/bench_grpo_step.py, in its
own process. Needs trl (1.16 works with transformers 5.x) and datasets, e.g. carried as wheels.
Phases: time inside the model's `generate` and inside the reward function, the rest of the step is training.
Mismatch: TRL without vLLM keeps no generation-time log-probs, so after training this script samples
completions with `generate(output_logits=True)` and compares those log-probs with a training-style forward
over the same sequences (what TRL computes its ratio from).

    PYTHONPATH=src python bench/bench_grpo_trl.py [--steps 3] [--quick] [--json FILE]
"""

from __future__ import annotations

import argparse
import json
import tempfile
import time

import numpy as np
from bench_grpo_step import cheap_reward, numbered_tokenizer
from bench_train_step import QWEN3_06B


def generation_vs_training_logprobs(model, rows, tokenizer, samples: int, new_tokens: int) -> dict:
    """|log-prob at sampling - log-prob of a training forward| over completion tokens, and the KL estimate.

    Prompts are left-padded and the training forward gets the attention mask of prompt + completion (up to
    its EOS) and no position ids, as TRL's GRPOTrainer computes its log-probs."""
    import torch

    device = next(model.parameters()).device
    pad = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else tokenizer.eos_token_id
    enc = tokenizer([r["prompt"] for r in rows], return_tensors="pt", padding=True, padding_side="left",
                    add_special_tokens=False)
    ids = enc.input_ids.repeat_interleave(samples, dim=0).to(device)
    prompt_mask = enc.attention_mask.repeat_interleave(samples, dim=0).to(device)
    model.eval()
    with torch.no_grad(), torch.autocast(device.type, dtype=torch.bfloat16, enabled=device.type == "cuda"):
        out = model.generate(ids, attention_mask=prompt_mask, do_sample=True, temperature=1.0, top_k=0, top_p=1.0,
                             max_new_tokens=new_tokens, pad_token_id=pad, eos_token_id=tokenizer.eos_token_id,
                             output_logits=True, return_dict_in_generate=True)
        completion = out.sequences[:, ids.shape[1]:]
        is_eos = completion == tokenizer.eos_token_id
        alive = (torch.cumsum(is_eos, dim=1) - is_eos.long()) == 0  # up to and including the first EOS
        sampled = torch.stack(out.logits, dim=1).float().log_softmax(-1)
        sampled = sampled.gather(-1, completion[..., None])[..., 0]
        model.train()
        mask = torch.cat([prompt_mask, alive.long()], dim=1)
        logits = model(out.sequences, attention_mask=mask).logits
        trained = logits[:, ids.shape[1] - 1:-1].float().log_softmax(-1).gather(-1, completion[..., None])[..., 0]
    delta = (sampled - trained)[alive]
    ratio = torch.exp(trained - sampled)[alive]
    return {"max": float(delta.abs().max()), "mean": float(delta.abs().mean()),
            "p99": float(torch.quantile(delta.abs().float(), 0.99)), "kl": float((ratio - 1 - torch.log(ratio)).mean()),
            "tokens": int(alive.sum())}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=3, help="GRPO steps; the first is a warm-up")
    parser.add_argument("--quick", action="store_true", help="a tiny model and short sequences (CPU smoke test)")
    parser.add_argument("--json", default=None)
    args = parser.parse_args()

    import datasets
    import torch
    import transformers
    import trl

    cfg = {k: v for k, v in QWEN3_06B.items() if k != "architectures"}
    prompt_len, new_tokens = 128, 1024
    if args.quick:
        cfg.update(vocab_size=512, hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                   num_attention_heads=4, num_key_value_heads=2, head_dim=16)
        prompt_len, new_tokens = 16, 16
    cuda = torch.cuda.is_available()
    folder = tempfile.mkdtemp(prefix="r1-tok-")
    numbered_tokenizer(cfg["vocab_size"]).save_pretrained(folder)
    tokenizer = transformers.AutoTokenizer.from_pretrained(folder)
    torch.manual_seed(0)
    model = transformers.AutoModelForCausalLM.from_config(
        transformers.Qwen3Config(**cfg, eos_token_id=1, pad_token_id=0), dtype=torch.bfloat16 if cuda else None
    )
    rng = np.random.default_rng(0)
    rows = [{"prompt": " ".join(f"t{i}" for i in rng.integers(2, cfg["vocab_size"], prompt_len))}
            for _ in range(8 * args.steps)]
    config = trl.GRPOConfig(
        output_dir=tempfile.mkdtemp(prefix="r1-trl-"), max_steps=args.steps, num_generations=8,
        per_device_train_batch_size=16, gradient_accumulation_steps=4, max_completion_length=new_tokens,
        temperature=1.0, learning_rate=1e-6, lr_scheduler_type="constant", gradient_checkpointing=True,
        loss_type="dapo", beta=0.0, bf16=cuda, use_vllm=False, logging_steps=1, save_strategy="no",
        report_to="none", seed=0, shuffle_dataset=False, use_cpu=not cuda,
    )

    times: list[float] = []
    phase = {"generate": [], "score": []}

    def timed(fn, key):
        def wrapper(*a, **k):
            if cuda:
                torch.cuda.synchronize()
            start = time.perf_counter()
            out = fn(*a, **k)
            if cuda:
                torch.cuda.synchronize()
            phase[key].append(time.perf_counter() - start)
            return out
        return wrapper

    model.generate = timed(model.generate, "generate")
    reward = timed(cheap_reward, "score")
    reward.__name__ = "cheap_reward"

    class StepTimer(transformers.TrainerCallback):
        def on_step_begin(self, *_, **__):
            if cuda:
                torch.cuda.synchronize()
            self.start = time.perf_counter()

        def on_step_end(self, *_, **__):
            if cuda:
                torch.cuda.synchronize()
            times.append(time.perf_counter() - self.start)

    trainer = trl.GRPOTrainer(model=model, reward_funcs=[reward], args=config,
                              train_dataset=datasets.Dataset.from_list(rows), processing_class=tokenizer,
                              callbacks=[StepTimer()])
    if cuda:
        torch.cuda.reset_peak_memory_stats()
    trainer.train()
    result = {"system": f"TRL {trl.__version__} GRPOTrainer", "step_s": float(np.median(times[1:] or times)),
              "step_times_s": times}
    for key, spans in phase.items():  # one generate / reward call per step here
        result[f"time/{key}"] = float(np.median(spans[1:] or spans))
    result["time/train"] = result["step_s"] - result["time/generate"] - result["time/score"]
    if cuda:
        result["peak_gib"] = torch.cuda.max_memory_allocated() / 2**30
    print(f"R1 {result['system']}: {result['step_s']:.2f} s/step (generate {result['time/generate']:.2f}, score "
          f"{result['time/score']:.3f}, train {result['time/train']:.2f}; steps: {', '.join(f'{t:.2f}' for t in times)})"
          + (f", peak {result['peak_gib']:.1f} GiB" if cuda else ""), flush=True)
    model.generate = model.__class__.generate.__get__(model)
    result["mismatch"] = generation_vs_training_logprobs(model, rows[:8], tokenizer, 8, 128 if args.quick else 256)
    print("TRL generation vs training log-prob mismatch: "
          + ", ".join(f"{k} {v:.3g}" for k, v in result["mismatch"].items()))
    if args.json:
        with open(args.json, "w") as f:
            json.dump(result, f, indent=1)


if __name__ == "__main__":
    main()
