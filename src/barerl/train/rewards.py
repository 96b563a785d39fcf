"""Reward functions: TRL's signature, loading from config, built-ins, and running them off the main process.

A reward function is `f(prompts, completions, **columns) -> list[float | None]`, exactly as in TRL:
`completions` are strings for plain-text data, or `[{"role": "assistant", "content": ...}]` lists for
chat data; `columns` are the dataset's other columns (e.g. `answer`), one value per completion, plus
whatever the trainer adds (TRL adds `completion_ids`). Functions should take `**kwargs`.

Design decisions:
- Config names a reward as `"module:function"`, `"path/to/file.py:function"` or a built-in name
  (`math_accuracy`, `math_verify`, `format_tags`, `length_penalty`, and `code_tests` from code_reward.py; and
  TRL's `accuracy_reward`, `reasoning_accuracy_reward`, `think_format_reward`, `get_soft_overlong_punishment`
  with the settings of TRL's `trl grpo` script: max_completion_len 1280, soft_punish_cache 256); a
  dict form adds `weight`, `name` and keyword arguments for the function. A `Reward` keeps the *spec*, not the
  loaded function, so it pickles: worker processes load the function themselves (spawn-safe, file-path rewards
  included).
- Output checking is strict, never a silent 0: a reward that raises, lacks a column it needs, returns
  something other than a list of numbers/None, the wrong number of values, or an infinite value raises
  `RewardError` naming the reward, the dataset row and what was wrong (worded in `reward_errors`).
- `None` (or NaN) means "not applicable to this sample", as in TRL: the weighted sum over reward
  functions skips it (nan-aware). A row where every reward is None gets total 0 and a warning.
- `RewardRunner` runs each reward function as one task in a pool of spawned worker processes, so
  rewards that execute code or call out overlap with generation and cannot hang the trainer: once the
  trainer waits for a call, it must finish within `timeout` seconds, else the pool is killed and
  `RewardError` names the reward. With `num_workers=0` rewards run in a thread of this process (no
  isolation; a timed-out call is abandoned, not killed).
"""

from __future__ import annotations

import math
import multiprocessing
import numbers
import re
import time
import warnings
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from functools import partial
from multiprocessing.pool import ThreadPool

import numpy as np

from barerl.train.code_reward import code_tests
from barerl.train.interrupts import ignore_sigint
from barerl.train.math_grading import grade
from barerl.train.reward_errors import describe_rows, signature_problem, where_raised
from barerl.train.specs import load_object


class RewardError(ValueError):
    """A reward function could not be loaded, raised, timed out, or returned something unusable."""


# ---------------------------------------------------------------------------------------------------------
# Completions


def completion_text(completion) -> str:
    """The text of a completion: the string itself, or the last message's content for chat data."""
    if isinstance(completion, str):
        return completion
    if isinstance(completion, Sequence) and completion and isinstance(completion[-1], dict):
        return str(completion[-1].get("content", ""))
    raise TypeError(f"a completion must be a string or a list of message dicts, "
                    f"got {type(completion).__name__}")


# ---------------------------------------------------------------------------------------------------------
# Built-in rewards


def math_accuracy(prompts, completions, answer=None, solution=None, grader: str = "auto",
                  **_) -> list[float | None]:
    """1.0 when the completion's final answer equals the dataset's `answer` (or `solution`), else 0.0;
    None for rows without a usable reference. grader: "math_verify" (Hugging Face's math-verify, the
    `barerl[math]` extra), "builtin", or "auto": math-verify when installed (see `math_grading`)."""
    if answer is None and solution is None:
        raise ValueError("math_accuracy needs a dataset column 'answer' or 'solution'")
    references = answer if answer is not None else solution
    return [grade(completion_text(c), ref, grader, is_solution=answer is None)
            for c, ref in zip(completions, references)]


DEFAULT_FORMAT = r"^\s*<think>.*?</think>\s*<answer>.*?</answer>\s*$"


