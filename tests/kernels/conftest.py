"""Fixtures of the kernel tests: skip GPU tests without cupy/GPU, a fresh random `draw` per test.

The comparison helpers (poisoned outputs, fp32 twins, error reports, tolerances) are in kernel_harness.py.
"""

from __future__ import annotations

import os

import pytest
from kernel_harness import Draw


def _gpu_available() -> bool:
    try:
        import cupy
    except ImportError:
        return False
    try:
        return cupy.cuda.runtime.getDeviceCount() > 0
    except cupy.cuda.runtime.CUDARuntimeError:
        return False


def pytest_collection_modifyitems(config, items):
    if _gpu_available():
        return
    skip = pytest.mark.skip(reason="needs cupy and a CUDA GPU")
    for item in items:
        if "gpu" in item.keywords:
            item.add_marker(skip)


@pytest.fixture
def draw():
    seed = int.from_bytes(os.urandom(4), "little")
    print(f"random seed {seed}")
    return Draw(seed)
