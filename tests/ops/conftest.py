"""Fixtures of the kernel tests: a fresh random `draw` per test.

The comparison helpers (poisoned outputs, fp32 twins, error reports, tolerances) are in kernel_harness.py.
"""

from __future__ import annotations

import os

import pytest
from kernel_harness import Draw


@pytest.fixture
def draw():
    seed = int.from_bytes(os.urandom(4), "little")
    print(f"random seed {seed}")
    return Draw(seed)
