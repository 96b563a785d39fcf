"""The multi-turn examples: their YAML is a valid GRPOConfig (multi-turn keys included), their data loads, the
calculator agrees with every answer, and reference solutions pass every hidden coding test."""

import json
from pathlib import Path

import pytest

from barerl.tokenizer.tool_calls import ToolCall
from barerl.train.code_reward import code_tests
from barerl.train.config import GRPOConfig, load_config
from barerl.train.data import load_dataset
from barerl.train.environments import ToolEnvironment, load_environment_factory
from barerl.train.tools import call_tool, load_tools

EXAMPLES = Path(__file__).parents[2] / "examples"


@pytest.mark.parametrize("example", ["calculator", "coding"])
def test_example_config_and_data_load(example, tmp_path, monkeypatch):
    monkeypatch.chdir(EXAMPLES.parent)  # the YAML's paths are relative to the repository
    grpo = load_config(GRPOConfig, EXAMPLES / example / "grpo.yaml")
    assert grpo.multi_turn and grpo.reward_funcs and grpo.max_tokens_per_turn < grpo.max_completion_length
    dataset = load_dataset(grpo.dataset, task="grpo")
    assert len(dataset) >= 24
    env = load_environment_factory(grpo)()
    assert isinstance(env, ToolEnvironment) and env.reset(dataset[0])[-1]["role"] == "user"


def test_calculator_agrees_with_every_answer():
    tools = load_tools([str(EXAMPLES / "calculator" / "calculator.py") + ":calculate"])
    for name in ("train.jsonl", "test.jsonl"):
        for line in (EXAMPLES / "calculator" / name).read_text().splitlines():
            row = json.loads(line)
            expression = row["prompt"][-1]["content"].removeprefix("What is ").removesuffix("?")
            assert call_tool(tools, ToolCall("calculate", {"expression": expression})).content == row["answer"]


@pytest.mark.parametrize("expression, content", [("7 / 2", "3.5"), ("1 / 3", "0.3333333333"), ("-2 ** 3", "-8"),
                                                 ("(1 + 2) * 3 // 2", "4")])
def test_calculator_values(expression, content):
    tools = load_tools([str(EXAMPLES / "calculator" / "calculator.py") + ":calculate"])
    assert call_tool(tools, ToolCall("calculate", {"expression": expression})).content == content


@pytest.mark.parametrize("expression, says", [("__import__('os')", "unsupported syntax"), ("2 ** 1000", "exponents"),
                                              ("1 +", "not an expression"), ("1 / 0", "ZeroDivisionError")])
def test_calculator_refusals_are_error_observations(expression, says):
    tools = load_tools([str(EXAMPLES / "calculator" / "calculator.py") + ":calculate"])
    result = call_tool(tools, ToolCall("calculate", {"expression": expression}))
    assert result.error == "raised" and says in result.content


