"""The `barerl` command: one subcommand per job, each defined next to the code it runs.

Subcommand modules are imported only when their command runs, so `barerl --help` stays fast and a
missing optional dependency of one command never breaks the others.
"""

from __future__ import annotations

import argparse
import importlib
import sys

import barerl

# name -> (module, help). Each module provides `add_arguments(parser)` and `run(args) -> int | None`.
COMMANDS = {
    "demo": ("barerl.train.demo", "the whole loop on a built-in task: tiny model, SFT, then GRPO (no downloads)"),
    "sft": ("barerl.train.cli", "supervised fine-tuning on a chat / prompt-completion / text dataset"),
    "grpo": ("barerl.train.cli", "GRPO reinforcement learning with Python reward functions"),
    "eval": ("barerl.train.cli", "pass@k and mean rewards of a model on a task, in-process or over the OpenAI API"),
    "generate": ("barerl.engine.cli_generate", "generate completions with the inference engine"),
    "serve": ("barerl.serve.cli", "an OpenAI-compatible server for a model (needs barerl[serve])"),
    "info": ("barerl.info", "describe a model folder or GGUF file: architecture, size, tokenizer"),
    "merge": ("barerl.model.merge", "merge a PEFT LoRA adapter into its base model: a Hugging Face checkpoint"),
}


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="barerl", description="RL post-training (SFT + GRPO) for language models, with no PyTorch."
    )
    parser.add_argument("--version", action="version", version=f"barerl {barerl.__version__}")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")
    for name, (_, help_text) in COMMANDS.items():
        sub.add_parser(name, help=help_text, add_help=False)
    return parser


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    parser = build_parser()
    if not argv or argv[0] not in COMMANDS:
        parser.parse_args(argv)  # handles --help, --version and unknown commands
        parser.print_help()
        return 2
    name = argv[0]
    module = importlib.import_module(COMMANDS[name][0])
    sub = argparse.ArgumentParser(prog=f"barerl {name}", description=COMMANDS[name][1])
    module.add_arguments(sub, name) if _takes_command(module) else module.add_arguments(sub)
    args = sub.parse_args(spelled_as_declared(sub, argv[1:]))
    args.command = name
    try:
        return int(module.run(args) or 0)
    except KeyboardInterrupt as e:  # a training loop's TrainingInterrupted says what it saved and how to resume
        print(str(e) or "interrupted", file=sys.stderr)
        return getattr(e, "exit_code", 130)
    except (ValueError, FileNotFoundError, OSError) as e:
        # Our errors name the file and the field; a traceback would only bury that.
        print(f"barerl {name}: error: {e}", file=sys.stderr)
        return 1


def spelled_as_declared(parser: argparse.ArgumentParser, tokens: list[str]) -> list[str]:
    """Option tokens in the spelling the parser declares, so that `--output-dir` and `--output_dir` (and
    `--prompts_file` for `--prompts-file`) name the same option, as in Hugging Face's argument parsers."""
    declared = set(parser._option_string_actions)
    out = list(tokens)
    for i, token in enumerate(tokens):
        if token == "--":  # the rest are values
            break
        flag, eq, value = token.partition("=")
        if not flag.startswith("--") or flag in declared:
            continue
        for other in ("--" + flag[2:].replace("-", "_"), "--" + flag[2:].replace("_", "-")):
            if other in declared:
                out[i] = other + eq + value
                break
    return out


def _takes_command(module) -> bool:
    """Modules serving several commands (sft/grpo/eval) get the command name too."""
    return module.add_arguments.__code__.co_argcount == 2


if __name__ == "__main__":
    sys.exit(main())
