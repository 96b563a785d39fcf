"""Training configs: defaults, file + override loading, type conversion, and errors that name the key."""

import dataclasses

import pytest

from barerl.config import ConfigError
from barerl.train.config import (
    GRPOConfig,
    SFTConfig,
    TrainConfig,
    build_argparser,
    config_from_argv,
    load_config,
)


def test_defaults_follow_trl():
    g = GRPOConfig()
    assert (g.learning_rate, g.loss_type, g.beta, g.epsilon, g.epsilon_high) == (1e-6, "dapo", 0.0, 0.2, None)
    assert (g.num_generations, g.max_completion_length, g.temperature, g.top_p, g.top_k) == (8, 256, 1.0, 1.0, 0)
    assert (g.scale_rewards, g.importance_sampling_level, g.importance_sampling_mode) == (
        "group", "token", "sequence_mask")
    assert g.importance_sampling_cap == 3.0 and g.importance_sampling_correction
    assert SFTConfig().learning_rate == 2e-5 and SFTConfig().max_length == 1024
    assert g.effective_steps_per_generation == 1 and g.effective_generation_batch_size == 8


def test_every_field_has_help():
    for cls in (TrainConfig, SFTConfig, GRPOConfig):
        for f in dataclasses.fields(cls):
            assert f.metadata.get("help"), f"{cls.__name__}.{f.name} has no help"


def test_yaml_then_overrides(tmp_path):
    path = tmp_path / "run.yaml"
    path.write_text("model: m\nlearning_rate: 1e-6\nmax_steps: 5\nreport_to: [jsonl, tensorboard]\n"
                    "reward_funcs: [a:f]\nscale_rewards: false\n")
    cfg = load_config(GRPOConfig, path, ["--max_steps", "10", "--reward_funcs", "a:f,b:g", "--reward_funcs",
                                         "c:h", "--reward_weights", "1,0.5,2", "--dynamic_sampling",
                                         "--top_k=5", "--min_p", "None", "--mask_truncated_completions", "false"])
    assert cfg.learning_rate == 1e-6 and isinstance(cfg.learning_rate, float)  # YAML reads 1e-6 as a string
    assert cfg.max_steps == 10 and cfg.top_k == 5 and cfg.min_p is None
    assert cfg.report_to == ("jsonl", "tensorboard")
    assert cfg.reward_funcs == ("a:f", "b:g", "c:h") and cfg.reward_weights == (1.0, 0.5, 2.0)
    assert cfg.dynamic_sampling is True and cfg.mask_truncated_completions is False
    assert cfg.scale_rewards == "none"  # TRL's False
    assert cfg.to_dict()["report_to"] == ["jsonl", "tensorboard"]
    assert GRPOConfig(**cfg.to_dict()) == cfg  # what a checkpoint stores rebuilds the same config


def test_toml_and_config_flag(tmp_path):
    path = tmp_path / "run.toml"
    path.write_text('model = "m"\nnum_train_epochs = 2\npacking = false\n')
    cfg = config_from_argv(SFTConfig, ["--config", str(path), "--seed", "7"])
    assert (cfg.model, cfg.num_train_epochs, cfg.packing, cfg.seed) == ("m", 2.0, False, 7)


def test_usable_without_a_file():
    cfg = config_from_argv(GRPOConfig, ["--model", "m", "--dataset", "d.jsonl", "--max_steps", "3"])
    assert (cfg.model, cfg.dataset, cfg.max_steps) == ("m", "d.jsonl", 3)


@pytest.mark.parametrize("where", ["file", "flag"])
def test_unknown_key_suggests_the_closest(tmp_path, where):
    path = tmp_path / "c.yaml"
    path.write_text("max_step: 3\n" if where == "file" else "{}\n")
    flags = ["--learning_rat", "1"] if where == "flag" else []
    with pytest.raises(ConfigError) as e:
        load_config(GRPOConfig, path, flags)
    expected = "'max_step'.*did you mean 'max_steps'" if where == "file" else "'learning_rat'.*'learning_rate'"
    assert e.match(expected)
    assert e.match(str(path)) if where == "file" else e.match("command line")


