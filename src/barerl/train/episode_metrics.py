"""What a round of multi-turn episodes did, as GRPO logs it, and the engine/trainer mismatch per turn.

`EpisodeStats` keeps per-episode counts (N,) and the round's times; it travels with the rollouts (selected,
concatenated over rounds and processes like them) and gives the logged metrics:
- `episodes/turns_mean`, `episodes/turns_max`; `episodes/truncated_ratio` and, by cause,
  `episodes/max_turns_ratio`, `episodes/max_completion_length_ratio`; `episodes/environment_error_ratio`;
  `episodes/sampled_tokens_mean`, `episodes/environment_tokens_mean`;
- `tools/call_frequency` (calls per episode) and `tools/failure_frequency` (failed calls per call), TRL's;
- `engine/prefix_cache_hit_rate`: of the tokens continued turns could find in the prefix cache (the earlier
  turns' full blocks), the share they found (1.0 unless blocks were evicted while their episode waited);
- `time/environment` (environment steps, summed over episodes: it runs beside generation), `time/engine`
  (engine steps), `time/tool_wait` (the engine had nothing to run: every unfinished episode waited for its
  environment) and `time/gpu_idle_share` (tool_wait over the round's wall time, `time/generate`).
Summing times over processes and rounds keeps the shares those of all their time together.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass

import numpy as np

from barerl.train.episode import Episode
from barerl.train.episode_loop import LoopStats
from barerl.train.losses import logprob_mismatch

_PER_EPISODE = ("num_turns", "tool_calls", "tool_errors", "sampled_tokens", "environment_tokens", "cached_tokens",
                "reusable_tokens", "ends")
_TIMES = ("step_seconds", "engine_seconds", "idle_seconds", "wall_seconds")


@dataclass
class EpisodeStats:
    num_turns: np.ndarray  # (N,) int, like every per-episode field
    tool_calls: np.ndarray
    tool_errors: np.ndarray
    sampled_tokens: np.ndarray
    environment_tokens: np.ndarray
    cached_tokens: np.ndarray
    reusable_tokens: np.ndarray
    ends: np.ndarray  # (N,) str: how each episode ended (Episode.end)
    step_seconds: float
    engine_seconds: float
    idle_seconds: float
    wall_seconds: float

    @classmethod
    def from_episodes(cls, episodes: list[Episode], loop: LoopStats) -> EpisodeStats:
        column = lambda get: np.array([get(e) for e in episodes], dtype=np.int64)
        return cls(column(lambda e: e.num_turns), column(lambda e: e.tool_calls), column(lambda e: e.tool_errors),
                   column(lambda e: e.num_sampled_tokens),
                   column(lambda e: len(e.completion_ids) - e.num_sampled_tokens),
                   column(lambda e: e.cached_tokens), column(lambda e: e.reusable_tokens),
                   np.array([e.end for e in episodes], dtype=str),
                   sum(e.step_seconds for e in episodes), loop.engine_seconds, loop.idle_seconds, loop.wall_seconds)

    def select(self, idx: np.ndarray) -> EpisodeStats:
        """The episodes `idx` (the round's times stay the round's)."""
        return dataclasses.replace(self, **{name: getattr(self, name)[idx] for name in _PER_EPISODE})

    @classmethod
    def concatenate(cls, parts: list[EpisodeStats]) -> EpisodeStats:
        arrays = {name: np.concatenate([getattr(p, name) for p in parts]) for name in _PER_EPISODE}
        return cls(**arrays, **{name: sum(getattr(p, name) for p in parts) for name in _TIMES})

    def metrics(self) -> dict[str, float]:
        ratio = lambda *ends: float(np.isin(self.ends, ends).mean())
        calls, reusable = int(self.tool_calls.sum()), int(self.reusable_tokens.sum())
        return {
            "episodes/turns_mean": float(self.num_turns.mean()), "episodes/turns_max": int(self.num_turns.max()),
            "episodes/truncated_ratio": ratio("max_turns", "max_completion_length"),
            "episodes/max_turns_ratio": ratio("max_turns"),
            "episodes/max_completion_length_ratio": ratio("max_completion_length"),
            "episodes/environment_error_ratio": ratio("environment_error"),
            "episodes/sampled_tokens_mean": float(self.sampled_tokens.mean()),
            "episodes/environment_tokens_mean": float(self.environment_tokens.mean()),
            "tools/call_frequency": calls / len(self.num_turns),
            "tools/failure_frequency": int(self.tool_errors.sum()) / calls if calls else 0.0,
            "engine/prefix_cache_hit_rate": int(self.cached_tokens.sum()) / reusable if reusable else float("nan"),
            "time/environment": self.step_seconds, "time/engine": self.engine_seconds,
            "time/tool_wait": self.idle_seconds,
            "time/gpu_idle_share": self.idle_seconds / self.wall_seconds if self.wall_seconds else 0.0,
        }


def turn_mismatch(engine_logp, trainer_logp, mask, turns, xp) -> dict[str, float]:
    """`logprob_mismatch`'s max and mean per model turn: mismatch/turn_{k}_max, mismatch/turn_{k}_mean.
    turns (T,): the turn of each target token (-1 where none)."""
    out = {}
    present = np.unique(xp.asnumpy(turns) if hasattr(xp, "asnumpy") else np.asarray(turns))
    for k in (int(t) for t in present if t >= 0):
        stats = logprob_mismatch(engine_logp, trainer_logp, xp.asarray(mask) * (turns == k))
        out.update({f"mismatch/turn_{k}_{key}": stats[key] for key in ("max", "mean")})
    return out
