"""The job's processes: rank, world size and local rank, from MPI when the job was started by an MPI launcher
(`mpirun`, `mpiexec`, Slurm's `srun`), else one process alone; collectives on Python objects; and the watch
that ends the whole job when a rank is dead or hung.

Design decisions:
- One process per GPU; the local rank (the process's index among those on its node, from MPI's shared-memory
  split) picks the GPU. Under Slurm with one GPU per task (`--gpus-per-task=1`) each process sees one device
  and takes it.
- mpi4py (the `mpi` extra) is imported only when a launcher's environment variables say the process is one
  of several, so a plain `barerl grpo` never initialises MPI; a launch of several ranks without mpi4py is one
  clear error, not N independent runs writing over each other.
- Every collective first checks that all ranks arrived at it (`arrive`): ranks report (count, name) to rank 0,
  which answers once all have. A rank that has not arrived within `timeout` seconds is named in the message,
  and MPI_Abort ends every process (a launcher ends the job when one of its processes dies; a hung one only
  this watch can catch). The same report catches ranks that took different paths through the code (their
  collectives' names or counts differ), which would otherwise deadlock or exchange the wrong data.
- Waits poll with short sleeps instead of blocking in MPI, so the deadline holds whatever a peer does.
"""

from __future__ import annotations

import functools
import os
import pickle
import sys
import time
from collections.abc import Callable
from typing import Any, NoReturn

DEFAULT_TIMEOUT = 1800.0  # seconds a rank waits for the others at a collective (the `ddp_timeout` default)
_ARRIVE, _GO, _GATHER = 7301, 7302, 7304  # MPI tags: arrival reports, rank 0's answer, gathered arrays
# Environment variables launchers set to the number of processes: Open MPI, MPICH / Intel MPI (hydra's PMI),
# Slurm's srun (for the job step; SLURM_NTASKS is set in a batch script outside srun too)
_SIZE_VARIABLES = ("OMPI_COMM_WORLD_SIZE", "PMI_SIZE", "SLURM_STEP_NUM_TASKS")


