"""`barerl demo`: the whole loop with nothing downloaded.

A verifiable task made on the fly (multi-digit addition, "37+48=" -> "85"), a character-level tokenizer and
a small Qwen3-architecture model created on the spot, SFT from scratch on a few hundred steps, then GRPO
with an exact-match reward. Accuracy on held-out problems (greedy decoding with the engine) is printed
before GRPO and after it; the metrics plot and a Hugging Face-format checkpoint land in the output folder.

SFT is stopped early on purpose: it leaves a model that is often right but not always, which is where RL
has something to show. `--lora_r R` runs the GRPO stage with LoRA: the SFT model frozen, rank-R adapters
on every linear layer trained (at a larger learning rate, as adapters are). Sizes are picked so the whole
run takes a few minutes on a 2-core CPU; on a GPU the model and batches are larger.
"""

from __future__ import annotations

import argparse
import time
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from barerl.config import ModelConfig

CHARS = list("0123456789+=")
SPECIAL = {"pad_token": "<pad>", "bos_token": "<bos>", "eos_token": "<eos>"}
CHAT_TEMPLATE = "{% for m in messages %}{{ m['content'] }}{% endfor %}"


@dataclass(frozen=True)
class DemoSize:
    hidden: int
    layers: int
    dtype: str  # bf16 on the GPU: the kernels' fast path (fp32 master weights all the same)
    sft_steps: int
    sft_batch: int
    sft_learning_rate: float
    grpo_steps: int
    prompts_per_step: int
    grpo_learning_rate: float
    lora_learning_rate: float  # GRPO's with --lora_r


SIZES = {
    "cpu": DemoSize(hidden=128, layers=2, dtype="float32", sft_steps=300, sft_batch=64, sft_learning_rate=3e-3,
                    grpo_steps=60, prompts_per_step=64, grpo_learning_rate=3e-4, lora_learning_rate=1e-3),
    # not yet tuned on a GPU: sizes and rates scaled from the CPU run
    "cuda": DemoSize(hidden=512, layers=6, dtype="bfloat16", sft_steps=300, sft_batch=128, sft_learning_rate=1e-3,
                     grpo_steps=60, prompts_per_step=64, grpo_learning_rate=1e-4, lora_learning_rate=3e-4),
}


def make_tokenizer():
    """A character-level tokenizer (every digit and sign is one token), built with `tokenizers`."""
    from tokenizers import Regex, decoders, models, pre_tokenizers
    from tokenizers import Tokenizer as Backend

    from barerl.tokenizer import Tokenizer

    vocab = {tok: i for i, tok in enumerate(list(SPECIAL.values()) + CHARS)}
    backend = Backend(models.WordLevel(vocab, unk_token="<pad>"))
    backend.pre_tokenizer = pre_tokenizers.Split(Regex("."), behavior="isolated")
    backend.decoder = decoders.Fuse()
    return Tokenizer(backend, special_tokens=SPECIAL, chat_template=CHAT_TEMPLATE, source="barerl demo",
                     add_bos_token=False, add_eos_token=False)


