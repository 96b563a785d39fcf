"""Reward-function mistakes as one clear message: the function, the dataset row, and what was wrong.

A reward is user code called with TRL's signature `f(prompts, completions, **columns)`; the mistakes seen
most are a missing column (a parameter the row does not give), a function without `**kwargs` (the trainer
passes every column), an exception, and output of the wrong shape or type. This module words them:
- `signature_problem` checks the call against the function's signature before it runs, so a missing column
  is named as such instead of surfacing as a TypeError from inside the call;
- `check_reward_columns` runs that check over every row of a dataset before the first generation, so a run
  does not spend its first round of rollouts to find a missing column;
- `where_raised` is the line of the user's code that raised (one line, not a traceback to decode);
- `describe_rows` names the dataset rows of a call and the prompt of the first.
"""

from __future__ import annotations

import inspect
import traceback
from collections.abc import Callable

# What the trainer passes besides the dataset's columns (TRL's names).
TRAINER_ARGUMENTS = ("prompts", "completions", "completion_ids")


def _signature(fn: Callable) -> inspect.Signature | None:
    try:
        return inspect.signature(fn)
    except (TypeError, ValueError):  # builtins and some C callables have none: nothing to check
        return None


def signature_problem(fn: Callable, columns) -> str | None:
    """Why `fn(prompts=..., completions=..., **columns)` cannot be called (columns: their names), in words;
    None if it can."""
    signature = _signature(fn)
    if signature is None:
        return None
    params = signature.parameters.values()
    takes_any = any(p.kind is p.VAR_KEYWORD for p in params)
    given = {"prompts", "completions", *columns}
    missing = [p.name for p in params if p.default is p.empty and p.name not in given
               and p.kind in (p.POSITIONAL_OR_KEYWORD, p.KEYWORD_ONLY)]
    if missing:
        return (f"needs the column{'s' * (len(missing) > 1)} {', '.join(map(repr, missing))}, which the row lacks "
                f"(it has: {', '.join(c for c in columns if c not in TRAINER_ARGUMENTS) or 'no other column'})")
    named = {p.name for p in params}
    unexpected = [c for c in given if c not in named]
    if unexpected and not takes_any:
        return (f"takes no parameter {', '.join(map(repr, sorted(unexpected)))}; the trainer passes every column "
                "of the row, so give the function a **kwargs parameter: f(prompts, completions, **kwargs)")
    return None


def check_reward_columns(rewards, rows: list[dict]) -> None:
    """Refuse, before anything is generated, a row that lacks a column a reward function's signature needs."""
    from barerl.train.rewards import RewardError

    first_row_of: dict[tuple, int] = {}  # rows share a few sets of columns: check each set once
    for index, row in enumerate(rows):
        first_row_of.setdefault(tuple(key for key in row if key != "prompt"), index)
    for reward in rewards:
        fn = reward.function()
        for columns, index in first_row_of.items():
            problem = signature_problem(fn, [*columns, "completion_ids"])
            if problem is not None:
                prompt = rows[index].get("prompt")
                raise RewardError(f"reward {reward.name!r} on {describe_rows([index], [prompt])}: {problem}")


def where_raised(error: BaseException) -> str:
    """'file.py:12 in fn': the innermost frame of the error's traceback."""
    frames = traceback.extract_tb(error.__traceback__)
    if not frames:
        return "unknown location"
    frame = frames[-1]
    return f"{frame.filename}:{frame.lineno} in {frame.name}"


def describe_rows(row_ids: list[int], prompts: list) -> str:
    """'dataset row 17 (prompt '3+4=')' or 'dataset rows 0-63 (first prompt ...)' for one call's completions."""
    unique = sorted(set(row_ids))
    prompt = _short(prompts[0]) if prompts else ""
    if len(unique) == 1:
        return f"dataset row {unique[0]} (prompt {prompt})"
    span = f"{unique[0]}-{unique[-1]}" if unique == list(range(unique[0], unique[-1] + 1)) else \
        ", ".join(map(str, unique[:8])) + ("..." if len(unique) > 8 else "")
    return f"dataset rows {span} (first prompt {prompt})"


def _short(prompt) -> str:
    if isinstance(prompt, list) and prompt and isinstance(prompt[-1], dict):  # a conversation: its last turn
        prompt = prompt[-1].get("content", "")
    text = repr(prompt)
    return text if len(text) <= 60 else text[:57] + "..."
