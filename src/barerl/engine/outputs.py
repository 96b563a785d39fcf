"""What `LLM.generate` returns, shaped as vLLM's `RequestOutput` / `CompletionOutput`."""

from __future__ import annotations

from dataclasses import dataclass, field


@dataclass
class CompletionOutput:
    """One sample. In a stream's delta outputs, text/token_ids/logprobs hold only what is new."""

    index: int
    text: str
    token_ids: list[int]
    cumulative_logprob: float
    logprobs: list[float] | None  # the sampled token's log-prob under the distribution it was drawn from
    finish_reason: str | None = None  # "stop" | "length" | None while running
    stop_reason: int | str | None = None  # the stop token id or stop string; None for EOS or length

    def finished(self) -> bool:
        return self.finish_reason is not None


@dataclass
class RequestMetrics:
    """perf_counter() timestamps in seconds, and token counts."""

    arrival_time: float
    first_scheduled_time: float | None
    first_token_time: float | None
    finished_time: float | None
    num_prompt_tokens: int
    num_cached_tokens: int  # prompt tokens served by the prefix cache
    num_generated_tokens: int

    @property
    def time_to_first_token(self) -> float | None:
        return None if self.first_token_time is None else self.first_token_time - self.arrival_time

    @property
    def latency(self) -> float | None:
        return None if self.finished_time is None else self.finished_time - self.arrival_time


@dataclass
class RequestOutput:
    request_id: int
    prompt: str | None
    prompt_token_ids: list[int]
    outputs: list[CompletionOutput] = field(default_factory=list)
    finished: bool = False
    metrics: RequestMetrics | None = None
