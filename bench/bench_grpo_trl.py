"""The peer for workload R1: TRL's GRPOTrainer (use_vllm off, its colocated transformers generation) on the
same model shape, tokenizer, prompts, lengths, batch and learning rate as bench/bench_grpo_step.py, in its
own process. Needs trl (1.16 works with transformers 5.x) and datasets, e.g. carried as wheels.

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

    class StepTimer(transformers.TrainerCallback):
        def on_step_begin(self, *_, **__):
            if cuda:
                torch.cuda.synchronize()
            self.start = time.perf_counter()

        def on_step_end(self, *_, **__):
            if cuda:
                torch.cuda.synchronize()
            times.append(time.perf_counter() - self.start)

    trainer = trl.GRPOTrainer(model=model, reward_funcs=[cheap_reward], args=config,
                              train_dataset=datasets.Dataset.from_list(rows), processing_class=tokenizer,
                              callbacks=[StepTimer()])
    if cuda:
        torch.cuda.reset_peak_memory_stats()
    trainer.train()
    result = {"system": f"TRL {trl.__version__} GRPOTrainer", "step_s": float(np.median(times[1:] or times)),
              "step_times_s": times}
    if cuda:
        result["peak_gib"] = torch.cuda.max_memory_allocated() / 2**30
    print(f"R1 {result['system']}: {result['step_s']:.2f} s/step (steps: {', '.join(f'{t:.2f}' for t in times)})"
          + (f", peak {result['peak_gib']:.1f} GiB" if cuda else ""))
    if args.json:
        with open(args.json, "w") as f:
            json.dump(result, f, indent=1)


if __name__ == "__main__":
    main()
