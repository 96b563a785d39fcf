"""lanes on the GPU: one CUDA stream per lane, forked from the current stream and joined back by events.

The reference twin (backend/ref/lanes.py) gives the contract. Design decisions:
- Each lane's stream is made once per device and lane index and reused, so a CUDA graph's warm-up and its
  capture issue to the same streams (a capture takes a stream in by its first wait on a captured event).
- While ops are issued on a lane, `launch.concurrent_lanes()` says how many lanes share the GPU, so that
  launchers that size their grids to the SM count (paged attention's split) count only their share of it.
"""

from __future__ import annotations

from contextlib import contextmanager

from barerl.backend.ref.lanes import Lanes as _Contract
from barerl.kernels import launch

_streams: dict[tuple[int, int], object] = {}


def _stream(lane: int):
    import cupy

    key = (cupy.cuda.runtime.getDevice(), lane)
    if key not in _streams:
        _streams[key] = cupy.cuda.Stream(non_blocking=True)
    return _streams[key]


class Lanes(_Contract):
    def __init__(self, count: int):
        import cupy

        super().__init__(count)
        self.origin = cupy.cuda.get_current_stream()
        self.streams = [_stream(i) for i in range(count)]
        start = self.origin.record()
        for stream in self.streams:
            stream.wait_event(start)

    @contextmanager
    def on(self, lane: int):
        self._check(lane)
        with self.streams[lane], launch.sharing_gpu(self.count):
            yield

    def mark(self):
        import cupy

        return cupy.cuda.get_current_stream().record()

    def wait(self, mark) -> None:
        import cupy

        cupy.cuda.get_current_stream().wait_event(mark)

    def join(self) -> None:
        for stream in self.streams:
            self.origin.wait_event(stream.record())


def lanes(count: int) -> Lanes:
    return Lanes(count)
