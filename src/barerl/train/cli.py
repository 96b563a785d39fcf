"""`barerl sft`, `barerl grpo` and `barerl eval`: configs (`SFTConfig`, `GRPOConfig`, `EvalConfig`) from a
YAML/TOML file and `--key value` flags named by the config's own fields (every field, with its help and
default, is in `--help`)."""

from __future__ import annotations

import argparse
import sys
import warnings

from barerl.config import ConfigError
from barerl.distributed import process_group
from barerl.train.config import GRPOConfig, SFTConfig, add_config_arguments, config_from_namespace
from barerl.train.trl_names import TRLNameNotice

CONFIGS = {"sft": SFTConfig, "grpo": GRPOConfig}


def add_arguments(parser: argparse.ArgumentParser, command: str) -> None:
    if command in CONFIGS:
        add_config_arguments(parser, CONFIGS[command])
        parser.add_argument("--resume", action="store_true",
                            help="continue from the newest complete checkpoint in output_dir "
                                 "(same as --resume_from_checkpoint latest)")
        return
    from barerl.train.evaluate import EvalConfig

    add_config_arguments(parser, EvalConfig)


def run(args: argparse.Namespace) -> int:
    if args.command == "eval":
        return _run_eval(args)
    if args.resume:
        args.resume_from_checkpoint = "latest"
    cfg = _config(CONFIGS[args.command], args)
    if args.command == "sft":
        from barerl.train.sft import train_sft

        result = train_sft(cfg)
        if not process_group().is_main:  # rank 0 reports for the job
            return 0
        print(f"SFT done: {result.steps} steps, final loss {result.final_loss:.4f}"
              + (f", eval loss {result.eval_loss:.4f}" if result.eval_loss is not None else ""))
    else:
        from barerl.train.grpo import train_grpo

        result = train_grpo(cfg)
        if not process_group().is_main:
            return 0
        print(f"GRPO done: {result.steps} steps, reward {result.rewards[0]:.3f} -> {result.rewards[-1]:.3f}")
    print(result.summary)
    print(f"checkpoint: {result.checkpoint or 'none written (save_strategy no)'}; metrics and curves in "
          f"{result.output_dir}")
    return 0


def _config(cls, args: argparse.Namespace):
    """The config; each TRL name it took is noted in one line (as the warning, it would be three)."""
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always", TRLNameNotice)
        cfg = config_from_namespace(cls, args)
    for w in caught:
        if issubclass(w.category, TRLNameNotice) and process_group().is_main:
            print(f"barerl {args.command}: note: {w.message}", file=sys.stderr)
        elif not issubclass(w.category, TRLNameNotice):
            warnings.warn_explicit(w.message, w.category, w.filename, w.lineno)
    return cfg


def _run_eval(args: argparse.Namespace) -> int:
    from barerl.train.data import load_dataset
    from barerl.train.evaluate import EngineSampler, EvalConfig, OpenAISampler, evaluate, write_samples

    cfg = config_from_namespace(EvalConfig, args)
    if (cfg.model is None) == (cfg.base_url is None):
        raise ConfigError("eval: give --model (generate in this process) or --base_url (ask a server), one of them")
    if cfg.dataset is None or not cfg.reward_funcs:
        raise ConfigError("eval: --dataset and --reward_funcs are needed")
    rows = load_dataset(cfg.dataset, task="grpo", split=cfg.dataset_split, config=cfg.dataset_config).rows[: cfg.limit]
    if cfg.base_url is not None:
        sampler = OpenAISampler(cfg.base_url, cfg.served_model_name, cfg.api_key)
    else:
        sampler = EngineSampler(_load_engine(cfg))
    result = evaluate(sampler, rows, list(cfg.reward_funcs), cfg)
    passes = ", ".join(f"pass@{k} {v:.1%}" for k, v in result.pass_at_k.items())
    print(f"accuracy {result.accuracy:.1%} on {result.num_prompts} prompts x {result.n} samples ({passes})")
    means = ", ".join(f"{name} {value:.3f}" for name, value in result.rewards.items())
    print(f"mean reward {result.reward:.3f} ({means})")
    if cfg.output:
        write_samples(cfg.output, result)
        print(f"samples: {cfg.output}")
    return 0


def _load_engine(cfg):
    from barerl.device import resolve_auto_dtype, resolve_device
    from barerl.engine.llm import LLM

    device = resolve_device(cfg.device)
    return LLM(cfg.model, device=device, dtype=resolve_auto_dtype(cfg.dtype, device))
