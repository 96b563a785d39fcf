"""One multi-turn episode: its token sequence, grown from the model's turns and the environment's answers,
and what happened on the way.

An episode is one sequence of token ids: the prompt, the ids the model sampled in its first turn, the ids of
the environment's answer, the next turn's sampled ids, and so on. Ids are only ever appended, never decoded
and encoded again, so the trained ids are exactly the sampled ones plus the environment's, in order. Per
token after the prompt the episode keeps the turn that sampled it (-1: the environment's) and the engine's
sampling log-prob (0.0 for the environment's), so the trainer masks environment tokens out of the loss and
compares log-probs turn by turn.

Design decisions:
- How messages become ids is the episode's codec: `ChatTokens`, the model's own chat template through
  `chat_turns` (the prompt rendered with the generation prompt; an observation as what the template adds
  after the model's last turn). A benchmark without a tokenizer gives fixed ids instead.
- The token budget (`budget`, GRPO's max_completion_length) counts every token after the prompt, sampled or
  the environment's, as TRL counts a tool-calling completion: a turn samples at most what is left.
- How an episode ends (`end`): "done" (the environment said so); "environment_error" (its step raised, timed
  out, or answered nothing without ending the episode; `error` says which); and the two truncations,
  "max_turns" (it had its max_turns turns) and "max_completion_length" (a turn used up the budget, or an
  answer did not fit in what was left, which is then dropped). The last turn is stepped even at max_turns,
  so that an environment can end or reward it; its answer is not appended, since nothing would follow it.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field

from barerl.train.chat_turns import observation_token_ids, prompt_token_ids
from barerl.train.environments import Environment, Observation

ENVIRONMENT_TOKEN = -1  # the turn index of a token the environment added
TRUNCATIONS = ("max_turns", "max_completion_length")


class ChatTokens:
    """An episode's codec through the model's chat template: messages to ids, sampled ids to text."""

    def __init__(self, tokenizer, max_prompt_length: int | None = None, template_kwargs: dict | None = None):
        self.tokenizer, self.max_prompt_length = tokenizer, max_prompt_length
        self.template_kwargs = template_kwargs or {}  # the template's variables (chat_template_kwargs)

    def prompt(self, messages: list[dict], tools: list[dict]) -> list[int]:
        """The first turn's prompt; a longer one keeps its last max_prompt_length ids (as single-turn GRPO)."""
        ids = prompt_token_ids(self.tokenizer, messages, tools, **self.template_kwargs)
        return ids[-self.max_prompt_length:] if self.max_prompt_length else ids

    def text(self, ids: Sequence[int]) -> str:
        """What the environment reads of a turn: its ids decoded without special tokens."""
        return self.tokenizer.decode(list(ids), skip_special_tokens=True)

    def observation(self, history: list[dict], messages: list[dict], turn_ids: Sequence[int],
                    tools: list[dict]) -> list[int]:
        return observation_token_ids(self.tokenizer, history, messages, turn_ids=turn_ids, tools=tools,
                                     **self.template_kwargs)


@dataclass(eq=False)
class Episode:
    env: Environment
    tokens: ChatTokens  # the codec (or one with the same three methods)
    prompt_messages: list[dict]
    prompt_ids: list[int]
    budget: int  # tokens after the prompt at most, sampled and the environment's
    max_turns: int
    group_seed: int  # the seed of the episode's group (see episode_loop.turn_seed)
    sample_index: int  # its place in the group
    history: list[dict] = field(default_factory=list)  # the conversation: prompt, turns, observations
    completion_ids: list[int] = field(default_factory=list)
    logprobs: list[float] = field(default_factory=list)  # per completion id; 0.0 for the environment's
    turns: list[int] = field(default_factory=list)  # per completion id: its turn, ENVIRONMENT_TOKEN if added
    num_turns: int = 0
    last_turn_ids: list[int] = field(default_factory=list)
    end: str | None = None  # why it ended (module docstring), None while it runs
    error: str | None = None  # the environment error that ended it
    reward: float | None = None  # the sum of its steps' rewards; None if none gave one
    tool_calls: int = 0
    tool_errors: int = 0
    step_seconds: float = 0.0  # in environment steps
    cached_tokens: int = 0  # continued turns' prompt tokens found in the prefix cache, of the reusable ones
    reusable_tokens: int = 0  # continued turns' prompt tokens an earlier turn left in full cached blocks
    turn_reusable: int = 0  # ... of the turn running now

    def __post_init__(self):
        if self.budget < 1:
            raise ValueError(f"the prompt's {len(self.prompt_ids)} tokens leave no room for a completion")
        self.history = [dict(m) for m in self.prompt_messages]

    @property
    def ids(self) -> list[int]:
        return self.prompt_ids + self.completion_ids

    @property
    def room(self) -> int:
        """Tokens the episode may still add."""
        return self.budget - len(self.completion_ids)

    @property
    def truncated(self) -> bool:
        return self.end in TRUNCATIONS

    @property
    def completion_messages(self) -> list[dict]:
        """The conversation after the prompt: the model's turns and the environment's messages."""
        return self.history[len(self.prompt_messages):]

    @property
    def num_sampled_tokens(self) -> int:
        return sum(t != ENVIRONMENT_TOKEN for t in self.turns)

    def add_turn(self, ids: Sequence[int], logprobs: Sequence[float], text: str, cut: bool) -> bool:
        """Append a model turn (`cut`: it stopped at its max_tokens); whether the environment steps on it."""
        self.completion_ids += ids
        self.logprobs += logprobs
        self.turns += [self.num_turns] * len(ids)
        self.last_turn_ids = list(ids)
        self.num_turns += 1
        self.history.append({"role": "assistant", "content": text})
        if cut and self.room <= 0:
            self.end = "max_completion_length"
        return self.end is None

    def add_observation(self, observation: Observation) -> bool:
        """Take the environment's answer to the last turn; whether the model takes another turn."""
        self._record(observation)
        if "environment_error" in observation.info:
            self._fail(observation.info["environment_error"])
        elif observation.done:
            self.end = "done"
        elif not observation.messages:
            self._fail("the step returned no messages without ending the episode (done=False)")
        elif self.num_turns >= self.max_turns:
            self.end = "max_turns"
        else:
            ids = self.tokens.observation(self.history, observation.messages, self.last_turn_ids, self.env.tools)
            if len(ids) >= self.room:  # no room left for a turn after it
                self.end = "max_completion_length"
            else:
                self.completion_ids += ids
                self.logprobs += [0.0] * len(ids)
                self.turns += [ENVIRONMENT_TOKEN] * len(ids)
                self.history += observation.messages
        return self.end is None

    def _record(self, observation: Observation) -> None:
        info = observation.info
        self.tool_calls += int(info.get("tool_calls", 0))
        self.tool_errors += int(info.get("tool_errors", 0))
        if observation.reward is not None:
            self.reward = (self.reward or 0.0) + float(observation.reward)

    def _fail(self, error: str) -> None:
        self.end, self.error = "environment_error", error