def format_tags(prompts, completions, pattern: str = DEFAULT_FORMAT, **_) -> list[float]:
    """1.0 when the whole completion matches `pattern` (default `<think>..</think><answer>..</answer>`)."""
    regex = re.compile(pattern, flags=re.DOTALL)
    return [1.0 if regex.match(completion_text(c)) else 0.0 for c in completions]


def length_penalty(prompts, completions, completion_ids=None, max_length: int = 512, cache_length: int = 128,
                   **_) -> list[float]:
    """DAPO's soft overlong punishment: 0 up to max_length - cache_length, then falling linearly to -1 at
    max_length, -1 beyond. Lengths in tokens from `completion_ids` when given, else in characters."""
    lengths = [len(ids) for ids in completion_ids] if completion_ids is not None else [
        len(completion_text(c)) for c in completions
    ]
    soft_start = max_length - cache_length
    return [0.0 if n <= soft_start else (soft_start - n) / cache_length if n <= max_length else -1.0
            for n in lengths]


def reasoning_math_accuracy(prompts, completions, answer=None, solution=None, grader: str = "auto",
                            reasoning_delimiters: Sequence[str] = ("</think>",), **_) -> list[float | None]:
    """math_accuracy of the text after the reasoning (after the last of `reasoning_delimiters`): an answer
    boxed while still reasoning does not count, and a completion that never ends its reasoning gets 0.0."""
    finals = [_after_reasoning(completion_text(c), reasoning_delimiters) for c in completions]
    return math_accuracy(prompts, finals, answer, solution, grader)


def _after_reasoning(text: str, delimiters: Sequence[str]) -> str:
    ends = [text.rfind(d) + len(d) for d in delimiters if d in text]
    return text[max(ends):] if ends else ""


THINK_FORMAT = r"^<think>(?!.*<think>)(.*?)</think>.*$"  # one reasoning block, first; anything after it

BUILTIN_REWARDS = {"math_accuracy": math_accuracy, "format_tags": format_tags,
                   "length_penalty": length_penalty, "code_tests": code_tests,
                   "math_verify": partial(math_accuracy, grader="math_verify"),  # math-verify or an error
                   # TRL's names (its `trl grpo` script's), so that its configs carry over
                   "accuracy_reward": math_accuracy,
                   "reasoning_accuracy_reward": reasoning_math_accuracy,
                   "think_format_reward": partial(format_tags, pattern=THINK_FORMAT),
                   "get_soft_overlong_punishment": partial(length_penalty, max_length=1280, cache_length=256)}


# ---------------------------------------------------------------------------------------------------------
# Loading


def load_reward_function(spec: str) -> Callable:
    """`"module:function"`, `"path/to/file.py:function"` or a built-in name -> the callable."""
    return load_object(spec, kind="reward", builtins=BUILTIN_REWARDS, error=RewardError)


@dataclass
class Reward:
    """One reward function from config: its spec (or a picklable callable), weight and keyword arguments."""

    name: str
    source: str | Callable
    weight: float = 1.0
    kwargs: dict = field(default_factory=dict)

    def function(self) -> Callable:
        fn = load_reward_function(self.source) if isinstance(self.source, str) else self.source
        return partial(fn, **self.kwargs) if self.kwargs else fn


def _reward_from_config(item) -> Reward:
    if isinstance(item, Reward):
        return item
    if callable(item):
        return Reward(getattr(item, "__name__", type(item).__name__), item)
    if isinstance(item, str):
        load_reward_function(item)  # fail now, in the main process, with the spec named
        return Reward(item.rpartition(":")[2], item)
    if isinstance(item, dict):
        options = dict(item)
        source = options.pop("function", None)
        if source is None:
            raise RewardError(f"reward config {item!r} needs a 'function' key")
        base = _reward_from_config(source)
        return Reward(options.pop("name", base.name), source, float(options.pop("weight", 1.0)), options)
    raise RewardError(f"reward config must be a string, a dict or a callable, got {type(item).__name__}")


