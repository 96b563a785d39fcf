"""`barerl sft`, `barerl grpo` and `barerl eval`: configs from a YAML/TOML file and `--key value` flags
named by the config's own fields (every field, with its help and default, is in `--help`)."""

from __future__ import annotations

import argparse

from barerl.train.config import GRPOConfig, SFTConfig, add_config_arguments, config_from_namespace

CONFIGS = {"sft": SFTConfig, "grpo": GRPOConfig}


def add_arguments(parser: argparse.ArgumentParser, command: str) -> None:
    if command in CONFIGS:
        add_config_arguments(parser, CONFIGS[command])
        parser.add_argument("--resume", action="store_true",
                            help="continue from the newest complete checkpoint in output_dir "
                                 "(same as --resume_from_checkpoint latest)")
        return
    parser.add_argument("--model", required=True, help="model folder or .gguf file")
    parser.add_argument("--dataset", required=True, help="JSONL / Parquet / JSON file with a 'prompt' column")
    parser.add_argument("--reward", action="append", required=True,
                        help="reward function: a built-in name, module:function or file.py:function (repeatable)")
    parser.add_argument("--max_tokens", type=int, default=256, help="tokens generated per prompt (default 256)")
    parser.add_argument("--temperature", type=float, default=0.0, help="0 = greedy (default)")
    parser.add_argument("--limit", type=int, default=None, help="evaluate only the first N prompts")
    parser.add_argument("--device", default="auto", choices=("auto", "cpu", "cuda"))
    parser.add_argument("--dtype", default="auto", choices=("auto", "float32", "bfloat16", "float16"))


def run(args: argparse.Namespace) -> int:
    if args.command == "eval":
        return _run_eval(args)
    if args.resume:
        args.resume_from_checkpoint = "latest"
    cfg = config_from_namespace(CONFIGS[args.command], args)
    if args.command == "sft":
        from barerl.train.sft import train_sft

        result = train_sft(cfg)
        print(f"SFT done: {result.steps} steps, final loss {result.final_loss:.4f}"
              + (f", eval loss {result.eval_loss:.4f}" if result.eval_loss is not None else ""))
    else:
        from barerl.train.grpo import train_grpo

        result = train_grpo(cfg)
        print(f"GRPO done: {result.steps} steps, reward {result.rewards[0]:.3f} -> {result.rewards[-1]:.3f}")
    print(result.summary)
    print(f"checkpoint: {result.checkpoint}; metrics and curves in {result.output_dir}")
    return 0


def _run_eval(args: argparse.Namespace) -> int:
    from barerl.device import resolve_auto_dtype, resolve_device
    from barerl.engine.llm import LLM
    from barerl.train.data import load_dataset
    from barerl.train.evaluate import evaluate
    from barerl.train.rewards import load_rewards

    device = resolve_device(args.device)
    rows = load_dataset(args.dataset, task="grpo").rows[: args.limit]
    llm = LLM(args.model, device=device, dtype=resolve_auto_dtype(args.dtype, device))
    result = evaluate(llm, rows, load_rewards(args.reward), args.max_tokens, args.temperature)
    print(f"accuracy {result['accuracy']:.1%} (mean reward {result['reward']:.3f}) on {result['num_prompts']} prompts")
    return 0
