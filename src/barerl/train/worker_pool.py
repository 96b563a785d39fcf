"""A thread pool with a timeout per job and a submit / poll interface, for tools and environment steps.

The multi-turn rollout loop submits an episode's environment step (which runs its tool calls) and goes
on decoding the other episodes; between engine steps it calls `poll()`, which never blocks, and
continues each episode whose job came back. A blocking `run_all` serves callers that need a batch of
jobs done before they go on (the tool calls of one turn).

Design decisions:
- At most `num_workers` jobs run at once, each on a thread of its own; the others wait in a queue. A
  job's timeout counts from its start, not from its submission. Threads outlive their jobs: an idle one
  is handed the next job (tens of microseconds where starting a thread costs hundreds, so the steps of a
  batch of turns that ended together start, and come back, together).
- Python cannot kill a thread. A job past its timeout is reported as timed out at once and its slot is
  given to the next job; the thread is abandoned (its eventual result dropped) and counted in
  `num_abandoned` until it returns. Code that may never return belongs in the sandbox, whose processes
  are killed at their wall-clock limit.
- One watchdog thread wakes at the nearest deadline, so timeouts are reported on time whoever waits.
- A job's exception is its result (`job.error`), never raised in the pool or the caller's thread.
"""

from __future__ import annotations

import itertools
import threading
import time
from collections import deque
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any


class _Worker:
    """A pool thread's mailbox: the job it is handed next (None: exit), and the event that wakes it."""

    __slots__ = ("job", "wake")

    def __init__(self):
        self.job: Job | None = None
        self.wake = threading.Event()


@dataclass(eq=False)
class Job:
    """A submitted call. When `done`: `result`, or `error` (the exception it raised), or `timed_out`."""

    fn: Callable
    args: tuple
    key: Any = None
    timeout: float | None = None
    report: bool = True  # whether poll() returns it
    result: Any = None
    error: BaseException | None = None
    timed_out: bool = False
    started: float | None = None
    seconds: float | None = None  # from start to finish (to the timeout for a timed-out job)
    finished: threading.Event = field(default_factory=threading.Event, repr=False)

    @property
    def done(self) -> bool:
        return self.finished.is_set()

    @property
    def deadline(self) -> float | None:
        return None if self.timeout is None or self.started is None else self.started + self.timeout


class WorkerPool:
    """Runs callables in threads, `num_workers` at a time, each within its own timeout."""

    def __init__(self, num_workers: int = 8, name: str = "barerl-worker"):
        if num_workers < 1:
            raise ValueError(f"num_workers must be >= 1, got {num_workers}")
        self.num_workers = num_workers
        self.name = name
        self._lock = threading.Condition()
        self._queue: deque[Job] = deque()
        self._running: set[Job] = set()
        self._idle: list[_Worker] = []  # threads waiting for a job, the most recently idle last
        self._finished: list[Job] = []
        self._abandoned = 0
        self._closed = False
        self._ids = itertools.count()
        self._watchdog = threading.Thread(target=self._watch, name=f"{name}-watchdog", daemon=True)
        self._watchdog.start()

    # ---- submitting and collecting -------------------------------------------------------------------

    def submit(self, fn: Callable, *args, key: Any = None, timeout: float | None = None,
               report: bool = True) -> Job:
        """Queue fn(*args); returns at once. report=False: only the returned job tells of its end."""
        job = Job(fn, args, key, timeout, report)
        with self._lock:
            if self._closed:
                raise RuntimeError(f"{self.name}: the pool is closed")
            self._queue.append(job)
            self._start_queued()
        return job

    def poll(self) -> list[Job]:
        """The reported jobs that finished (or timed out) since the last poll, in finishing order."""
        with self._lock:
            finished, self._finished = self._finished, []
        return finished

    def wait(self, timeout: float | None = None) -> list[Job]:
        """Like poll(), but waits up to `timeout` seconds for at least one job when none has finished."""
        with self._lock:
            self._lock.wait_for(lambda: self._finished, timeout)
        return self.poll()

    def run_all(self, calls: Sequence[tuple[Callable, tuple]], timeout: float | None = None) -> list[Job]:
        """Run (fn, args) calls concurrently, each within `timeout`; returns their jobs, done, in order."""
        jobs = [self.submit(fn, *args, timeout=timeout, report=False) for fn, args in calls]
        for job in jobs:
            job.finished.wait()
        return jobs

    # ---- state ------------------------------------------------------------------------------------------

    @property
    def num_running(self) -> int:
        return len(self._running)

    @property
    def num_queued(self) -> int:
        return len(self._queue)

    @property
    def num_abandoned(self) -> int:
        """Threads of timed-out jobs that have not returned yet."""
        return self._abandoned

    def close(self) -> None:
        """Refuse new jobs; queued ones are dropped, running ones finish (or time out) on their own."""
        with self._lock:
            self._closed = True
            self._queue.clear()
            for worker in self._idle:
                worker.wake.set()  # with no job: the thread ends
            self._idle.clear()
            self._lock.notify_all()

    def __enter__(self):
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    # ---- internals (called with the lock held unless named otherwise) ------------------------------------

    def _start_queued(self) -> None:
        while self._queue and len(self._running) < self.num_workers:
            job = self._queue.popleft()
            job.started = time.monotonic()
            self._running.add(job)
            if self._idle:
                worker = self._idle.pop()
                worker.job = job
                worker.wake.set()
            else:
                name = f"{self.name}-{next(self._ids)}"
                threading.Thread(target=self._work, args=(job,), name=name, daemon=True).start()
        self._lock.notify_all()  # the watchdog's nearest deadline may have changed

    def _finish(self, job: Job) -> None:
        job.seconds = time.monotonic() - job.started
        self._running.discard(job)
        if job.report:
            self._finished.append(job)
        job.finished.set()
        self._start_queued()

    def _work(self, job: Job | None) -> None:
        """A pool thread (without the lock): runs its job, then waits to be handed the next one. The thread of a
        job that timed out ends when the job returns (its slot went to another thread)."""
        worker = _Worker()
        while job is not None:
            try:
                result, error = job.fn(*job.args), None
            except BaseException as e:  # noqa: BLE001 -- a job's failure is its result
                result, error = None, e
            with self._lock:
                if job.timed_out:
                    self._abandoned -= 1
                    return
                job.result, job.error = result, error
                worker.job = None
                worker.wake.clear()
                self._idle.append(worker)  # before _finish: it may hand this thread the next queued job
                self._finish(job)
                if self._closed and worker in self._idle:
                    self._idle.remove(worker)
                    return
            worker.wake.wait()
            job = worker.job

    def _watch(self) -> None:
        """The watchdog thread: time out running jobs past their deadline."""
        with self._lock:
            while not (self._closed and not self._running):
                now = time.monotonic()
                for job in [j for j in self._running if j.deadline is not None and j.deadline <= now]:
                    job.timed_out = True
                    self._abandoned += 1
                    self._finish(job)
                deadlines = [j.deadline for j in self._running if j.deadline is not None]
                self._lock.wait(None if not deadlines else max(min(deadlines) - now, 0.0))
