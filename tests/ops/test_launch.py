"""Launch helpers that need no GPU."""

from __future__ import annotations

from barerl.ops.cuda import launch


def test_shared_memory_limit_only_grows(monkeypatch):
    class Kernel:
        max_dynamic_shared_size_bytes = 0
        sets = 0

        def __setattr__(self, name, value):
            object.__setattr__(self, "sets", self.sets + 1)
            object.__setattr__(self, name, value)

    monkeypatch.setattr(launch, "current_device", lambda: 0)
    kernel = Kernel()
    for nbytes in (64 << 10, 96 << 10, 64 << 10, 96 << 10):  # two shapes alternating, layer after layer
        assert launch.reserve_shared_memory(kernel, nbytes) == nbytes
    assert kernel.max_dynamic_shared_size_bytes == 96 << 10
    assert kernel.sets == 2


def test_shared_memory_limit_is_raised_on_each_device(monkeypatch):
    class Kernel:
        max_dynamic_shared_size_bytes = 0

    kernel = Kernel()
    for device in (0, 1):  # a CuPy kernel holds one function per device, each with its own limit
        monkeypatch.setattr(launch, "current_device", lambda device=device: device)
        kernel.max_dynamic_shared_size_bytes = 0  # the new device's function: not raised yet
        launch.reserve_shared_memory(kernel, 96 << 10)
        assert kernel.max_dynamic_shared_size_bytes == 96 << 10
