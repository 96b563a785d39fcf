"""First contact: the mistakes a new user makes first end in one sentence naming what was wrong (never a
traceback), before anything is written or loaded: no --model / --dataset, --device cuda without CuPy, a key
twice in a YAML file, NaN weights, GRPO prompts beyond the model's positions; and every command picks the
GPU the same way."""

import importlib.util
import json
import os
import subprocess
import sys
import types

import numpy as np
import pytest
from train_helpers import PROMPTS, grpo_config, run_grpo, starts_with_seven, tiny_model

from barerl.config import ConfigError
from barerl.device import resolve_device
from barerl.model.checkpoint import CheckpointError, save_checkpoint
from barerl.model.model import Model

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def barerl(*args, cwd):
    env = {**os.environ, "PYTHONPATH": os.path.join(ROOT, "src")}
    return subprocess.run([sys.executable, "-m", "barerl.cli", *map(str, args)], capture_output=True, text=True,
                          timeout=300, check=False, cwd=cwd, env=env)


def one_line_error(result, command: str) -> str:
    assert result.returncode == 1 and "Traceback" not in result.stderr, result.stderr
    line = result.stderr.strip().splitlines()[-1]
    assert line.startswith(f"barerl {command}: error: "), result.stderr
    return line


@pytest.mark.parametrize("args, message", [
    (["sft", "--dataset", "data.jsonl"], "model: no model given; set --model PATH"),
    (["grpo", "--model", "m", "--reward_funcs", "math_accuracy"], "dataset: no dataset given; set --dataset FILE"),
    (["sft", "--config", os.path.join(ROOT, "examples", "sft_chat.yaml")], "dataset: no dataset given"),
])
def test_a_missing_model_or_dataset_is_named(tmp_path, args, message):
    assert message in one_line_error(barerl(*args, cwd=tmp_path), args[0])
    assert not os.listdir(tmp_path)  # nothing written


@pytest.mark.skipif(importlib.util.find_spec("cupy") is not None, reason="CuPy is installed here")
@pytest.mark.parametrize("command", ["grpo", "generate"])
def test_device_cuda_without_cupy_says_which_extra_to_install(tmp_path, command):
    tail = ["--reward_funcs", "math_accuracy", "--dataset", "d.jsonl"] if command == "grpo" else ["--prompt", "hi"]
    tmp_model = tmp_path / "model"
    model = tiny_model()
    save_checkpoint(tmp_model, model.cfg, model.params)
    line = one_line_error(barerl(command, "--model", tmp_model, "--device", "cuda", *tail, cwd=tmp_path), command)
    assert "CuPy is not installed" in line and "pip install 'barerl[cuda12]'" in line and "[cuda13]" in line


def test_every_command_picks_the_gpu_when_cupy_finds_one(monkeypatch):
    import argparse

    from barerl.cli import build_parser  # noqa: F401 -- the commands' parsers, below
    from barerl.engine import cli_generate
    from barerl.train.evaluate import EvalConfig

    parser = argparse.ArgumentParser()
    cli_generate.add_arguments(parser)
    assert parser.get_default("device") == "auto"
    assert EvalConfig().device == "auto"  # barerl eval's flags come from it (train/cli.py)
    fake = types.SimpleNamespace(cuda=types.SimpleNamespace(runtime=types.SimpleNamespace(getDeviceCount=lambda: 1)))
    monkeypatch.setitem(sys.modules, "cupy", fake)
    assert resolve_device("auto") == "cuda"
    fake.cuda.runtime.getDeviceCount = lambda: 0
    assert resolve_device("auto") == "cpu"
    with pytest.raises(ValueError, match="device cuda: CuPy finds no GPU; use --device cpu"):
        resolve_device("cuda")


def test_a_key_given_twice_in_a_yaml_file_is_refused(tmp_path):
    config = tmp_path / "run.yaml"
    config.write_text("learning_rate: 1.0e-5\nmax_steps: 3\nlearning_rate: 2.0e-5\n")
    line = one_line_error(barerl("sft", "--config", config, "--model", "m", "--dataset", "d", cwd=tmp_path), "sft")
    assert f"config file {config}: key 'learning_rate' is given twice (lines 1 and 3)" in line


def test_nan_temperature_is_refused_by_the_config_too():
    with pytest.raises(ConfigError, match="temperature: must be a number, got nan"):
        grpo_config("out", temperature=float("nan"))


def test_nan_weights_are_refused_at_load_and_nan_logits_in_the_engine(tmp_path):
    from barerl import LLM, SamplingParams

    model = tiny_model()
    model.params["model.layers.0.mlp.down_proj.weight"][3, :2] = np.nan
    save_checkpoint(tmp_path / "nan", model.cfg, model.params)
    with pytest.raises(CheckpointError, match=r"tensor 'model.layers.0.mlp.down_proj.weight' holds 2 NaN or infinite "
                                              r"values of \d+: the checkpoint is damaged"):
        Model.from_pretrained(tmp_path / "nan")
    llm = LLM(model, num_kv_blocks=16)  # a model that became NaN in memory (e.g. training that diverged)
    with pytest.raises(ValueError, match="the model's logits are NaN: its weights hold NaN or inf"):
        llm.generate([[1, 2, 3]], SamplingParams(max_tokens=4), use_tqdm=False)


def test_grpo_prompts_beyond_the_model_positions_are_refused(tmp_path):
    with pytest.raises(ConfigError, match=r"max_prompt_length \(60\) \+ max_completion_length \(8\) is more than the "
                                          r"model's 64 positions"):
        run_grpo(grpo_config(tmp_path / "a", max_prompt_length=60, max_completion_length=8))
    long_row = {"prompt": "1+" * 30 + "1="}
    from barerl.train.demo import make_tokenizer
    from barerl.train.grpo import train_grpo

    with pytest.raises(ConfigError, match=r"dataset row \d+: its prompt has 62 tokens, which with "
                                          r"max_completion_length 8 is more than the model's 64 positions"):
        train_grpo(grpo_config(tmp_path / "b", max_prompt_length=None, max_completion_length=8), model=tiny_model(),
                   tokenizer=make_tokenizer(), rows=[*PROMPTS, long_row], reward_funcs=[starts_with_seven],
                   show_progress=False, engine_args={"num_kv_blocks": 64})


def test_the_engine_refuses_a_max_model_len_beyond_the_model_positions():
    from barerl import LLM

    with pytest.raises(ValueError, match=r"LLM: max_model_len=100 is more than the model's 64 positions"):
        LLM(tiny_model(), max_model_len=100)


def test_sampling_params_from_a_json_file_keep_their_errors_clear(tmp_path):
    from barerl import SamplingParams

    params = json.loads('{"temperature": NaN, "stop": 123}')
    with pytest.raises(ValueError, match="SamplingParams.stop: must be a string or a list of strings, got 123"):
        SamplingParams(**params)


@pytest.mark.gpu
def test_nan_weights_are_refused_on_the_gpu_in_bfloat16(tmp_path):
    model = tiny_model()
    save_checkpoint(tmp_path / "sound", model.cfg, model.params)
    assert Model.from_pretrained(tmp_path / "sound", device="cuda", dtype="bfloat16").device == "cuda"
    model.params["model.norm.weight"][0] = np.inf
    save_checkpoint(tmp_path / "inf", model.cfg, model.params)
    with pytest.raises(CheckpointError, match="tensor 'model.norm.weight' holds 1 NaN or infinite values"):
        Model.from_pretrained(tmp_path / "inf", device="cuda", dtype="bfloat16")
