"""Math grading: math-verify and the built-in grader on the cases where they differ, the grader setting of
`math_accuracy`, and the error when math-verify is asked for but missing."""

import importlib.util
import threading

import pytest

from barerl.train import math_grading
from barerl.train.math_expressions import evaluate_expression, parse_expression
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
    (r"\boxed{\frac{x+2}{7}}", r"\frac{x}{7}+\frac{2}{7}", True),  # equivalent expressions
    (r"\boxed{2\sqrt{2}}", r"\sqrt{8}", True),
    (r"\boxed{\tan^2 x + 1}", r"\sec^2 x", True),
    (r"\boxed{2\sqrt{3}}", r"\sqrt{8}", False),
    (r"\boxed{1,2,3}", r"\{3,2,1\}", True),  # sets
    (r"\boxed{1,2}", r"\{3,2,1\}", False),
]
# what math-verify computes (matrix sums, sums, binomials) and the built-in grader does not
ONLY_MATH_VERIFY_RIGHT = [
    (r"\boxed{\begin{pmatrix}1 & 2\\3 & 4\end{pmatrix} + \begin{pmatrix}5 & 6\\7 & 8\end{pmatrix}}",
     r"\begin{pmatrix}6 & 8\\10 & 12\end{pmatrix}"),
    (r"\boxed{\sum_{k=1}^{3} k}", "6"),
    (r"\boxed{\binom{5}{2}}", "10"),
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
    (r"\boxed{1}, \boxed{2}", "1, 2"),  # boxes that only separators part: one list
    (r"$\boxed{(2,2)}$ \quad \text{and} \quad $\boxed{(6,2)}$", "(2,2), (6,2)"),
    (r"\boxed{3} for part (a) and \boxed{1}", "1"),  # words between boxes: the last one
    ("Final Answer: The largest $n$ is 34.", "34"),  # an answer sentence: its last number
    ("Final Answer: The final answer is 12,000,023. I hope it is correct.", "12,000,023"),  # its first sentence
    ("Jane started growing Sphere 3 hours ago.", "3"),
    # "the final answer is" after the last box restates the answer (a plain "Answer:" line does not: test_rewards)
    (r"so $\boxed{255}$ more: $10,455$. Final Answer: The final answer is $10,455$. I hope it is correct.",
     "10,455"),
    (r"between $\boxed{12 $ and $13 }. $ Final Answer: The final answer is $12$ and $13$.", "12, 13"),
    ("so there are 1 000 of them", "1 000"),  # digits in groups of three after spaces
    ("so there are 1 000.5 of them", "1 000.5"),
])

def test_builtin_extraction(text, expected):
    assert extract_answer(text) == expected


@pytest.mark.parametrize("completion, correct", [(r"\boxed{28\%}", True), (r"\boxed{27\%}", False)])
def test_builtin_reference_from_a_worked_answer_line(completion, correct):
    reference = (r"It loses $10 \%$, then $20 \%$ of the rest. Final Answer: The final answer is $28 \%$. "
                 r"I hope it is correct. Note: the solution above is checked again below.")
    assert grade(completion, reference, "builtin") == float(correct)


def test_builtin_extraction_skips_digits_in_words():
    assert extract_answer("AZYUK2A") is None  # "2" is part of a word, not an answer


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
    # digit grouping and currency
    (r"\$16,\! 386.20", "16386.2", True),
    (r"\$16,\! 387.20", "16386.2", False),
    ("32, 349", "32349", False),  # a comma and a space part a list's items
    ("14 {, }916", "14{,}916", True),
    ("14 {, }916", "14917", False),
    ("1 000", "1000", True),
    ("1 000", "1001", False),
    ("(12,102)", "(12, 102)", True),  # a grouped number alone in brackets is a pair
    ("(12,102)", "12102", False),
    (r"(2,12) \cup (12,102)", r"(2, 12) \cup (12, 102)", True),
    (r"(2,12) \cup (12,102)", r"(2, 12) \cup (12, 103)", False),
    ("(0;-2;6)", "(0, -2, 6)", True),  # a point's coordinates parted by semicolons
    ("(0;-2;6)", "(0, 2, 6)", False),
    (r"\\frac{1}{2}", "1/2", True),  # a backslash escaped twice (JSON)
    # an equation is its stated value only when its left side is a name
    ("A:B=1", "1", True),
    (r"\frac{NO}{BO}=\frac{1}{\sqrt{6}}", r"\frac{1}{\sqrt6}", True),
    ("7 = 11a+c", "11a+c", False),
    ("2x+z=1", "1", False),
    ("2x=5", "5", False),
    (r"x=1/3\approx0.33", "1/3", True),  # an approximation after the exact value is commentary
    (r"x\approx11", "11", True),
    (r"x=5\approx11", "11", False),
])
def test_builtin_comparison(predicted, reference, same):
    assert answers_match(predicted, reference) is same


@pytest.mark.parametrize("predicted, reference, same", [
    (r"\{1,2\}", r"\{2,1\}", True),
    (r"\{1,2\}", r"\{1,3\}", False),
    ("x=1, y=2", "y=2, x=1", True),
    ("1,2", "1,2,3", False),
    ("6 and 8", "8, 6", True),
    ("(1,2),(1,2),(3,4)", "(3,4),(1,2)", True),  # as sets: a repeated item counts once
    ("(1,2),(3,5)", "(3,4),(1,2)", False),
    (r"\{5\}", "5", True),
    ("{1,3}", "(1,3)", True),  # a bare list against a tuple: in the tuple's order
    ("{1,3}", "(3,1)", False),
    (r"\{-2021, 2021\}", r"\pm 2021", True),
    ("2021", r"\pm 2021", False),
])
def test_builtin_sets_and_lists(predicted, reference, same):
    assert answers_match(predicted, reference) is same