@pytest.mark.parametrize(
    "flags,match",
    [
        (["--max_steps", "ten"], r"max_steps: expected int, got 'ten'"),
        (["--learning_rate", "fast"], r"learning_rate: expected float, got 'fast'"),
        (["--packing", "maybe"], r"packing: expected bool, got 'maybe'"),
        (["--loss_type", "ppo"], r"loss_type: must be one of .*'dapo'.*got 'ppo'"),
        (["--top_p", "0"], r"top_p: must be in \(0, 1\], got 0.0"),
        (["--max_steps"], r"--max_steps.*expected one argument"),
        (["oops"], r"unexpected value 'oops'"),
    ],
)
def test_bad_values_name_the_key(flags, match):
    cls = SFTConfig if "--packing" in flags else GRPOConfig
    with pytest.raises(ConfigError, match=match):
        load_config(cls, None, flags)


def test_wrong_type_in_file_names_file_key_and_value(tmp_path):
    path = tmp_path / "c.yaml"
    path.write_text("num_generations: [1, 2]\n")
    with pytest.raises(ConfigError, match=r"c.yaml: num_generations: expected int, got \[1, 2\]"):
        load_config(GRPOConfig, path)


def test_bad_file_errors(tmp_path):
    with pytest.raises(ConfigError, match="does not exist"):
        load_config(GRPOConfig, tmp_path / "missing.yaml")
    bad = tmp_path / "bad.yaml"
    bad.write_text("a: [1,\n")
    with pytest.raises(ConfigError, match="bad.yaml"):
        load_config(GRPOConfig, bad)
    (tmp_path / "list.yaml").write_text("- 1\n")
    with pytest.raises(ConfigError, match="expected a mapping"):
        load_config(GRPOConfig, tmp_path / "list.yaml")


def test_cross_field_validation():
    with pytest.raises(ConfigError, match="reward_weights: 1 weights for 2 reward_funcs"):
        GRPOConfig(reward_funcs=("a:f", "b:g"), reward_weights=(1.0,))
    with pytest.raises(ConfigError, match="num_generations.*multiple"):
        GRPOConfig(per_device_train_batch_size=6, num_generations=4)
    with pytest.raises(ConfigError, match="set at most one"):
        GRPOConfig(generation_batch_size=16, steps_per_generation=2)
    with pytest.raises(ConfigError, match="offload_optimizer_ratio=0.5: applies only with offload_optimizer"):
        GRPOConfig(offload_optimizer_ratio=0.5)
    assert GRPOConfig(offload_optimizer=True, offload_optimizer_ratio=0.5).offload_optimizer_ratio == 0.5
    for ratio in (0.0, 1.5):  # the share must be in (0, 1]
        with pytest.raises(ConfigError, match="offload_optimizer_ratio"):
            GRPOConfig(offload_optimizer=True, offload_optimizer_ratio=ratio)
    assert GRPOConfig(generation_batch_size=32).effective_steps_per_generation == 4
    assert GRPOConfig(resume_from_checkpoint="true").resume_from_checkpoint == "latest"
    with pytest.raises(ConfigError, match="report_to"):
        GRPOConfig(report_to=("none", "wandb"))


def test_help_lists_every_option_with_default(capsys):
    with pytest.raises(SystemExit) as e:
        config_from_argv(GRPOConfig, ["--help"], prog="barerl grpo")
    assert e.value.code == 0
    out = " ".join(capsys.readouterr().out.split())
    for f in dataclasses.fields(GRPOConfig):
        assert f"--{f.name}" in out
    assert "(default: dapo)" in out and "(default: 0.2)" in out
    assert build_argparser(SFTConfig).parse_args(["--packing"]).packing == "true"


def test_arguments_on_an_existing_parser(tmp_path):
    import argparse

    from barerl.train.config import add_config_arguments, config_from_namespace

    path = tmp_path / "c.yaml"
    path.write_text("max_steps: 4\nreward_funcs: [a:f]\n")
    parser = argparse.ArgumentParser(prog="barerl grpo")
    parser.add_argument("--verbose", action="store_true")  # the CLI's own flags are left alone
    add_config_arguments(parser, GRPOConfig)
    args = parser.parse_args(["--config", str(path), "--verbose", "--seed", "3", "--beta", "0.01"])
    cfg = config_from_namespace(GRPOConfig, args)
    assert (cfg.max_steps, cfg.seed, cfg.beta, cfg.reward_funcs) == (4, 3, 0.01, ("a:f",))
    assert config_from_namespace(GRPOConfig, parser.parse_args([])) == GRPOConfig()
