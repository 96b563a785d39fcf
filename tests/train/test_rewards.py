"""Reward functions: answer extraction, built-ins, loading from config, error reporting, worker processes."""

import textwrap
import time

import numpy as np
import pytest

from barerl.train.math_grading import answers_match, extract_answer, extract_boxed
from barerl.train.rewards import (
    RewardError,
    RewardRunner,
    format_tags,
    length_penalty,
    load_reward_function,
    load_rewards,
    math_accuracy,
)


@pytest.mark.parametrize("text, expected", [
    (r"so \boxed{42}.", "42"),
    (r"\boxed{\frac{1}{2}}", r"\frac{1}{2}"),
    (r"first \boxed{1} then \boxed{x^{2}+\sqrt{y}}", r"x^{2}+\sqrt{y}"),  # last one, nested braces
    (r"\fbox{7}", "7"),
    (r"$\boxed 5$", "5"),
    (r"\boxed {  3 }", "  3 "),
    (r"\boxed{unbalanced", None),
    ("no box here", None),
])
def test_extract_boxed(text, expected):
    assert extract_boxed(text) == expected


@pytest.mark.parametrize("text, expected", [
    (r"We get \boxed{12}. Answer: 13", "12"),  # boxed wins
    ("Reasoning...\nAnswer: 42.\n", "42"),
    ("answer: 1\nmore\nAnswer: -3.5", "-3.5"),
    ("Natalia sold 48 clips ... #### 72", "72"),
    ("3 apples and 4 pears make 7", "7"),
    ("total is 1,234,567 dollars", "1,234,567"),
    ("no digits", None),
])
def test_extract_answer(text, expected):
    assert extract_answer(text) == expected


@pytest.mark.parametrize("predicted, reference, same", [
    ("42", "42.0", True),
    ("$42$", "42", True),
    ("1,000", "1000", True),
    ("0.5", r"\frac{1}{2}", True),
    (r"\dfrac{3}{4}", "3/4", True),
    (r"-\frac{1}{3}", "-0.3333333333", True),
    ("x = 5", "5", True),
    ("50\\%", "50", True),
    (r"\text{(B)}", "(b)", True),
    ("1,2", "12", False),  # a list, not a thousands separator
    ("42", "43", False),
    ("0.5", "0.50001", False),
    (r"\sqrt{2}", r"\sqrt{2}", True),
    (None, "1", False),
])
def test_answers_match(predicted, reference, same):
    assert answers_match(predicted, reference) is same


def test_math_accuracy_columns_and_chat():
    chat = [{"role": "assistant", "content": r"\boxed{\frac{8}{2}}"}]
    completions = [r"so \boxed{4}", "Answer: 5", chat, "4"]
    assert math_accuracy(None, completions, answer=["4", "4", 4, None]) == [1.0, 0.0, 1.0, None]
    solutions = [r"2+2 = \boxed{4}", "... #### 5", "it is 4", r"\boxed{3}"]
    assert math_accuracy(None, completions, solution=solutions) == [1.0, 1.0, 1.0, 0.0]
    with pytest.raises(ValueError, match="'answer' or 'solution'"):
        math_accuracy(None, completions)


def test_format_tags_and_length_penalty():
    good = "<think>hmm\nok</think>\n<answer>4</answer>"
    assert format_tags(None, [good, "<answer>4</answer>", good + " extra"]) == [1.0, 0.0, 0.0]
    assert format_tags(None, ["#4"], pattern=r"^#\d+$") == [1.0]
    ids = [[0] * n for n in (10, 12, 14, 16, 20)]
    assert length_penalty(None, [""] * 5, completion_ids=ids, max_length=16, cache_length=4) == [
        0.0, 0.0, -0.5, -1.0, -1.0]
    assert length_penalty(None, ["abc", "abcdef"], max_length=5, cache_length=2) == [0.0, -1.0]


# ---------------------------------------------------------------------------------------------------------
# Loading


