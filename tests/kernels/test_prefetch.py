"""prefetch_l2 (kernels/prefetch.py): a hint on any range, unaligned and odd-sized ones included, that leaves
every byte as it was, and is captured into a CUDA graph like any kernel."""

from __future__ import annotations

import pytest
from kernel_harness import BF16, assert_same_bits

pytestmark = pytest.mark.gpu


@pytest.fixture(autouse=True)
def enabled(monkeypatch):
    from barerl.kernels import prefetch

    monkeypatch.setattr(prefetch, "_ENABLED", True)


@pytest.mark.parametrize("start, size", [(0, 1), (3, 1000), (1, 5_000_001), (0, 16 * 1024 * 1024)])
def test_prefetch_changes_nothing(draw, start, size):
    import cupy

    from barerl.backend import cuda

    data = draw.normal((start + size,), BF16)
    before = data.copy()
    cuda.prefetch_l2(data[start:])
    cupy.cuda.Device().synchronize()
    assert_same_bits("data", data, before)


def test_prefetch_in_a_graph(draw):
    import cupy

    from barerl.backend import cuda

    data = draw.normal((1 << 20,), BF16)
    stream = cupy.cuda.Stream(non_blocking=True)
    with stream:
        stream.begin_capture()
        cuda.prefetch_l2(data)
        graph = stream.end_capture()
        graph.launch(stream)
    stream.synchronize()