def load_rewards(specs, weights: Sequence[float] | None = None) -> list[Reward]:
    """Rewards from config: one spec or a list of them; `weights` (TRL's reward_weights) overrides."""
    items = specs if isinstance(specs, (list, tuple)) else [specs]
    rewards = [_reward_from_config(item) for item in items]
    if weights is not None:
        if len(weights) != len(rewards):
            raise RewardError(f"{len(weights)} reward weights given for {len(rewards)} reward functions")
        for reward, weight in zip(rewards, weights):
            reward.weight = float(weight)
    seen: dict[str, int] = {}
    for reward in rewards:  # unique names for logging: accuracy, accuracy_2, ...
        seen[reward.name] = seen.get(reward.name, 0) + 1
        if seen[reward.name] > 1:
            reward.name = f"{reward.name}_{seen[reward.name]}"
    return rewards


# ---------------------------------------------------------------------------------------------------------
# Scoring


def _call_reward(reward: Reward, prompts, completions, columns: dict):
    """Run one reward function; returns ("ok", values) or ("error", what went wrong). Runs in workers too."""
    try:
        fn = reward.function()
        problem = signature_problem(fn, columns)
        if problem is not None:
            return "error", problem
        output = fn(prompts=prompts, completions=completions, **columns)
        return "ok", output.tolist() if isinstance(output, np.ndarray) else output
    except Exception as e:  # noqa: BLE001 -- user code may raise anything; reported with the reward named
        return "error", f"raised {type(e).__name__}: {e} (at {where_raised(e)})"


def check_reward_output(name: str, output, prompts: list, row_ids: list[int] | None = None) -> list[float]:
    """Validate a reward's output for `prompts` (one per completion; `row_ids` their dataset rows, default
    0, 1, ...); None becomes NaN ("not applicable")."""
    row_ids = list(range(len(prompts))) if row_ids is None else row_ids

    def bad(why: str, i: int | None = None) -> RewardError:
        if i is None:
            return RewardError(f"reward {name!r} on {describe_rows(row_ids, prompts)}: {why}")
        one_row = len(set(row_ids)) == 1  # a group: say which of its completions
        where = describe_rows([row_ids[i]], [prompts[i]]) + (f", completion {i}" if one_row else "")
        return RewardError(f"reward {name!r} on {where}: {why}")

    if not isinstance(output, (list, tuple)):
        raise bad(f"returned {type(output).__name__}; expected a list of {len(prompts)} floats or None")
    if len(output) != len(prompts):
        raise bad(f"returned {len(output)} values for {len(prompts)} completions")
    values = []
    for i, value in enumerate(output):
        if value is not None and not isinstance(value, numbers.Real):
            raise bad(f"returned {type(value).__name__} {value!r:.60}; expected a float or None", i)
        if value is not None and math.isinf(value):
            raise bad(f"returned {value}; a reward must be finite (None or NaN: no reward for this completion)", i)
        values.append(math.nan if value is None else float(value))
    return values


@dataclass
class RewardScores:
    """names (F,), per_function (N, F) with NaN where not applicable, total (N,) = nan-aware weighted sum."""

    names: list[str]
    per_function: np.ndarray
    total: np.ndarray

    def metrics(self) -> dict[str, float]:
        """Mean total reward and, per function, mean and std over the samples it applies to (TRL's names)."""
        out = {"reward": float(self.total.mean())}
        for j, name in enumerate(self.names):
            column = self.per_function[:, j]
            applicable = column[~np.isnan(column)]
            out[f"rewards/{name}/mean"] = float(applicable.mean()) if applicable.size else math.nan
            out[f"rewards/{name}/std"] = float(applicable.std()) if applicable.size else math.nan
        return out


