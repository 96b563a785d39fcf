"""The distribution a token is drawn from: temperature, then top-k, top-p and min-p truncation.

One frozen type, validated once, for everything that needs the distribution: the engine's `SamplingParams`
derive it per request, `GRPOConfig` derives it for the rollouts, and the model computes the trainer's log-probs
under it, so both sides of RL see the same distribution by construction. Semantics are vLLM's: temperature 0 is
greedy; top_k 0 (or -1, normalised to 0), top_p 1 and min_p 0 switch their filter off.
"""

from __future__ import annotations

import math
from dataclasses import dataclass


class SamplingFilterError(ValueError):
    """A sampling field is out of its range; `field` names it (the caller prefixes its own type's name)."""

    def __init__(self, field: str, why: str, value):
        super().__init__(f"{field}: {why}, got {value!r}")
        self.field = field


def _number(x) -> bool:
    return isinstance(x, (int, float)) and not isinstance(x, bool) and math.isfinite(x)


@dataclass(frozen=True)
class SamplingFilter:
    temperature: float = 1.0
    top_k: int = 0
    top_p: float = 1.0
    min_p: float = 0.0

    def __post_init__(self) -> None:
        if not _number(self.temperature) or self.temperature < 0:
            raise SamplingFilterError("temperature", "must be a finite number >= 0 (0 means greedy)", self.temperature)
        if not isinstance(self.top_k, int) or isinstance(self.top_k, bool) or self.top_k < -1:
            raise SamplingFilterError("top_k", "must be an integer >= -1 (0 or -1 switch it off)", self.top_k)
        if not _number(self.top_p) or not 0 < self.top_p <= 1:
            raise SamplingFilterError("top_p", "must be in (0, 1]", self.top_p)
        if not _number(self.min_p) or not 0 <= self.min_p <= 1:
            raise SamplingFilterError("min_p", "must be in [0, 1]", self.min_p)
        object.__setattr__(self, "temperature", float(self.temperature))
        object.__setattr__(self, "top_k", max(self.top_k, 0))
        object.__setattr__(self, "top_p", float(self.top_p))
        object.__setattr__(self, "min_p", float(self.min_p))

    @property
    def greedy(self) -> bool:
        return self.temperature == 0

    @property
    def truncates(self) -> bool:
        """Whether any of top-k, top-p, min-p removes tokens (the LM head then takes its filtered form)."""
        return self.top_k > 0 or self.top_p < 1.0 or self.min_p > 0.0
