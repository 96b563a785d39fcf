"""Launch helpers that need no GPU."""

from __future__ import annotations

from barerl.kernels import launch


def test_shared_memory_limit_only_grows():
    class Kernel:
        max_dynamic_shared_size_bytes = 0
        sets = 0

        def __setattr__(self, name, value):
            object.__setattr__(self, "sets", self.sets + 1)
            object.__setattr__(self, name, value)

    kernel = Kernel()
    for nbytes in (64 << 10, 96 << 10, 64 << 10, 96 << 10):  # two shapes alternating, layer after layer
        assert launch.reserve_shared_memory(kernel, nbytes) == nbytes
    assert kernel.max_dynamic_shared_size_bytes == 96 << 10
    assert kernel.sets == 2
