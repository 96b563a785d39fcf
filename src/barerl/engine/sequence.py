"""Requests and their sequences: the engine's bookkeeping, pure Python.

A `Request` is one prompt with its `SamplingParams`; it owns `n` `Sequence`s, one per sample. Before its
first token a request has a single sequence, the parent, that stands for all n samples
(`num_samples == n`): the prompt is prefilled once, the first step samples n tokens from the parent's
logits, and the scheduler forks the parent into n sequences that share the prompt's KV blocks.

A sequence's state is its token list plus `num_computed_tokens`, the prefix whose keys and values are in
the cache. Each step computes the next tokens of that list (a prefill chunk, or the one newly sampled token);
when the computed prefix reaches the end of the list the step's logits sample the next token. Preemption
simply sets `num_computed_tokens` back to 0 (recompute), and since the sampler's noise depends only on
(seed, index of the token in its sequence), a resumed sequence samples the same tokens.
"""

from __future__ import annotations

import enum
import itertools
import time
from dataclasses import dataclass, field
from typing import Any

from barerl.engine.sampling_params import SamplingParams, derive_seed

_seq_ids = itertools.count()


class SequenceStatus(enum.Enum):
    WAITING = "waiting"
    RUNNING = "running"
    FINISHED = "finished"


@dataclass
class Request:
    request_id: int
    prompt: str | None
    prompt_token_ids: list[int]
    params: SamplingParams
    seed: int  # the request's seed: params.seed, or drawn from the engine's generator
    eos_token_ids: tuple[int, ...] = ()
    arrival_time: float = field(default_factory=time.perf_counter)
    sequences: list[Sequence] = field(default_factory=list)  # one per sample once forked
    first_scheduled_time: float | None = None
    first_token_time: float | None = None
    finished_time: float | None = None
    num_cached_tokens: int = 0  # prompt tokens found in the prefix cache at first admission

    def __post_init__(self) -> None:
        self.sequences.append(Sequence(self, list(self.prompt_token_ids), sample_index=0))

    @property
    def finished(self) -> bool:
        return all(s.status is SequenceStatus.FINISHED for s in self.sequences) and (
            len(self.sequences) == self.params.n
        )


class Sequence:
    def __init__(self, request: Request, token_ids: list[int], sample_index: int):
        self.seq_id = next(_seq_ids)
        self.request = request
        self.token_ids = token_ids
        self.num_prompt_tokens = len(request.prompt_token_ids)
        self.sample_index = sample_index
        self.seed = derive_seed(request.seed, sample_index)  # this sample's sampler seed
        self.num_computed_tokens = 0
        self.block_table: list[int] = []
        self.block_hashes: list[int] = []  # chained hashes of the leading full, computed blocks
        # (block id, key) of the cached blocks it held when freed, in order: a sequence that continues it finds
        # them by these (BlockManager.lookup's prefix_hint), without building their keys again
        self.released_blocks: list[tuple[int, tuple]] = []
        self.prefix_hint: list[tuple[int, tuple]] = []  # another sequence's released blocks: a prefix of ours
        self.status = SequenceStatus.WAITING
        self.output_logprobs: list[float] = []
        self.finish_reason: str | None = None  # "stop" | "length"
        self.stop_reason: int | str | None = None  # the stop token id or stop string that ended it
        self.detokenizer: Any = None  # the engine's streaming detokenizer for this sample

    def __repr__(self) -> str:
        return (f"Sequence(id={self.seq_id}, tokens={self.num_tokens}, computed={self.num_computed_tokens}, "
                f"blocks={self.block_table}, {self.status.value})")

    @property
    def params(self) -> SamplingParams:
        return self.request.params

    @property
    def num_tokens(self) -> int:
        return len(self.token_ids)

    @property
    def num_output_tokens(self) -> int:
        return len(self.token_ids) - self.num_prompt_tokens

    @property
    def output_token_ids(self) -> list[int]:
        return self.token_ids[self.num_prompt_tokens :]

    @property
    def num_samples(self) -> int:
        """How many tokens the next sampling step draws: n for a parent before its first token, else 1."""
        return self.params.n if self.num_output_tokens == 0 and self.sample_index == 0 else 1

    @property
    def is_finished(self) -> bool:
        return self.status is SequenceStatus.FINISHED

    def sample_seeds(self) -> list[int]:
        """Seeds of the samples the next step draws (one per `num_samples`)."""
        if self.num_samples == 1:
            return [self.seed]
        return [derive_seed(self.request.seed, self.sample_index + i) for i in range(self.num_samples)]

    def banned_token_ids(self) -> list[int]:
        """Tokens the next sample may not be: the stop tokens, while fewer than min_tokens exist (vLLM)."""
        if self.num_output_tokens >= self.params.min_tokens:
            return []
        eos = [] if self.params.ignore_eos else list(self.request.eos_token_ids)
        return eos + self.params.stop_token_ids

    def append_token(self, token_id: int, logprob: float) -> None:
        self.token_ids.append(token_id)
        self.output_logprobs.append(logprob)

    def fork(self, sample_index: int) -> Sequence:
        """A sibling with the same tokens and block table (the caller bumps the blocks' reference counts)."""
        child = Sequence(self.request, list(self.token_ids), sample_index)
        child.num_computed_tokens = self.num_computed_tokens
        child.block_table = list(self.block_table)
        child.block_hashes = list(self.block_hashes)
        child.status = self.status
        return child
