"""CPU time, wall time and peak memory of each step of `barerl grpo`, for the CPU findings in docs/LOG.md.

    python bench/cpu_grpo_steps.py --config examples/grpo_smollm2.yaml --max_steps 8 [--key value ...]

Runs `barerl grpo` with the arguments given and prints one JSON line per optimizer step: the process's user
and system CPU seconds since the previous step (every thread: a BLAS thread spinning shows here), the wall
seconds, and the peak resident memory so far (GiB). The step's own split, generate against train, is in the
run's metrics.jsonl (`time/generate`, `time/train`).
"""

from __future__ import annotations

import json
import os
import resource
import sys
import time

from barerl.cli import main
from barerl.train.session import TrainingSession


def timed_steps() -> None:
    """Print each optimizer step's resources as it ends (wrapping TrainingSession.optimizer_step)."""
    step_once = TrainingSession.optimizer_step
    last = [os.times(), time.perf_counter()]

    def step_and_report(session):
        out = step_once(session)
        now, wall = os.times(), time.perf_counter()
        before, before_wall = last
        record = {"step": session.step, "user_s": round(now.user - before.user, 2),
                  "sys_s": round(now.system - before.system, 2), "wall_s": round(wall - before_wall, 2),
                  "peak_rss_gib": round(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 2**20, 2),
                  "load": round(os.getloadavg()[0], 1)}
        print(json.dumps(record), file=sys.stderr, flush=True)
        last[:] = [now, wall]
        return out

    TrainingSession.optimizer_step = step_and_report


if __name__ == "__main__":
    timed_steps()
    sys.exit(main(["grpo", *sys.argv[1:]]))