class ProcessGroup:
    """This process's place in the job, and the host-side collectives every rank takes part in.

    `mpi_comm` is MPI's COMM_WORLD (mpi4py), or None for a job of one process."""

    def __init__(self, mpi_comm=None, timeout: float = DEFAULT_TIMEOUT):
        self.mpi_comm = mpi_comm
        self.rank = mpi_comm.Get_rank() if mpi_comm is not None else 0
        self.size = mpi_comm.Get_size() if mpi_comm is not None else 1
        self.local_rank = mpi_comm.Split_type(_mpi().COMM_TYPE_SHARED).Get_rank() if mpi_comm is not None else 0
        self.timeout = timeout
        self._count = 0  # collectives so far: every rank must call the same ones in the same order

    @property
    def is_main(self) -> bool:
        """Rank 0: the one that writes logs, metrics, plots and checkpoints."""
        return self.rank == 0

    # -- the watch ---------------------------------------------------------------------------------------
    def abort(self, message: str) -> NoReturn:
        """End every process of the job, saying why (MPI_Abort; a lone process just exits)."""
        print(f"barerl: rank {self.rank} of {self.size}: {message}", file=sys.stderr, flush=True)
        if self.mpi_comm is not None:
            self.mpi_comm.Abort(1)
        os._exit(1)

    def wait(self, done: Callable[[], bool], what: str, absent: Callable[[], list[int]]) -> None:
        """Poll `done` until it is true; past the timeout, abort naming the ranks `absent` lists."""
        start, pause = time.monotonic(), 0.0
        while not done():
            if time.monotonic() - start > self.timeout:
                ranks = absent()
                self.abort(f"{what}: no word from rank{'s' * (len(ranks) > 1)} {', '.join(map(str, ranks))} "
                           f"for {self.timeout:g} s (ddp_timeout): dead or hung; ending the job")
            time.sleep(pause)
            pause = min(1e-3, pause * 2 or 1e-5)  # at most a millisecond late

    def arrive(self, what: str) -> None:
        """Return once every rank has reached this collective (see the module docstring)."""
        self._count += 1
        if self.size == 1:
            return
        comm, mine = self.mpi_comm, (self._count, what)
        if self.rank == 0:
            pending = {r: comm.irecv(source=r, tag=_ARRIVE) for r in range(1, self.size)}
            reports = {}

            def all_in() -> bool:
                for r, request in list(pending.items()):
                    ok, report = request.test()
                    if ok:
                        reports[r] = report
                        del pending[r]
                return not pending

            self.wait(all_in, what, lambda: sorted(pending))
            strays = {r: report for r, report in reports.items() if tuple(report) != mine}
            if strays:
                self.abort(f"ranks took different paths: rank 0 is at collective {mine[0]} ({what}), "
                           + ", ".join(f"rank {r} at {c} ({w})" for r, (c, w) in sorted(strays.items())))
            for r in range(1, self.size):
                comm.send(None, dest=r, tag=_GO)
        else:
            report = comm.isend(mine, dest=0, tag=_ARRIVE)
            go = comm.irecv(source=0, tag=_GO)
            self.wait(lambda: go.test()[0], what, lambda: [0])
            report.wait()

    # -- collectives on Python objects -------------------------------------------------------------------
    def allgather(self, obj: Any, what: str) -> list:
        """Every rank's `obj`, in rank order, on every rank."""
        self.arrive(what)
        return [obj] if self.size == 1 else self.mpi_comm.allgather(obj)

    def broadcast(self, obj: Any, what: str) -> Any:
        """Rank 0's `obj` on every rank."""
        self.arrive(what)
        return obj if self.size == 1 else self.mpi_comm.bcast(obj, root=0)

    def on_main(self, fn: Callable[[], Any], what: str) -> Any:
        """fn() on rank 0 alone; its result, or its error, on every rank."""
        outcome = None
        if self.is_main:
            try:
                outcome = (True, fn())
            except Exception as e:  # noqa: BLE001 -- passed on, and raised on every rank
                outcome = (False, e)
        ok, value = self.broadcast(_picklable(outcome), what)
        if not ok:
            raise value
        return value

    def gather_to_main(self, parts: list, what: str) -> list[list] | None:
        """Every rank's list of NumPy arrays, on rank 0 (None elsewhere), array by array so that no MPI
        message carries more than one of them."""
        self.arrive(what)
        if self.size == 1:
            return [parts]
        counts = self.mpi_comm.allgather(len(parts))
        if not self.is_main:
            for array in parts:
                self.mpi_comm.send(array, dest=0, tag=_GATHER)
            return None
        return [parts] + [[self.mpi_comm.recv(source=r, tag=_GATHER) for _ in range(counts[r])]
                          for r in range(1, self.size)]

    def select_gpu(self) -> int:
        """Make the local rank's GPU CuPy's current device; returns its index."""
        import cupy

        device = self.local_rank % cupy.cuda.runtime.getDeviceCount()
        cupy.cuda.Device(device).use()
        return device


def _picklable(outcome):
    """An error that cannot cross to the other ranks goes as a RuntimeError with its message."""
    ok, value = outcome if outcome is not None else (True, None)
    if not ok:
        try:
            pickle.dumps(value)
        except Exception:  # noqa: BLE001 -- any pickling failure
            value = RuntimeError(f"{type(value).__name__}: {value}")
    return ok, value


def _launched_size() -> int:
    for name in _SIZE_VARIABLES:
        value = os.environ.get(name, "")
        if value.isdigit():
            return int(value)
    return 1


def _mpi():
    from mpi4py import MPI

    return MPI


@functools.cache
def process_group() -> ProcessGroup:
    """The job's process group: MPI's when a launcher started several processes, else one process alone."""
    if _launched_size() <= 1:
        return ProcessGroup()
    try:
        MPI = _mpi()
    except ImportError:
        raise RuntimeError(f"this process is one of {_launched_size()} started by an MPI launcher, but mpi4py is "
                           "not installed: pip install 'barerl[mpi]' (or run a single process)") from None
    return ProcessGroup(MPI.COMM_WORLD)