def make_model_config(size: DemoSize, vocab_size: int) -> ModelConfig:
    heads = max(4, size.hidden // 64)
    return ModelConfig.from_dict({
        "architectures": ["Qwen3ForCausalLM"], "vocab_size": vocab_size, "hidden_size": size.hidden,
        "intermediate_size": 3 * size.hidden, "num_hidden_layers": size.layers, "num_attention_heads": heads,
        "num_key_value_heads": heads // 2, "head_dim": size.hidden // heads, "rope_theta": 10000.0,
        "tie_word_embeddings": True, "max_position_embeddings": 64, "bos_token_id": 1, "eos_token_id": 2,
        "pad_token_id": 0,
    }, source="barerl demo")


def addition_problems(n: int, seed: int, digits: int = 2) -> list[dict]:
    rng = np.random.default_rng(seed)
    a, b = rng.integers(0, 10**digits, size=(2, n))
    return [{"prompt": f"{x}+{y}=", "completion": str(x + y), "answer": str(x + y)} for x, y in zip(a, b)]


def exact_answer(prompts, completions, answer, **_) -> list[float]:
    """1.0 when the completion is exactly the sum, else 0.0."""
    return [float(c.strip() == a) for c, a in zip(completions, answer)]


def accuracy(llm, rows: list[dict]) -> float:
    from barerl.train.evaluate import EvalConfig, evaluate

    return evaluate(llm, rows, [exact_answer], EvalConfig(max_tokens=4)).accuracy


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--output_dir", default="runs/demo", help="where checkpoints, metrics and plots go")
    parser.add_argument("--device", default="auto", choices=("auto", "cpu", "cuda"))
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--sft_steps", type=int, default=None, help="override the size's SFT steps")
    parser.add_argument("--grpo_steps", type=int, default=None, help="override the size's GRPO steps")
    parser.add_argument("--grpo_learning_rate", type=float, default=None, help="override GRPO's learning rate")
    parser.add_argument("--lora_r", type=int, default=0,
                        help="GRPO with rank-R LoRA adapters on every linear layer, the SFT model frozen (0: off)")


def run(args: argparse.Namespace) -> int:
    from barerl.device import resolve_device
    from barerl.engine.llm import LLM
    from barerl.model.model import Model
    from barerl.train.config import GRPOConfig, SFTConfig
    from barerl.train.grpo import train_grpo
    from barerl.train.sft import train_sft

    device = resolve_device(args.device)
    size = SIZES[device]
    sft_steps = args.sft_steps if args.sft_steps is not None else size.sft_steps
    grpo_steps = args.grpo_steps if args.grpo_steps is not None else size.grpo_steps
    out = Path(args.output_dir)
    started = time.perf_counter()
    tokenizer = make_tokenizer()
    cfg = make_model_config(size, tokenizer.vocab_size)
    model = Model.random(cfg, device=device, dtype=size.dtype, seed=args.seed)
    print(f"barerl demo on {device}: {cfg.num_parameters() / 1e6:.2f}M-parameter {cfg.architecture}, "
          f"2-digit addition")
    held_out = addition_problems(200, seed=args.seed + 1)
    engine = {"num_kv_blocks": 512, "max_num_seqs": 256}

    print(f"[1/3] SFT from scratch, {sft_steps} steps")
    # each demo run replaces the previous one's results (overwrite_output_dir)
    sft = SFTConfig(output_dir=str(out / "sft"), overwrite_output_dir=True, max_steps=sft_steps, learning_rate=size.sft_learning_rate, warmup_steps=20,
                    lr_scheduler_type="constant", per_device_train_batch_size=size.sft_batch, packing=False,
                    save_steps=0, seed=args.seed, report_to=("jsonl",), weight_decay=0.0)
    train_sft(sft, model=model, tokenizer=tokenizer, rows=addition_problems(20000, seed=args.seed))
    llm = LLM(model, tokenizer, device=device, seed=args.seed, **engine)
    before = accuracy(llm, held_out)
    print(f"      held-out accuracy after SFT: {before:.1%}")

    lora = f", LoRA r={args.lora_r}" if args.lora_r else ""
    print(f"[2/3] GRPO{lora}, {grpo_steps} steps x {size.prompts_per_step} prompts x 8 samples")
    learning_rate = args.grpo_learning_rate or (size.lora_learning_rate if args.lora_r else size.grpo_learning_rate)
    grpo = GRPOConfig(output_dir=str(out / "grpo"), overwrite_output_dir=True, max_steps=grpo_steps, learning_rate=learning_rate,
                      **({"lora_r": args.lora_r, "lora_alpha": 2 * args.lora_r} if args.lora_r else {}),
                      per_device_train_batch_size=size.prompts_per_step * 8, num_generations=8,
                      max_completion_length=4, max_prompt_length=8, temperature=1.0, beta=0.0,
                      lr_scheduler_type="constant", save_steps=grpo_steps, seed=args.seed, log_completions_steps=10)
    result = train_grpo(grpo, model=model, tokenizer=tokenizer, rows=addition_problems(20000, seed=args.seed + 2),
                        reward_funcs=[exact_answer], engine_args=engine)
    after = accuracy(llm, held_out)

    print(f"[3/3] held-out accuracy: {before:.1%} after SFT -> {after:.1%} after GRPO "
          f"(train reward {np.mean(result.rewards[:3]):.2f} -> {np.mean(result.rewards[-3:]):.2f})")
    print(f"      checkpoint ({'a PEFT adapter' if args.lora_r else 'Hugging Face format'}): {result.checkpoint}")
    print(f"      curves: {out / 'grpo' / 'curves.png'}, metrics: {out / 'grpo' / 'metrics.jsonl'}")
    print(f"      total time {time.perf_counter() - started:.0f}s")
    return 0
