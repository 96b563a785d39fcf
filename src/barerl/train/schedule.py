"""Learning-rate schedules: constant, linear or cosine decay, each after an optional linear warmup.

The values are transformers' `get_scheduler` values, step for step: the learning rate of optimizer step
`s` (0-based, i.e. the s-th call to `optimizer.step`) is `learning_rate * factor(s)`, so with warmup the
very first update has lr 0, as in the Hugging Face Trainer. A schedule is a pure function of the step
(no state to checkpoint beyond its definition, which `state_dict` returns so a resumed run can check it).

One deliberate difference: Hugging Face's "constant" ignores warmup; here "constant" with warmup steps
warms up (it is "constant_with_warmup", which is accepted as a name too).
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass

SCHEDULES = ("constant", "constant_with_warmup", "linear", "cosine")


def resolve_warmup_steps(num_training_steps: int, warmup_steps: int = 0, warmup_ratio: float = 0.0) -> int:
    """warmup_steps when > 0, else ceil(warmup_ratio * num_training_steps) (the Trainer's rule)."""
    if warmup_steps > 0:
        return int(warmup_steps)
    return math.ceil(num_training_steps * warmup_ratio)


@dataclass(frozen=True)
class Schedule:
    name: str
    learning_rate: float
    num_training_steps: int
    num_warmup_steps: int = 0

    def __post_init__(self):
        if self.name not in SCHEDULES:
            raise ValueError(f"lr_scheduler_type must be one of {SCHEDULES}, got {self.name!r}")
        if self.num_warmup_steps < 0 or self.num_training_steps < 0:
            raise ValueError(
                f"schedule steps must be >= 0, got num_training_steps={self.num_training_steps} "
                f"num_warmup_steps={self.num_warmup_steps}"
            )

    def factor(self, step: int) -> float:
        warmup, total = self.num_warmup_steps, self.num_training_steps
        if step < warmup:
            return step / max(1, warmup)
        if self.name in ("constant", "constant_with_warmup"):
            return 1.0
        if self.name == "linear":
            return max(0.0, (total - step) / max(1, total - warmup))
        progress = (step - warmup) / max(1, total - warmup)
        return max(0.0, 0.5 * (1.0 + math.cos(math.pi * progress)))  # cosine, half a cycle

    def lr(self, step: int) -> float:
        """Learning rate for optimizer step `step` (0-based)."""
        return self.learning_rate * self.factor(step)

    def state_dict(self) -> dict:
        return asdict(self)


def resolve_total_steps(max_steps: int, num_train_epochs: float, steps_per_epoch: int) -> int:
    """max_steps when > 0, else ceil(num_train_epochs * steps_per_epoch) (the Trainer's rule; steps are
    optimizer steps, so steps_per_epoch already accounts for gradient accumulation)."""
    if max_steps > 0:
        return max_steps
    return max(1, math.ceil(num_train_epochs * max(1, steps_per_epoch)))


def make_schedule(
    name: str, learning_rate: float, num_training_steps: int, warmup_steps: int = 0, warmup_ratio: float = 0.0
) -> Schedule:
    warmup = resolve_warmup_steps(num_training_steps, warmup_steps, warmup_ratio)
    return Schedule(name, learning_rate, num_training_steps, warmup)
