"""A reward for code: the share of a row's hidden tests that the completion's program passes, in the sandbox.

    reward_funcs: [code_tests]          # dataset rows carry a `tests` column: ["assert f(1) == 2", ...]

The program is the completion's last fenced code block (```python ... ``` or ``` ... ```), else the whole
completion. Each completion runs in its own sandbox process (code_tests_harness.py drives it): the
solution first, then each test in a copy of its namespace within `test_seconds`; the reward is tests
passed / tests, 0.0 when the solution does not even run, None for rows without tests. Completions are
checked concurrently in `num_workers` threads, each waiting on its sandbox process.

Reward hacking: the harness reports through lines tagged with a per-run random nonce, read before the
solution runs, so printing a fake "all passed" line or exiting early does not pay. A solution that digs
the nonce out of the interpreter's frames could still forge a report: the sandbox protects the machine,
not the reward, as with every in-process test harness.
"""

from __future__ import annotations

import json
import re
import secrets
from pathlib import Path

from barerl.train.sandbox import Sandbox, SandboxLimits
from barerl.train.worker_pool import WorkerPool

_HARNESS = Path(__file__).with_name("code_tests_harness.py")
_FENCE = re.compile(r"```[ \t]*(?:python|py|python3)?[ \t]*\n(.*?)```", re.DOTALL | re.IGNORECASE)
_SANDBOXES: dict[SandboxLimits, Sandbox] = {}


def extract_code(text: str) -> str:
    """The last fenced code block of the text, else the text itself."""
    blocks = _FENCE.findall(text)
    return blocks[-1] if blocks else text


def tests_passed(sandbox: Sandbox, code: str, tests: list[str], test_seconds: float) -> tuple[int, str | None]:
    """(how many of `tests` the program passes, the solution's error when it did not run)."""
    nonce = secrets.token_hex(16)
    stdin = json.dumps({"nonce": nonce, "tests": tests, "seconds": test_seconds})
    result = sandbox.run_python(_HARNESS.read_text(), stdin=stdin, files={"solution.py": code})
    reports = [json.loads(line[len(nonce):]) for line in result.stdout.splitlines() if line.startswith(nonce)]
    if not reports:
        return 0, f"the tests did not run: {result.describe()[-300:]}"
    return reports[-1]["passed"], reports[-1]["error"]


def _sandbox(limits: SandboxLimits) -> Sandbox:
    if limits not in _SANDBOXES:
        _SANDBOXES[limits] = Sandbox(limits)
    return _SANDBOXES[limits]


def code_tests(prompts, completions, tests=None, test_seconds: float = 2.0, num_workers: int = 8,
               limits: SandboxLimits | None = None, **_) -> list[float | None]:
    """Share of the row's `tests` passed by the completion's code (see the module docstring)."""
    from barerl.train.rewards import completion_text  # here: rewards.py lists this function as a built-in

    if tests is None:
        raise ValueError("code_tests needs a dataset column 'tests' (a list of test statements per row)")
    rows = [[t] if isinstance(t, str) else list(t or []) for t in tests]
    budget = test_seconds * (1 + max((len(r) for r in rows), default=0)) + 5
    sandbox = _sandbox(limits or SandboxLimits(cpu_seconds=budget, wall_seconds=budget))
    calls = [(tests_passed, (sandbox, extract_code(completion_text(c)), r, test_seconds))
             for c, r in zip(completions, rows) if r]
    with WorkerPool(num_workers, "barerl-code-tests") as pool:
        outcomes = iter(pool.run_all(calls))
    return [next(outcomes).result[0] / len(r) if r else None for r in rows]
