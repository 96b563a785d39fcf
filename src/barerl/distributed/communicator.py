"""Moving arrays between ranks: one interface, `exchange(sends, recvs)`, three implementations.

`sends[p]` goes to rank p and `recvs[p]` is filled from rank p (None or empty: nothing with that peer), all
flat and contiguous; a rank's own pair is a copy. Every collective barerl needs is one exchange per bucket:
a reduce-scatter sends each peer its piece of the gradients and adds the pieces it receives itself, in a
fixed order (`collectives.py`); an all-gather sends one piece to everyone. No reduction runs inside the
transport, so the order of every sum is ours, the same on the CPU and the GPU, and the same whatever
algorithm the transport picks.

- `LocalCommunicator`: one rank; the copy alone.
- `MpiCommunicator`: NumPy arrays, MPI point-to-point (nonblocking sends and receives of bytes, waited for
  under the group's deadline, naming the peers whose data did not come).
- `NcclCommunicator`: CuPy arrays, NCCL's send / recv in one group call on the current stream (an all-to-all
  as NCCL's documentation writes it); the unique id travels over MPI. Exchanges are only enqueued:
  `synchronize` waits for them (polling an event under the deadline), so buckets follow each other on the
  stream without a host round trip. NCCL allows one rank per GPU.
Data moves as bytes, so any dtype (fp32 gradients, bf16 weights) takes the same path.
"""

from __future__ import annotations

import numpy as np

from barerl.distributed.group import ProcessGroup

_EXCHANGE = 7303  # MPI tag


class LocalCommunicator:
    """A job of one rank."""

    def __init__(self, group: ProcessGroup):
        self.group, self.rank, self.size = group, 0, 1

    def exchange(self, sends: list, recvs: list, what: str) -> None:
        if recvs[0] is not None and recvs[0].size:
            recvs[0][...] = sends[0]

    def synchronize(self, what: str) -> None:
        pass


class MpiCommunicator:
    """NumPy arrays over MPI point-to-point messages."""

    def __init__(self, group: ProcessGroup):
        self.group, self.rank, self.size = group, group.rank, group.size
        self.comm = group.mpi_comm

    def exchange(self, sends: list, recvs: list, what: str) -> None:
        from mpi4py import MPI

        receives = [(peer, self.comm.Irecv(_bytes(r), source=peer, tag=_EXCHANGE))
                    for peer, r in enumerate(recvs) if r is not None and r.size]
        requests = [request for _, request in receives]
        requests += [self.comm.Isend(_bytes(s), dest=peer, tag=_EXCHANGE)
                     for peer, s in enumerate(sends) if s is not None and s.size]
        self.group.wait(lambda: MPI.Request.Testall(requests), what,
                        lambda: [peer for peer, request in receives if not request.Test()])

    def synchronize(self, what: str) -> None:
        pass  # every exchange has completed when it returns


class NcclCommunicator:
    """CuPy arrays over NCCL, one communicator for the whole job (one rank per GPU)."""

    def __init__(self, group: ProcessGroup):
        from cupy.cuda import nccl

        self.group, self.rank, self.size = group, group.rank, group.size
        self._nccl = nccl
        unique_id = group.broadcast(nccl.get_unique_id() if group.is_main else None, "NCCL unique id")
        self.comm = nccl.NcclCommunicator(group.size, unique_id, group.rank)

    def exchange(self, sends: list, recvs: list, what: str) -> None:
        import cupy

        nccl, stream = self._nccl, cupy.cuda.get_current_stream().ptr
        nccl.groupStart()
        try:
            for peer, (send, recv) in enumerate(zip(sends, recvs, strict=True)):
                if send is not None and send.size:
                    self.comm.send(send.data.ptr, send.nbytes, nccl.NCCL_UINT8, peer, stream)
                if recv is not None and recv.size:
                    self.comm.recv(recv.data.ptr, recv.nbytes, nccl.NCCL_UINT8, peer, stream)
        finally:
            nccl.groupEnd()

    def synchronize(self, what: str) -> None:
        import cupy

        done = cupy.cuda.get_current_stream().record()
        self.group.wait(lambda: done.done, what, lambda: [r for r in range(self.size) if r != self.rank])


def communicator_for(group: ProcessGroup, device: str):
    """The communicator for arrays on `device` ('cpu': NumPy, 'cuda': CuPy)."""
    if group.size == 1:
        return LocalCommunicator(group)
    return NcclCommunicator(group) if device == "cuda" else MpiCommunicator(group)


def _bytes(array) -> np.ndarray:
    return array.reshape(-1).view(np.uint8)