REFERENCE_SOLUTIONS = {
    "sum_digits": "def sum_digits(n):\n    return sum(map(int, str(n)))",
    "is_palindrome": "def is_palindrome(s):\n    t = [c.lower() for c in s if c.isalpha()]\n    return t == t[::-1]",
    "fizzbuzz": "def fizzbuzz(n):\n    return 'Fizz' * (n % 3 == 0) + 'Buzz' * (n % 5 == 0) or str(n)",
    "count_vowels": "def count_vowels(s):\n    return sum(c in 'aeiou' for c in s.lower())",
    "second_largest": "def second_largest(xs):\n    return sorted(set(xs))[-2]",
    "gcd": "import math\ndef gcd(a, b):\n    return math.gcd(a, b)",
    "is_prime": "def is_prime(n):\n    return n > 1 and all(n % d for d in range(2, int(n ** 0.5) + 1))",
    "reverse_words": "def reverse_words(s):\n    return ' '.join(s.split()[::-1])",
    "flatten": ("def flatten(xs):\n    out = []\n    for x in xs:\n"
                "        out += flatten(x) if isinstance(x, list) else [x]\n    return out"),
    "run_length": ("import itertools\ndef run_length(s):\n"
                   "    return ''.join(f'{k}{len(list(g))}' for k, g in itertools.groupby(s))"),
    "fibonacci": "def fibonacci(n):\n    a, b = 0, 1\n    for _ in range(n):\n        a, b = b, a + b\n    return a",
    "anagrams": ("def anagrams(a, b):\n    key = lambda s: sorted(s.replace(' ', '').lower())\n"
                 "    return key(a) == key(b)"),
    "max_subarray": ("def max_subarray(xs):\n    best = cur = xs[0]\n    for x in xs[1:]:\n"
                     "        cur = max(x, cur + x)\n        best = max(best, cur)\n    return best"),
    "to_binary": "def to_binary(n):\n    return bin(n)[2:]",
    "word_count": ("import collections\ndef word_count(s):\n"
                   "    return dict(collections.Counter(s.lower().split()))"),
    "rotate": "def rotate(xs, k):\n    if not xs:\n        return []\n    k %= len(xs)\n    return xs[-k:] + xs[:-k]",
    "balanced": ("def balanced(s):\n    stack, pairs = [], {')': '(', ']': '[', '}': '{'}\n    for c in s:\n"
                 "        if c in '([{':\n            stack.append(c)\n        elif c in pairs:\n"
                 "            if not stack or stack.pop() != pairs[c]:\n                return False\n"
                 "    return not stack"),
    "unique_sorted": "def unique_sorted(xs):\n    return sorted(set(xs))",
    "digital_root": "def digital_root(n):\n    return 0 if n == 0 else 1 + (n - 1) % 9",
    "caesar": ("def caesar(s, k):\n    out = []\n    for c in s:\n        if c.isalpha():\n"
               "            base = ord('A') if c.isupper() else ord('a')\n"
               "            c = chr(base + (ord(c) - base + k) % 26)\n        out.append(c)\n    return ''.join(out)"),
    "median": ("def median(xs):\n    s = sorted(xs)\n    m = len(s) // 2\n"
               "    return s[m] if len(s) % 2 else (s[m - 1] + s[m]) / 2"),
    "common_prefix": "import os\ndef common_prefix(words):\n    return os.path.commonprefix(words)",
    "pascal_row": "import math\ndef pascal_row(n):\n    return [math.comb(n, k) for k in range(n + 1)]",
    "roman": ("def roman(n):\n    out = ''\n    for v, s in zip([1000, 900, 500, 400, 100, 90, 50, 40, 10, 9, 5, 4, 1],\n"
              "                    'M CM D CD C XC L XL X IX V IV I'.split()):\n"
              "        while n >= v:\n            out, n = out + s, n - v\n    return out"),
}


def test_reference_solutions_pass_every_hidden_test():
    rows = [json.loads(line) for line in (EXAMPLES / "coding" / "tasks.jsonl").read_text().splitlines()]
    names = [row["prompt"][-1]["content"].removeprefix("Write ").split("(")[0] for row in rows]
    assert sorted(names) == sorted(REFERENCE_SOLUTIONS)
    completions = [f"Here it is:\n```python\n{REFERENCE_SOLUTIONS[name]}\n```" for name in names]
    assert code_tests(None, completions, tests=[row["tests"] for row in rows]) == [1.0] * len(rows)


def test_tiny_calculator_run_goes_end_to_end(tmp_path, monkeypatch):
    """examples/calculator/tiny.py shortened: SFT, greedy tool-use evaluation, multi-turn GRPO with the real
    calculator, evaluation again (the numbers of the full run are in docs/ENVIRONMENTS.md)."""
    monkeypatch.syspath_prepend(str(EXAMPLES / "calculator"))
    import tiny

    result = tiny.main(["--sft_steps", "2", "--grpo_steps", "1", "--output_dir", str(tmp_path)])
    for phase in ("before", "after"):
        assert set(result[phase]) == {"tool_success", "calls_per_episode", "accuracy", "turns"}
    assert (tmp_path / "grpo" / "checkpoint-1" / "model.safetensors").exists()
