"""The global gradient norm, with the same bits whether one rank holds every gradient or each rank one shard.

The buffer is cut into blocks of `layout.grain` elements from element 0 (shards never cut a block: their
sizes are multiples of the grain). Each block's sum of squares is taken in fp64 (a square of an fp32 value
is exact in fp64; the block's sum is NumPy's / CuPy's fixed-order reduction of one contiguous row), the
blocks' sums come to the host, and `math.fsum` adds them exactly, so the total is the correctly rounded sum
of the blocks' sums whatever rank computed which block and in what order they arrive. A few thousand
blocks at most (`layout.MAX_NORM_BLOCKS`), so the host part is cheap; on the GPU the blocks' sums are one
extra pass over the gradients.
"""

from __future__ import annotations

import math

import numpy as np

from barerl.distributed.collectives import xp_of
from barerl.distributed.group import ProcessGroup
from barerl.distributed.layout import ShardLayout

ROWS_PER_PASS = 1 << 22  # elements squared at once (bounds the fp64 temporary: 32 MiB)


def block_sums_of_squares(flat, start: int, stop: int, grain: int) -> np.ndarray:
    """fp64 sums of squares of the grain-sized blocks of flat[start:stop] (start a multiple of grain; the
    last block may be shorter), on the host."""
    part = flat[start:stop]
    whole = (part.shape[0] // grain) * grain
    step = max(grain, ROWS_PER_PASS // grain * grain)
    sums = []
    for first in range(0, whole, step):
        rows = part[first : min(first + step, whole)].reshape(-1, grain).astype(np.float64)
        sums.append((rows * rows).sum(axis=1))
    if whole < part.shape[0]:
        tail = part[whole:].astype(np.float64)
        sums.append((tail * tail).sum(keepdims=True))
    if not sums:
        return np.zeros(0, np.float64)
    xp = xp_of(part)
    joined = xp.concatenate(sums)
    return joined if xp is np else joined.get()


def gradient_norm(flat, layout: ShardLayout, group: ProcessGroup, sharded: bool) -> float:
    """L2 norm of the job's gradient: `flat` holds all of it (sharded False) or, reduced, this rank's shard
    of it (sharded True: the blocks' sums of all shards are gathered)."""
    if sharded and group.size > 1:
        shard = layout.shard(group.rank)
        mine = block_sums_of_squares(flat, shard.start, shard.stop, layout.grain)
        sums = np.concatenate(group.allgather(mine, "gradient norm"))
    else:
        sums = block_sums_of_squares(flat, 0, flat.shape[0], layout.grain)
    if not np.isfinite(sums).all():
        return float("nan") if np.isnan(sums).any() else float("inf")
    return math.sqrt(math.fsum(sums.tolist()))