REWARD_FILE = textwrap.dedent("""
    import time

    def first_char_is_digit(prompts, completions, **kwargs):
        return [1.0 if c[:1].isdigit() else 0.0 for c in completions]

    def only_for_math(prompts, completions, task, **kwargs):
        return [1.0 if task_ == "math" else None for task_ in task]

    def slow(prompts, completions, **kwargs):
        time.sleep(60)
        return [0.0] * len(completions)

    def raises(prompts, completions, **kwargs):
        raise KeyError("no such column")

    def wrong_length(prompts, completions, **kwargs):
        return [1.0]

    def wrong_type(prompts, completions, **kwargs):
        return ["high"] * len(completions)

    def not_a_list(prompts, completions, **kwargs):
        return 1.0
""")


@pytest.fixture
def reward_file(tmp_path):
    path = tmp_path / "my_rewards.py"
    path.write_text(REWARD_FILE)
    return str(path)


def test_trls_reward_names_give_trls_values():
    """TRL's own examples (trl/rewards), and the overlong punishment at its script's 1280 / 256."""
    accuracy, reasoning, think, overlong = (load_reward_function(name) for name in (
        "accuracy_reward", "reasoning_accuracy_reward", "think_format_reward", "get_soft_overlong_punishment"))
    chat = [[{"role": "assistant", "content": text}] for text in (
        r"<think> Reasoning content </think> The final answer is \boxed{\frac{1}{3}}",
        r"<think> Reasoning content </think> The final answer is \boxed{\frac{1}{2}}",
        r"<think> Reasoning content with partial answers \boxed{\frac{1}{3}} but no final answer")]
    solution = [r"\frac{1}{3}"] * 3
    assert accuracy(None, chat, solution=solution) == [1.0, 0.0, 1.0]
    assert reasoning(None, chat, solution=solution) == [1.0, 0.0, 0.0]
    assert think(None, ["<think>\nThis is my reasoning.\n</think>\nThis is my answer.",
                        "<think>\nThis is my reasoning.\nThis is my answer."]) == [1.0, 0.0]
    ids = [[0] * n for n in (1024, 1152, 1280, 1281)]
    assert overlong(None, [""] * 4, completion_ids=ids) == [0.0, -0.5, -1.0, -1.0]


def test_load_reward_function_forms(reward_file):
    assert load_reward_function("math_accuracy") is math_accuracy
    assert load_reward_function("barerl.train.rewards:format_tags") is format_tags
    assert load_reward_function(f"{reward_file}:first_char_is_digit")(None, ["1a", "b"]) == [1.0, 0.0]
    with pytest.raises(RewardError, match="unknown reward 'accuracy'.*math_accuracy"):
        load_reward_function("accuracy")
    with pytest.raises(RewardError, match="missing.py not found"):
        load_reward_function("missing.py:f")
    with pytest.raises(RewardError, match="has no function 'nope' \\(it has: first_char_is_digit, not_a_list, "):
        load_reward_function(f"{reward_file}:nope")
    with pytest.raises(RewardError, match="cannot import module 'no_such_module'"):
        load_reward_function("no_such_module:f")


def test_load_rewards_weights_kwargs_names(reward_file):
    rewards = load_rewards(["math_accuracy", {"function": "format_tags", "weight": 0.5, "pattern": "^x$"},
                            "math_accuracy"])
    assert [r.name for r in rewards] == ["math_accuracy", "format_tags", "math_accuracy_2"]
    assert [r.weight for r in rewards] == [1.0, 0.5, 1.0]
    assert rewards[1].function()(None, ["x", "y"]) == [1.0, 0.0]
    rewards = load_rewards([f"{reward_file}:first_char_is_digit", "length_penalty"], weights=[2, -1])
    assert [r.weight for r in rewards] == [2.0, -1.0]
    with pytest.raises(RewardError, match="2 reward weights given for 1"):
        load_rewards("math_accuracy", weights=[1, 2])
    with pytest.raises(RewardError, match="needs a 'function' key"):
        load_rewards([{"weight": 1}])


# ---------------------------------------------------------------------------------------------------------
# Scoring, None handling, errors


