"""The `barerl` command's option spellings: dashes and underscores name the same option, as in Hugging Face's
argument parsers (`--output-dir` = `--output_dir`)."""

import argparse

import pytest

from barerl.cli import spelled_as_declared


def parser_of(module_name: str, *command) -> argparse.ArgumentParser:
    import importlib

    parser = argparse.ArgumentParser(exit_on_error=False)
    importlib.import_module(module_name).add_arguments(parser, *command)
    return parser


def test_underscore_options_take_dashes():
    parser = parser_of("barerl.train.demo")
    args = parser.parse_args(spelled_as_declared(parser, ["--output-dir", "runs/x", "--sft-steps=3"]))
    assert args.output_dir == "runs/x" and args.sft_steps == 3


def test_dash_options_take_underscores():
    parser = parser_of("barerl.engine.cli_generate")
    tokens = ["--model", "m", "--prompts_file", "p.jsonl", "--max_tokens=5"]
    assert spelled_as_declared(parser, tokens) == ["--model", "m", "--prompts-file", "p.jsonl", "--max-tokens=5"]


def test_config_options_of_a_trainer_take_both():
    parser = parser_of("barerl.train.cli", "grpo")
    for flag in ("--learning-rate", "--learning_rate"):
        args = parser.parse_args(spelled_as_declared(parser, [flag, "1e-5"]))
        assert args.learning_rate == "1e-5"  # the config converts it


def test_values_and_unknown_options_are_left_alone():
    parser = parser_of("barerl.train.demo")
    assert spelled_as_declared(parser, ["--", "--output-dir"]) == ["--", "--output-dir"]
    assert spelled_as_declared(parser, ["--no-such-flag"]) == ["--no-such-flag"]
    with pytest.raises(SystemExit):
        parser.parse_args(["--no-such-flag"])