@pytest.mark.parametrize("predicted, reference, same", [
    (r"\begin{pmatrix}0 & 0 \\ 0 & 0\end{pmatrix}", r"\begin{bmatrix}0 & 0 \\0 & 0\end{bmatrix}", True),
    (r"\left[\begin{array}{cc}1 & 2 \\3 & 4\end{array}\right]", r"\begin{pmatrix}1 & 2 \\3 & 4\end{pmatrix}", True),
    (r"\begin{pmatrix}\frac{1}{2} \\ \sqrt{4}\end{pmatrix}", r"\begin{pmatrix}0.5 \\ 2\end{pmatrix}", True),
    (r"\begin{pmatrix}1 & 2 \\ 3 & 5\end{pmatrix}", r"\begin{pmatrix}1 & 2 \\ 3 & 4\end{pmatrix}", False),
    (r"\begin{pmatrix}1 & 2\end{pmatrix}", r"\begin{pmatrix}1 \\ 2\end{pmatrix}", False),  # shape
])
def test_builtin_matrices(predicted, reference, same):
    assert answers_match(predicted, reference) is same


@pytest.mark.parametrize("predicted, reference, same", [
    (r"5 \geq x", r"x \leq 5", True),
    ("-x > -1", "x < 1", True),
    ("x < 5", "x > 5", False),
    ("x > -1", "x < 1", False),
    (r"y=-\frac{1}{2}x+\frac{3}{4}", "2x+4y-3=0", True),  # proportional equations
    ("y=x/2", "2x+4y-3=0", False),
    ("(-793, 10)", "-793 < a < 10", True),  # a reference inequality against an interval
    (r"(3, \infty)", "x > 3", True),
    (r"[3, \infty)", "x > 3", False),
    ("(0, 2)", "0 < x < 1", False),
    # a predicted inequality against a reference interval is not accepted (math-verify's default)
    (r"-2 \le x \le 7", r"x \in [-2,7]", False),
])
def test_builtin_relations(predicted, reference, same):
    assert answers_match(predicted, reference) is same


@pytest.mark.parametrize("predicted, reference, same", [
    (r"\sqrt{17}", "4.123105625617661", True),
    (r"\sqrt 2+\sqrt 5", r"\sqrt{5}+\sqrt{2}", True),
    ("(9+1)", "10", True),
    (r"\frac{\sqrt{\sqrt{11}+\sqrt{194}}}{2\sqrt{33}+15}", r"\frac{\sqrt{\sqrt{11}+\sqrt{194}}}{15+2\sqrt{33}}", True),
    (r"\frac{34}{16}+\frac{\sqrt{1358}}{16}", "4", False),
    (r"\sqrt[3]{x}^2", "x^{2/3}", True),  # with variables: equal at sample points
    ("(x-1)(x+1)", "x^2-1", True),
    ("x^2", "2x", False),
    ("2x", "2y", False),  # different variables
    (r"\log_2 8 + 3!", "9", True),
    (r"\tan^2 x", r"\sec^2 x", False),
    (r"\sin^{-1} x", r"\csc x", False),  # arcsin, not a power: refused
    ("yes", "sey", False),  # words are not products of letters
])
def test_builtin_expressions(predicted, reference, same):
    assert answers_match(predicted, reference) is same


@pytest.mark.parametrize("text", ["x < 1", "1, 2", r"\infty", "f(x", "none", r"\unknown{x}", "(" * 5000 + "1"])
def test_builtin_evaluator_refuses_non_expressions(text):
    assert parse_expression(text) is None


@pytest.mark.parametrize("completion", [
    "\\boxed{" * 3000,  # unclosed boxes: one scan of the braces, not one per box
    "$" + "\\frac{1}{2}+" * 5000 + "1$",  # a sum too long to be an answer's expression
    "Answer: " + "1+" * 50000 + "1",
    "$" + "(" * 300 + "1" + ")" * 300 + "$",
])
def test_builtin_grader_gives_a_verdict_on_pathological_completions(completion):
    assert grade(completion, "2", grader="builtin") == 0.0


def test_builtin_evaluator_is_undefined_where_the_value_is():
    assert evaluate_expression(parse_expression("1/(x-x)"), {"x": 1.0}) is None
    assert evaluate_expression(parse_expression("10^{10^{10}}"), {}) is None
    assert evaluate_expression(parse_expression("200!"), {}) is None
    assert evaluate_expression(parse_expression(r"2\sqrt{2}"), {}) == pytest.approx(8 ** 0.5)


def test_math_verify_runs_in_a_thread():
    """Its timeouts need the main thread (signal.alarm); in a reward thread it runs without them."""
    pytest.importorskip("math_verify")
    results = []
    thread = threading.Thread(target=lambda: results.append(grade(r"\boxed{\binom{5}{2}}", "10")))
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
    assert grade(r"\boxed{\binom{5}{2}}", "10", "auto") == 0.0  # auto falls back to the built-in grader
    with pytest.raises(ValueError, match="grader must be one of"):
        grade("1", "1", "sympy")