def combine_rewards(rewards: list[Reward], outputs: list, prompts, row_ids: list[int] | None = None) -> RewardScores:
    per_function = np.array(
        [check_reward_output(r.name, out, prompts, row_ids) for r, out in zip(rewards, outputs)], dtype=np.float64
    ).T.reshape(len(prompts), len(rewards))
    weights = np.array([r.weight for r in rewards], dtype=np.float64)
    total = np.nansum(per_function * weights, axis=1)
    none_rows = np.flatnonzero(np.isnan(per_function).all(axis=1))
    if none_rows.size:
        warnings.warn(f"every reward function returned None for {none_rows.size} completion(s) "
                      f"(first: row {none_rows[0]}, prompt {prompts[none_rows[0]]!r:.80}); their reward is 0",
                      stacklevel=3)
    return RewardScores([r.name for r in rewards], per_function, total)


class PendingRewards:
    """Rewards submitted to a `RewardRunner`; `result()` waits for them."""

    def __init__(self, runner: RewardRunner, handles: list, prompts, row_ids: list[int] | None):
        self._runner, self._handles, self._prompts, self._row_ids = runner, handles, prompts, row_ids

    def done(self) -> bool:
        return all(h.ready() for h in self._handles)

    def result(self) -> RewardScores:
        timeout = self._runner.timeout
        deadline = None if timeout is None else time.monotonic() + timeout  # from when the trainer waits
        where = describe_rows(self._row_ids or list(range(len(self._prompts))), self._prompts)
        outputs = []
        for reward, handle in zip(self._runner.rewards, self._handles):
            remaining = None if deadline is None else max(deadline - time.monotonic(), 0.0)
            try:
                status, value = handle.get(remaining)
            except multiprocessing.TimeoutError:
                self._runner._kill_workers()
                raise RewardError(f"reward {reward.name!r} on {where}: timed out, no result within reward_timeout="
                                  f"{timeout:g}s (make it faster or raise reward_timeout)") from None
            if status == "error":
                raise RewardError(f"reward {reward.name!r} on {where}: {value}")
            outputs.append(value)
        return combine_rewards(self._runner.rewards, outputs, self._prompts, self._row_ids)


class RewardRunner:
    """Scores completions with several reward functions, in worker processes when num_workers > 0.

    `submit(prompts, completions, columns)` returns at once; call `.result()` on what it returns when
    the scores are needed. Use as a context manager (or call `close()`) to stop the workers. Rewards given
    as callables (not specs) must be importable module-level functions to run in worker processes.
    """

    def __init__(self, rewards: list[Reward], num_workers: int | None = None, timeout: float | None = None):
        self.rewards = rewards
        self.num_workers = len(rewards) if num_workers is None else num_workers
        self.timeout = timeout
        self._pool = None

    def _executor(self):
        if self._pool is None:
            spawn = multiprocessing.get_context("spawn")
            self._pool = spawn.Pool(self.num_workers, ignore_sigint) if self.num_workers > 0 else ThreadPool(1)
        return self._pool

    def submit(self, prompts: list, completions: list, columns: dict | None = None,
               row_ids: list[int] | None = None) -> PendingRewards:
        """`row_ids`: the dataset row of each completion, for messages (default: 0, 1, ...)."""
        columns = columns or {}
        for key, values in [*columns.items(), ("row_ids", row_ids or prompts)]:
            if len(values) != len(prompts):
                raise RewardError(f"column {key!r} has {len(values)} values for {len(prompts)} prompts")
        pool = self._executor()
        handles = [pool.apply_async(_call_reward, (r, prompts, completions, columns)) for r in self.rewards]
        return PendingRewards(self, handles, prompts, row_ids)

    def __call__(self, prompts: list, completions: list, columns: dict | None = None,
                 row_ids: list[int] | None = None) -> RewardScores:
        return self.submit(prompts, completions, columns, row_ids).result()

    def _kill_workers(self):
        """Worker processes are killed; a thread (num_workers=0) cannot be, and is left to finish."""
        if self._pool is not None:
            self._pool.terminate()
            if self.num_workers > 0:
                self._pool.join()
            self._pool = None

    def close(self):
        self._kill_workers()

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()
