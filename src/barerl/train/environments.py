"""Environments for multi-turn RL: what the model talks to between its turns.

An environment is plain Python: `reset(row)` gets a dataset row and returns the conversation's first
messages; `step(text)` gets the text of the model's turn and returns an `Observation`: the messages to
append (tool results, a user's reply), whether the episode is over, and optionally a reward. The rollout
loop renders the messages with the model's chat template and appends their tokens to the same sequence
(`chat_turns.observation_token_ids`), samples the next turn, and so on until `done` or its turn limit.

A worked example, a guessing game (examples/ has a calculator and a coding task):

    from barerl.train.environments import Environment, Observation

    class GuessTheNumber(Environment):
        '''The model guesses a number between 1 and 100; the environment says higher or lower.'''

        def reset(self, row):
            self.secret, self.guesses = int(row["secret"]), 0
            return [{"role": "user", "content": "Guess my number (1-100). Reply with a number only."}]

        def step(self, text):
            self.guesses += 1
            try:
                guess = int(text.strip())
            except ValueError:
                return Observation([{"role": "user", "content": "A number only, please."}])
            if guess == self.secret:
                return Observation(done=True, reward=1.0 / self.guesses)
            hint = "higher" if guess < self.secret else "lower"
            return Observation([{"role": "user", "content": f"No: {hint}."}])

Named in YAML or on the command line as `environment_factory: path/to/guess.py:GuessTheNumber` (or
`module:GuessTheNumber`): any callable that returns a fresh environment, called once per episode.

The simple form is TRL's `tools=[fn, ...]`: `ToolEnvironment` passes the tools' schemas to the chat
template, runs the `<tool_call>`s of each turn concurrently (each within `tool_timeout`), answers with
one tool message per call, errors included, and ends the episode on a turn without a call. Its reward
comes from the reward functions, applied to the whole episode.

Design decisions:
- Rewards: `Observation.reward` values of an episode are summed into one environment reward (None
  when no step gave one); the rollout loop adds it to the reward functions' weighted sum.
- `step` runs in a `WorkerPool` thread while other episodes decode, so a slow environment never stalls
  the engine; an environment whose step raises or times out ends its episode (`finished_step`) with
  the error recorded in `info`, never a crashed run. Each episode gets its own environment object, so
  `reset` and `step` may keep state on `self` without locks.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from functools import partial
from typing import Any

from barerl.tokenizer.tool_calls import ToolCall, parse_tool_calls
from barerl.train.config import EnvironmentConfig
from barerl.train.sandbox import Sandbox
from barerl.train.specs import load_object
from barerl.train.tools import Tool, ToolResult, call_tool, load_tools
from barerl.train.worker_pool import Job, WorkerPool


class EnvironmentSetupError(ValueError):
    """An environment or its tools could not be loaded, or a dataset row does not fit it."""


@dataclass
class Observation:
    """What the environment answers a model turn with."""

    messages: list[dict] = field(default_factory=list)  # appended to the conversation, e.g. role "tool"
    done: bool = False
    reward: float | None = None
    info: dict[str, Any] = field(default_factory=dict)  # metrics of the step, e.g. tool_calls, tool_errors


def prompt_messages(row: Mapping) -> list[dict]:
    """A row's `prompt` as chat messages: a list of messages as it is, a string as one user message."""
    prompt = row.get("prompt")
    if isinstance(prompt, str):
        return [{"role": "user", "content": prompt}]
    if isinstance(prompt, list) and all(isinstance(m, dict) and "role" in m for m in prompt):
        return [dict(m) for m in prompt]
    raise EnvironmentSetupError(f"a dataset row needs a 'prompt' (a string or a list of messages); "
                                f"got keys {list(row)}")


class Environment:
    """Base class of environments; subclass it and override `step` (and `reset` to use the row)."""

    tools: list[dict] = []  # noqa: RUF012 -- read-only; tool schemas given to the chat template (tools=...)

    def reset(self, row: Mapping) -> list[dict]:
        """The first messages of the episode (default: the row's prompt)."""
        return prompt_messages(row)

    def step(self, text: str) -> Observation:
        """React to the model's turn (its text, without the end-of-turn token)."""
        raise NotImplementedError(f"{type(self).__name__} must define step(text) -> Observation")


class ToolEnvironment(Environment):
    """TRL's `tools=[...]`: the model calls tools until it answers without a call."""

    def __init__(self, tools: Mapping[str, Tool], pool: WorkerPool, config: EnvironmentConfig | None = None):
        self.config = config or EnvironmentConfig()
        self.tool_map, self.pool = dict(tools), pool
        self.tools = [tool.schema for tool in self.tool_map.values()]

    def step(self, text: str) -> Observation:
        _, calls = parse_tool_calls(text)
        if not calls:
            return Observation(done=True)
        limit = self.config.max_tool_calls_per_turn
        results = self.run_calls(calls[:limit]) + [
            ToolResult(call, f"Error: at most {limit} tool calls are run per turn.", "too_many_calls")
            for call in calls[limit:]]
        info = {"tool_calls": len(results), "tool_errors": sum(r.error is not None for r in results),
                "tool_seconds": sum(r.seconds for r in results)}
        return Observation([self._message(r) for r in results], info=info)

    def run_calls(self, calls: list[ToolCall]) -> list[ToolResult]:
        """Run a turn's calls concurrently in the pool, each within tool_timeout; results in call order."""
        timeout = self.config.tool_timeout
        jobs = self.pool.run_all([(call_tool, (self.tool_map, call)) for call in calls], timeout=timeout)
        return [job.result if not job.timed_out else
                ToolResult(call, f"Error: {call.name} timed out after {timeout:g}s.", "timeout", job.seconds)
                for call, job in zip(calls, jobs)]

    def _message(self, result: ToolResult) -> dict:
        cap = self.config.max_tool_response_chars
        if len(result.content) <= cap:
            return result.message()
        cut = ToolResult(result.call, result.content[:cap] + f"\n[... {len(result.content) - cap} characters cut]",
                         result.error, result.seconds)
        return cut.message()


def finished_step(job: Job) -> Observation:
    """The observation of an environment step run in a WorkerPool: its result, or for a step that raised
    or timed out, the end of the episode with the error in info["environment_error"]."""
    if job.timed_out:
        return Observation(done=True, info={"environment_error": f"step timed out after {job.timeout:g}s"})
    if job.error is not None:
        return Observation(done=True, info={"environment_error": f"{type(job.error).__name__}: {job.error}"})
    if not isinstance(job.result, Observation):
        return Observation(done=True, info={"environment_error": f"step returned {type(job.result).__name__}, "
                                            "not an Observation"})
    return job.result


def load_environment_factory(config: EnvironmentConfig, sandbox: Sandbox | None = None,
                             pool: WorkerPool | None = None) -> Callable[[], Environment]:
    """A callable giving each episode a fresh environment: the config's environment_factory, or a
    ToolEnvironment over its tools sharing one pool of tool_num_workers threads (or `pool`)."""
    if config.environment_factory:
        return load_object(config.environment_factory, kind="environment", builtins={},
                           error=EnvironmentSetupError, what="class")
    if not config.tools:
        raise EnvironmentSetupError("no environment: set environment_factory or tools")
    if sandbox is None and "python" in config.tools:
        sandbox = Sandbox(require=config.sandbox_require)
    tools = load_tools(config.tools, sandbox)
    return partial(ToolEnvironment, tools, pool or WorkerPool(config.tool_num_workers, "barerl-tool"), config)
