"""advance_decode (ops/cuda/advance_decode.py) against ops.ref.advance_decode: identical next-step inputs."""

from __future__ import annotations

import numpy as np
import pytest

from barerl.ops import ref

pytestmark = pytest.mark.gpu


@pytest.mark.parametrize("rows", [1, 7, 64, 300])
@pytest.mark.parametrize("block_size", [16, 256])
def test_advance_decode(draw, rows, block_size):
    """Positions just before, at and past block boundaries; padding rows (slot -1) untouched."""
    import cupy

    from barerl.ops import cuda

    rng = draw.rng
    max_blocks = 6
    positions = rng.integers(0, max_blocks * block_size - 1, rows).astype(np.int32)
    positions[: rows // 3] = (rng.integers(1, max_blocks, rows // 3) * block_size - 1).astype(np.int32)
    tables = rng.permutation(rows * max_blocks).astype(np.int32).reshape(rows, max_blocks)
    slots = (tables[np.arange(rows), positions // block_size] * block_size + positions % block_size).astype(np.int32)
    slots[rng.random(rows) < 0.25] = -1
    host = {
        "tokens": rng.integers(0, 50_000, rows).astype(np.int32),
        "input_ids": rng.integers(0, 50_000, rows).astype(np.int32),
        "positions": positions,
        "context_lens": (positions + 1).astype(np.int32),
        "slot_mapping": slots,
        "counters": rng.integers(0, 1 << 40, rows).astype(np.int64),
        "block_tables": tables,
    }
    names = ("tokens", "input_ids", "positions", "context_lens", "slot_mapping", "counters", "block_tables")
    got = {k: cupy.asarray(v) for k, v in host.items()}
    want = {k: cupy.asarray(v) for k, v in host.items()}
    cuda.advance_decode(*(got[k] for k in names), block_size)
    ref.advance_decode(*(want[k] for k in names), block_size)
    for name in names:
        np.testing.assert_array_equal(got[name].get(), want[name].get(), err_msg=name)
