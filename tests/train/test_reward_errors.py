"""Reward-function mistakes end in one clear message naming the function, the dataset row and what was wrong
(never a traceback to decode), before the run trains on anything wrong: missing columns, missing **kwargs,
infinite values, a broken module, a reward that never returns (reward_timeout's default)."""

import math
import textwrap

import numpy as np
import pytest
from train_helpers import cli, grpo_config, run_grpo, write_model_folder

from barerl.train.config import GRPOConfig
from barerl.train.reward_errors import check_reward_columns
from barerl.train.rewards import RewardError, RewardRunner, load_reward_function, load_rewards

MISTAKES = textwrap.dedent("""
    import math

    def needs_answer(prompts, completions, answer, **kwargs):
        return [float(c == a) for c, a in zip(completions, answer)]

    def no_kwargs(prompts, completions):
        return [0.0] * len(completions)

    def infinite(prompts, completions, **kwargs):
        return [math.inf if i == 1 else 0.0 for i in range(len(completions))]

    def not_applicable(prompts, completions, **kwargs):
        return [math.nan, None][: len(completions)]
""")


@pytest.fixture
def mistakes(tmp_path):
    path = tmp_path / "mistakes.py"
    path.write_text(MISTAKES)
    return str(path)


def score(spec, columns=None, row_ids=None):
    with RewardRunner(load_rewards(spec), num_workers=0) as runner:
        return runner(["1+1=", "1+1="], ["2", "3"], columns, row_ids)


def test_a_missing_column_is_named_with_the_row(mistakes):
    with pytest.raises(RewardError, match=r"reward 'needs_answer' on dataset row 17 \(prompt '1\+1='\): needs the "
                                          r"column 'answer', which the row lacks \(it has: task\)"):
        score(f"{mistakes}:needs_answer", {"task": ["math"] * 2}, row_ids=[17, 17])


def test_a_reward_without_kwargs_is_told_to_take_them(mistakes):
    with pytest.raises(RewardError, match=r"takes no parameter 'task'; the trainer passes every column of the "
                                          r"row, so give the function a \*\*kwargs parameter"):
        score(f"{mistakes}:no_kwargs", {"task": ["math"] * 2})


def test_an_infinite_reward_is_refused_and_nan_means_no_reward(mistakes):
    with pytest.raises(RewardError, match=r"reward 'infinite' on dataset row 5 \(prompt '1\+1='\), completion 1: "
                                          r"returned inf; a reward must be finite \(None or NaN: no reward"):
        score(f"{mistakes}:infinite", row_ids=[5, 5])
    scores = score([f"{mistakes}:not_applicable", "length_penalty"])
    assert math.isnan(scores.per_function[0, 0]) and math.isnan(scores.per_function[1, 0])
    np.testing.assert_array_equal(scores.total, [0.0, 0.0])


def test_loading_mistakes_name_what_is_missing(tmp_path, mistakes):
    with pytest.raises(RewardError, match=r"has no function 'needs_anwser' \(it has: infinite, needs_answer, "
                                          r"no_kwargs, not_applicable\)"):
        load_reward_function(f"{mistakes}:needs_anwser")
    broken = tmp_path / "broken_rewards_module.py"
    broken.write_text("def f(:\n")
    import sys

    sys.path.insert(0, str(tmp_path))
    try:
        with pytest.raises(RewardError, match="cannot import module 'broken_rewards_module': SyntaxError"):
            load_reward_function("broken_rewards_module:f")
    finally:
        sys.path.remove(str(tmp_path))


def test_a_dataset_row_without_a_needed_column_fails_before_anything_is_generated(mistakes):
    rows = [{"prompt": "1+1=", "answer": "2"}] * 3 + [{"prompt": "2+2="}]
    with pytest.raises(RewardError, match=r"reward 'needs_answer' on dataset row 3 \(prompt '2\+2='\): needs the "
                                          r"column 'answer'"):
        check_reward_columns(load_rewards(f"{mistakes}:needs_answer"), rows)
    check_reward_columns(load_rewards(f"{mistakes}:needs_answer"), rows[:3])


def test_reward_timeout_has_a_default():
    assert GRPOConfig().reward_timeout == 300


def test_an_infinite_reward_stops_grpo_before_any_update(tmp_path, mistakes):
    with pytest.raises(RewardError, match=r"reward 'infinite' on dataset row \d+ \(prompt '\d\+\d='\), completion 1: "
                                          "returned inf"):
        run_grpo(grpo_config(tmp_path / "run", save_steps=1), reward_funcs=[f"{mistakes}:infinite"])
    assert not list((tmp_path / "run").glob("checkpoint-*"))  # no step was taken on the bad rewards


def test_the_cli_shows_reward_mistakes_in_one_line(tmp_path, mistakes):
    folder, _ = write_model_folder(tmp_path)
    data = tmp_path / "prompts.jsonl"
    data.write_text('{"prompt": "1+1=", "answer": "2"}\n{"prompt": "2+2="}\n')
    result = cli("grpo", "--model", folder, "--dataset", data, "--reward_funcs", f"{mistakes}:needs_answer",
                 "--output_dir", tmp_path / "run", "--num_generations", 2, "--per_device_train_batch_size", 2)
    assert result.returncode == 1
    assert "Traceback" not in result.stderr
    assert result.stderr.strip().endswith("barerl grpo: error: reward 'needs_answer' on dataset row 1 (prompt "
                                          "'2+2='): needs the column 'answer', which the row lacks (it has: no other "
                                          "column)")
