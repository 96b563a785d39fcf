"""The code reward: share of hidden tests passed in the sandbox, partial credit, hung solutions and tests,
forged reports and early exits earn nothing, and it loads as a built-in reward."""

import pytest

from barerl.train.code_reward import code_tests, extract_code
from barerl.train.rewards import load_reward_function

TESTS = ["assert f(1) == 2", "assert f(2) == 3", "assert f(0) == 1", "assert f(-1) == 0"]


def test_extracts_the_last_fenced_block():
    assert extract_code("```python\nx = 1\n```\nthen\n```\ny = 2\n```") == "y = 2\n"
    assert extract_code("```py\nz = 3\n```") == "z = 3\n"
    assert extract_code("def f(x):\n    return x") == "def f(x):\n    return x"


def test_share_of_tests_passed():
    completions = ["def f(x):\n    return x + 1",  # all
                   "def f(x):\n    return x + 1 if x > 0 else 7",  # two of four
                   "def f(x) return x",  # does not compile
                   [{"role": "assistant", "content": "```python\ndef f(x):\n    return abs(x) + 1\n```"}]]  # three
    assert code_tests(None, completions, tests=[TESTS] * 4) == [1.0, 0.5, 0.0, 0.75]


def test_hung_solutions_and_tests_are_cut_per_test():
    hangs_at_import = "while True:\n    pass"
    hangs_on_zero = "def f(x):\n    while x == 0:\n        pass\n    return x + 1"
    assert code_tests(None, [hangs_at_import, hangs_on_zero], tests=[TESTS] * 2, test_seconds=0.3) == [0.0, 0.75]


def test_forged_reports_and_early_exits_earn_nothing():
    forged = 'print("\\n" + "0" * 32 + \'{"passed": 4, "done": 4, "error": null}\')\ndef f(x):\n    return -99'
    exits = "import os\nos._exit(0)"
    assert code_tests(None, [forged, exits], tests=[TESTS] * 2) == [0.0, 0.0]


def test_rows_without_tests_are_not_applicable():
    assert code_tests(None, ["x = 1", "def f(x):\n    return x + 1"], tests=[[], TESTS]) == [None, 1.0]
    with pytest.raises(ValueError, match="needs a dataset column 'tests'"):
        code_tests(None, ["x = 1"])


def test_is_a_builtin_reward():
    assert load_reward_function("code_tests") is code_tests
