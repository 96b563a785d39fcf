"""Ctrl-C and SIGTERM during training: stop at a clean point, save a checkpoint, say how to resume.

Design decisions:
- `@stops_on_signals` wraps a training loop (`train_sft`, `train_grpo`): for the duration of the call,
  SIGINT and SIGTERM (what Slurm sends before it kills a job) go to one `StopSignals`, which the loop's
  `TrainingSession` finds with `active()`. The previous handlers come back when the call returns or raises.
- What the first signal does depends on where the loop is:
  * before training starts (loading, tokenizing): nothing to save, so KeyboardInterrupt at once;
  * in an abandonable phase (GRPO's rollouts: nothing of the step is applied yet, and on a CPU generation is
    most of a step): `StepAbandoned` at once; the session saves the state of the last finished step and
    raises `TrainingInterrupted`;
  * anywhere else (forward, backward, the optimizer step, a save): the current step is finished, then the
    session saves it and raises `TrainingInterrupted`. No weight is ever left half updated.
  A second signal stops at once with KeyboardInterrupt, saving nothing (the last checkpoint stays).
- `TrainingInterrupted` is a KeyboardInterrupt (code that handles Ctrl-C keeps working); its message names
  the signal, the checkpoint and the command that resumes, and `exit_code` is 128 + the signal's number.
- Reward worker processes ignore SIGINT (`ignore_sigint`), so a Ctrl-C in a terminal, which reaches the
  whole process group, stops the trainer cleanly instead of killing workers mid-task.
"""

from __future__ import annotations

import functools
import shlex
import signal
import sys
import threading
from contextlib import contextmanager
from pathlib import Path

_SIGNALS = (signal.SIGINT, signal.SIGTERM)
_active: list[StopSignals] = []  # innermost last; signal handlers are process-wide, and so is this record


class StepAbandoned(BaseException):
    """Raised by the handler inside an abandonable phase; `TrainingSession.abandonable` turns it into a save."""


class TrainingInterrupted(KeyboardInterrupt):
    """The run stopped on a signal after saving `checkpoint`; the message says how to resume."""

    def __init__(self, message: str, signum: int, checkpoint: Path):
        super().__init__(message)
        self.checkpoint = checkpoint
        self.exit_code = 128 + signum


def _say(message: str) -> None:
    print(f"\nbarerl: {message}", file=sys.stderr, flush=True)


class StopSignals:
    """SIGINT / SIGTERM handling for one training call (see the module docstring)."""

    def __init__(self):
        self.received: int | None = None  # the first signal's number
        self.training = False  # set by the session when its first step begins
        self._abandonable = False
        self._previous: dict[int, object] = {}

    @property
    def signal_name(self) -> str:
        return signal.Signals(self.received).name if self.received is not None else ""

    def __enter__(self):
        if threading.current_thread() is threading.main_thread():  # Python runs handlers there only
            for signum in _SIGNALS:
                self._previous[signum] = signal.signal(signum, self._handle)
        _active.append(self)
        return self

    def __exit__(self, *exc) -> None:
        _active.remove(self)
        for signum, handler in self._previous.items():
            signal.signal(signum, handler)

    @contextmanager
    def abandonable(self):
        """A phase that a signal abandons at once (StepAbandoned) instead of letting it finish; one that
        came before it began (during a save, say) abandons it before it starts."""
        if self.received is not None:
            raise StepAbandoned
        self._abandonable = True
        try:
            yield
        finally:
            self._abandonable = False

    def _handle(self, signum: int, frame) -> None:
        name = signal.Signals(signum).name
        if self.received is not None or not self.training:
            _say(f"{name}: stopping now, without saving" + (" (a second signal)" if self.received else ""))
            raise KeyboardInterrupt
        self.received = signum
        if self._abandonable:
            _say(f"{name}: abandoning this step's rollouts and saving the last finished step "
                 "(send it again to stop at once, without saving)")
            raise StepAbandoned
        _say(f"{name}: finishing the current step, then saving a checkpoint (send it again to stop at once, "
             "without saving)")


def active() -> StopSignals | None:
    """The StopSignals of the training call running now, if any."""
    return _active[-1] if _active else None


def stops_on_signals(train):
    """Decorator: `train` runs with SIGINT / SIGTERM handled by a StopSignals (see the module docstring)."""

    @functools.wraps(train)
    def wrapper(*args, **kwargs):
        with StopSignals():
            return train(*args, **kwargs)

    return wrapper


def resume_hint(checkpoint: Path) -> str:
    """The command that resumes: the `barerl sft|grpo` command line that ran, with --resume, or the Python
    call's argument when the loop was called from Python."""
    argv = sys.argv
    if len(argv) > 1 and argv[1] in ("sft", "grpo") and Path(argv[0]).name in ("barerl", "cli.py", "__main__.py"):
        kept, skip = [], False
        for token in argv[2:]:
            flag = token.partition("=")[0].replace("-", "_")
            if skip:
                skip = False
            elif flag == "__resume":
                continue
            elif flag == "__resume_from_checkpoint":
                skip = "=" not in token
            else:
                kept.append(token)
        return "barerl " + shlex.join([argv[1], *kept, "--resume"])
    return f"the same call with resume_from_checkpoint={str(checkpoint)!r}"


def ignore_sigint() -> None:
    """Initializer of reward worker processes: Ctrl-C is the trainer's to handle."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)
