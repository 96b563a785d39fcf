"""How to sample one request: vLLM's `SamplingParams`, the subset barerl implements, checked on creation.

Semantics follow vLLM's documentation: temperature 0 is greedy; top_k 0 or -1 and top_p 1 and min_p 0
switch their filter off; `stop` strings end generation and are cut from the returned text (kept with
`include_stop_str_in_output`); stop tokens (EOS unless `ignore_eos`, and `stop_token_ids`) end generation
and stay in `token_ids` but not in the text; `min_tokens` forbids the stop tokens (their logits are set to
-inf) and ignores stop strings until that many tokens exist. `logprobs` (True or any int >= 0) returns, for
each generated token, its log-prob under the exact distribution it was drawn from; barerl returns only the
sampled token's log-prob, never top-N alternatives. `seed` makes a request reproducible whatever it is
batched with; with n > 1, sample i draws from `derive_seed(seed, i)`.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from barerl.model.sampling_filter import SamplingFilter, SamplingFilterError

_MASK64 = (1 << 64) - 1


def derive_seed(seed: int, index: int) -> int:
    """Seed of sample `index` of a request seeded `seed`: the seed for sample 0, else a splitmix64 mix."""
    if index == 0:
        return seed & _MASK64
    z = (seed + 0x9E3779B97F4A7C15 * (index + 1)) & _MASK64
    z = ((z ^ (z >> 30)) * 0xBF58476D1CE4E5B9) & _MASK64
    z = ((z ^ (z >> 27)) * 0x94D049BB133111EB) & _MASK64
    return z ^ (z >> 31)


@dataclass
class SamplingParams:
    n: int = 1
    temperature: float = 1.0
    top_p: float = 1.0
    top_k: int = 0
    min_p: float = 0.0
    max_tokens: int | None = 16
    min_tokens: int = 0
    stop: str | list[str] | None = None
    stop_token_ids: list[int] | None = None
    include_stop_str_in_output: bool = False
    ignore_eos: bool = False
    seed: int | None = None
    logprobs: bool | int | None = None
    skip_special_tokens: bool = True
    stop_strings: list[str] = field(init=False, repr=False)
    filter: SamplingFilter = field(init=False, repr=False)  # temperature, top_k, top_p, min_p, validated

    def __post_init__(self) -> None:
        # list(123) would be a TypeError; like every bad value here (and in vLLM), a ValueError
        if not isinstance(self.stop, (str, list, tuple, type(None))):
            raise ValueError(f"SamplingParams.stop: must be a string or a list of strings, got {self.stop!r}")  # noqa: TRY004
        if not isinstance(self.stop_token_ids, (list, tuple, type(None))):
            got = self.stop_token_ids
            raise ValueError(f"SamplingParams.stop_token_ids: must be a list of token ids, got {got!r}")  # noqa: TRY004
        self.stop_strings = [self.stop] if isinstance(self.stop, str) else list(self.stop or [])
        self.stop_token_ids = list(self.stop_token_ids or [])
        self._validate()

    def _validate(self) -> None:
        def fail(name: str, why: str) -> ValueError:
            return ValueError(f"SamplingParams.{name}: {why}, got {getattr(self, name)!r}")

        if not _is_int(self.n) or self.n < 1:
            raise fail("n", "must be an integer >= 1")
        try:
            self.filter = SamplingFilter(self.temperature, self.top_k, self.top_p, self.min_p)
        except SamplingFilterError as e:
            raise ValueError(f"SamplingParams.{e}") from None
        if self.max_tokens is not None and (not _is_int(self.max_tokens) or self.max_tokens < 1):
            raise fail("max_tokens", "must be an integer >= 1 (or None: up to max_model_len)")
        if not _is_int(self.min_tokens) or self.min_tokens < 0:
            raise fail("min_tokens", "must be an integer >= 0")
        if self.max_tokens is not None and self.min_tokens > self.max_tokens:
            raise fail("min_tokens", f"must be <= max_tokens ({self.max_tokens})")
        if not all(isinstance(s, str) and s for s in self.stop_strings):
            raise fail("stop", "must be a non-empty string or a list of non-empty strings")
        if not all(_is_int(t) and t >= 0 for t in self.stop_token_ids):
            raise fail("stop_token_ids", "must be a list of token ids >= 0")
        if self.seed is not None and not _is_int(self.seed):
            raise fail("seed", "must be an integer or None")
        if self.logprobs is not None and not isinstance(self.logprobs, bool) and (
            not _is_int(self.logprobs) or self.logprobs < 0
        ):
            raise fail("logprobs", "must be a bool, an integer >= 0 or None")

    @classmethod
    def from_filter(cls, sampling: SamplingFilter, **fields) -> SamplingParams:
        """Params that sample from `sampling`'s distribution; `fields`: the others (n, max_tokens, ...)."""
        return cls(temperature=sampling.temperature, top_k=sampling.top_k, top_p=sampling.top_p,
                   min_p=sampling.min_p, **fields)

    @property
    def greedy(self) -> bool:
        return self.filter.greedy

    @property
    def wants_logprobs(self) -> bool:
        return self.logprobs is not None and self.logprobs is not False

    @property
    def stop_buffer_length(self) -> int:
        """Characters a stream holds back because they might be the start of a stop string."""
        if self.include_stop_str_in_output or not self.stop_strings:
            return 0
        return max(len(s) for s in self.stop_strings) - 1


def _is_int(x) -> bool:
    return isinstance(x, int) and not isinstance(x, bool)
