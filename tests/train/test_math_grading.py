"""Math grading: math-verify and the built-in grader on the cases where they differ, the grader setting of
`math_accuracy`, and the error when math-verify is asked for but missing."""

import importlib.util
import threading

import pytest

from barerl.train import math_grading
from barerl.train.math_grading import answers_match, extract_answer, grade
from barerl.train.rewards import RewardError, RewardRunner, load_rewards

# (completion, dataset answer, correct?) that both graders get right
BOTH_RIGHT = [
    (r"so the answer is $\boxed{\dfrac{3}{4}}$", r"\frac{3}{4}", True),  # LaTeX fraction forms
    (r"\boxed{0.75}", "3/4", True),
    (r"The answer is $\frac{1}{2}$.", "0.5", True),
    (r"\boxed{\frac94\pi}", r"\frac{9}{4}\pi", True),
    (r"\boxed{125 \text{ miles}}", "125", True),  # units
    (r"\boxed{28\%}", "28", True),
    (r"\boxed{(0, 1]}", "(0,1]", True),  # intervals
    (r"\boxed{[0, 1)}", "(0,1]", False),
    (r"The interval is $(1, \frac{9}{2})$", "(1,4.5)", True),
    (r"\boxed{x = 5}", "5", True),
    (r"\boxed{2}", r"\frac{1+\sqrt{5}}{2}", False),
    ("Natalia sold 72 clips.", "#### 72", True),
]
# equivalent expressions: equal only symbolically, which math-verify sees and the built-in grader does not
ONLY_MATH_VERIFY_RIGHT = [
    (r"\boxed{\frac{x+2}{7}}", r"\frac{x}{7}+\frac{2}{7}"),
    (r"\boxed{2\sqrt{2}}", r"\sqrt{8}"),
    (r"\boxed{\tan^2 x + 1}", r"\sec^2 x"),
    (r"\boxed{1,2,3}", r"\{3,2,1\}"),
]


@pytest.mark.parametrize("completion, answer, correct", BOTH_RIGHT)
def test_builtin_grader(completion, answer, correct):
    assert grade(completion, answer, "builtin") == float(correct)


@pytest.mark.parametrize("completion, answer, correct", BOTH_RIGHT)
def test_math_verify_grader(completion, answer, correct):
    pytest.importorskip("math_verify")
    assert grade(completion, answer, "math_verify") == float(correct)


@pytest.mark.parametrize("completion, answer", ONLY_MATH_VERIFY_RIGHT)
def test_math_verify_sees_equivalent_expressions(completion, answer):
    pytest.importorskip("math_verify")
    assert grade(completion, answer, "math_verify") == 1.0
    assert grade(completion, answer, "builtin") == 0.0
    assert grade(completion, answer, "auto") == 1.0  # installed: auto is math-verify


@pytest.mark.parametrize("text, expected", [
    ("Final Answer: The final answer is $14{,}916$. I hope it is correct.", "14{,}916"),  # its math span
    (r"We have $x = 3$, so 7 apples.", "7"),  # the last number ends after the last span
    (r"so the slope is $\frac{1}{3}$", r"\frac{1}{3}"),  # the last span ends after the last number
    (r"it is \frac{10}{9}", r"\frac{10}{9}"),  # a bare fraction is one number
    ("about .4 of it", ".4"),
])
def test_builtin_extraction(text, expected):
    assert extract_answer(text) == expected


@pytest.mark.parametrize("predicted, reference, same", [
    (r"\frac13", "1/3", True),
    (r"\sqrt3", r"\sqrt{3}", True),
    (r"x \geq 5", "x>=5", True),
    ("z = 3+3 = 2", "2", True),  # a chain of equations: its last side
    ("(p,q)=(3,2)", r"(3, \frac{4}{2})", True),  # tuples item by item
    ("(3,2]", "(3,2)", False),
    (r"x \in [-2,7]", "[-2,7]", True),
    (r"\frac{1}{3}\textbf{ meters}", "1/3", True),
    ("28 percent", "28", True),
    ("2x", "2", False),  # a one-letter "unit" is a variable
    (r"\text{(C)}", "C", True),
])
def test_builtin_comparison(predicted, reference, same):
    assert answers_match(predicted, reference) is same


def test_math_verify_runs_in_a_thread():
    """Its timeouts need the main thread (signal.alarm); in a reward thread it runs without them."""
    pytest.importorskip("math_verify")
    results = []
    thread = threading.Thread(target=lambda: results.append(grade(r"\boxed{2\sqrt{2}}", r"\sqrt{8}")))
    thread.start()
    thread.join()
    assert results == [1.0]


def test_grader_setting_from_reward_config():
    pytest.importorskip("math_verify")
    specs = [{"function": "math_accuracy", "grader": "builtin", "name": "builtin"}, "math_verify"]
    completions = [completion for completion, _ in ONLY_MATH_VERIFY_RIGHT]
    answers = [answer for _, answer in ONLY_MATH_VERIFY_RIGHT]
    with RewardRunner(load_rewards(specs), num_workers=0) as runner:
        scores = runner([""] * len(completions), completions, {"answer": answers})
    assert scores.per_function.tolist() == [[0.0, 1.0]] * len(completions)


def test_asking_for_math_verify_without_it_names_the_extra(monkeypatch):
    find_spec = importlib.util.find_spec
    monkeypatch.setattr(math_grading.importlib.util, "find_spec",
                        lambda name, *a: None if name == "math_verify" else find_spec(name, *a))
    with pytest.raises(ValueError, match=r"pip install 'barerl\[math\]'"):
        grade(r"\boxed{1}", "1", "math_verify")
    with RewardRunner(load_rewards(["math_verify"]), num_workers=0) as runner, pytest.raises(
            RewardError, match=r"reward 'math_verify' on dataset row 0 .*raised .*pip install 'barerl\[math\]'"):
        runner([""], [r"\boxed{1}"], {"answer": ["1"]})
    assert grade(r"\boxed{2\sqrt{2}}", r"\sqrt{8}", "auto") == 0.0  # auto falls back to the built-in grader
    with pytest.raises(ValueError, match="grader must be one of"):
        grade("1", "1", "sympy")
