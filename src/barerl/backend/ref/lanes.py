"""Lanes: independent chains of ops that the GPU may run side by side (the CUDA twin: one stream per lane).

The reference has one queue of work, so its lanes run in the order the ops are issued; the results are the
same as the CUDA backend's, whose lanes overlap. Use:

    lanes = backend.lanes(2)          # both lanes start after the work issued so far
    with lanes.on(0): ...             # ops issued here go to lane 0
    with lanes.on(1):
        lanes.wait(mark)              # lane 1 goes on only after the work `mark` names
        ...
        mark = lanes.mark()           # the work issued so far on this lane
    lanes.join()                      # work issued after this waits for every lane
"""

from __future__ import annotations

from contextlib import nullcontext

__all__ = ["Lanes", "lanes"]


class Lanes:
    """`count` lanes, each starting after the work issued before they were made."""

    def __init__(self, count: int):
        if count < 1:
            raise ValueError(f"lanes: count must be at least 1, got {count}")
        self.count = count

    def on(self, lane: int):
        """A context in which issued ops go to `lane`."""
        self._check(lane)
        return nullcontext()

    def _check(self, lane: int) -> None:
        if not 0 <= lane < self.count:
            raise IndexError(f"lanes: lane {lane} of {self.count}")

    def mark(self) -> object:
        """A token for the work issued so far on the current lane."""
        return None

    def wait(self, mark: object) -> None:
        """Ops issued on the current lane from now on run after the work `mark` stands for."""

    def join(self) -> None:
        """Ops issued after the lanes (outside `on`) run after every lane's work."""


def lanes(count: int) -> Lanes:
    return Lanes(count)