def test_runner_weighted_sum_and_none(reward_file):
    rewards = load_rewards([f"{reward_file}:first_char_is_digit", f"{reward_file}:only_for_math"],
                           weights=[2, 3])
    completions = ["1", "a", "2", "b"]
    columns = {"task": ["math", "math", "code", "code"]}
    with RewardRunner(rewards, num_workers=0) as runner:
        scores = runner(["p"] * 4, completions, columns)
    assert scores.names == ["first_char_is_digit", "only_for_math"]
    np.testing.assert_array_equal(scores.per_function[:, 0], [1, 0, 1, 0])
    assert np.isnan(scores.per_function[2, 1])  # not applicable
    np.testing.assert_allclose(scores.total, [2 + 3, 0 + 3, 2, 0])
    metrics = scores.metrics()
    assert metrics["rewards/only_for_math/mean"] == 1.0 and metrics["reward"] == pytest.approx(10 / 4)


def test_all_none_row_scores_zero_with_warning(reward_file):
    rewards = load_rewards([f"{reward_file}:only_for_math"])
    with pytest.warns(UserWarning, match="every reward function returned None"):
        scores = RewardRunner(rewards, num_workers=0)(["p"], ["c"], {"task": ["code"]})
    assert scores.total.tolist() == [0.0]


@pytest.mark.parametrize("function, message", [
    ("raises", (r"reward 'raises' on dataset rows 0-1 \(first prompt 'p'\): raised KeyError: 'no such column' "
               r"\(at .*my_rewards.py:\d+ in raises\)")),
    ("wrong_length", r"reward 'wrong_length' on dataset rows 0-1 .*: returned 1 values for 2 completions"),
    ("wrong_type", r"reward 'wrong_type' on dataset row 0 \(prompt 'p'\): returned str 'high'; expected a float"),
    ("not_a_list", r"reward 'not_a_list' on dataset rows 0-1 .*: returned float; expected a list"),
])
def test_bad_rewards_are_named(reward_file, function, message):
    runner = RewardRunner(load_rewards(f"{reward_file}:{function}"), num_workers=0)
    with pytest.raises(RewardError, match=message):
        runner(["p", "q"], ["1", "2"])
    runner.close()


def test_missing_column_is_reported():
    runner = RewardRunner(load_rewards("math_accuracy"), num_workers=0)
    with pytest.raises(RewardError, match="reward 'math_accuracy' on dataset row 0 .*: raised ValueError.*'answer' "
                                          "or 'solution'"):
        runner(["p"], ["1"])
    with pytest.raises(RewardError, match="column 'answer' has 2 values for 1 prompts"):
        runner(["p"], ["1"], {"answer": ["1", "2"]})


def test_workers_overlap_and_timeout(reward_file):
    """Rewards in spawned workers: submit returns at once; a hung reward times out, named, and the runner
    recovers with fresh workers."""
    rewards = load_rewards([f"{reward_file}:first_char_is_digit", "math_accuracy"])
    with RewardRunner(rewards, num_workers=2, timeout=60) as runner:
        start = time.monotonic()
        pending = runner.submit(["p", "q"], ["7", r"\boxed{3}"], {"answer": ["7", "4"]})
        assert time.monotonic() - start < 1.0  # did not wait for the workers to start
        scores = pending.result()
        np.testing.assert_allclose(scores.total, [2.0, 0.0])
        assert pending.done()

    slow = load_rewards([f"{reward_file}:first_char_is_digit", f"{reward_file}:slow"])
    with RewardRunner(slow, num_workers=2, timeout=3) as runner:
        start = time.monotonic()
        with pytest.raises(RewardError, match=r"reward 'slow' on dataset row 0 .*: timed out, no result within "
                                              r"reward_timeout=3s"):
            runner(["p"], ["1"])
        assert time.monotonic() - start < 30
        runner.rewards = slow[:1]
        assert runner(["p"], ["1"]).total.tolist() == [1.0]  # the pool was restarted


def test_in_process_timeout(reward_file):
    runner = RewardRunner(load_rewards(f"{reward_file}:slow"), num_workers=0, timeout=0.5)
    with runner, pytest.raises(RewardError, match="reward 'slow' on .*: timed out, no result within reward_timeout=0.5s"):
        runner(["p"], ["c"])


def test_worker_error_is_named(reward_file):
    runner = RewardRunner(load_rewards(f"{reward_file}:raises"), num_workers=1, timeout=60)
    with runner, pytest.raises(RewardError, match="reward 'raises' on dataset row 0 .*: raised KeyError"):
        runner(["p"], ["c"])
