"""Bucketed collectives over a flat buffer laid out as a `ShardLayout`, on any communicator.

- `reduce_scatter(comm, layout, flat)`: every rank's flat buffer summed, each rank getting its own shard of
  the sum (in place, in its shard of `flat`; the rest of `flat` keeps that rank's local values). Per bucket,
  each rank sends every peer that peer's piece and receives the N pieces of its own, which it adds in the
  fixed tree over ranks (`tree_sum`): the bits do not depend on the transport, and with the ranks'
  shares being subtrees of the micro-batch tree (`layout.rank_blocks`) they are one rank's bits.
- `all_gather(comm, layout, flat)`: each rank's shard to every rank (in place), bucket by bucket; any dtype.
- An all-reduce is the two in a row: the same traffic as a ring all-reduce (each rank sends and receives
  (N - 1) / N of the buffer twice).

Staging holds one bucket (N pieces) at a time. On the GPU the buckets are enqueued one after the other on
the current stream and waited for once at the end (`synchronize`): NCCL's transfers of bucket k + 1 wait
for bucket k's additions only through the stream order, which is cheap next to the transfers.
"""

from __future__ import annotations

import numpy as np

from barerl.distributed.layout import ShardLayout, tree_sum


def _add_into(a, b) -> None:
    a += b


def reduce_scatter(comm, layout: ShardLayout, flat, what: str = "gradient reduce-scatter") -> None:
    xp = xp_of(flat)
    me, ranks = comm.rank, range(layout.num_ranks)
    staging = xp.empty((layout.num_ranks, layout.piece), flat.dtype)
    for bucket in range(layout.num_buckets):
        mine = layout.piece_of(me, bucket)
        count = mine.stop - mine.start
        parts = [staging[r, :count] for r in ranks]
        comm.exchange([flat[layout.piece_of(r, bucket)] for r in ranks], parts, what)
        if count:
            flat[mine] = tree_sum(parts, _add_into)
    comm.synchronize(what)


def all_gather(comm, layout: ShardLayout, flat, what: str = "weight all-gather") -> None:
    me, ranks = comm.rank, range(layout.num_ranks)
    for bucket in range(layout.num_buckets):
        mine = flat[layout.piece_of(me, bucket)]
        comm.exchange([None if r == me else mine for r in ranks],
                      [None if r == me else flat[layout.piece_of(r, bucket)] for r in ranks], what)
    comm.synchronize(what)


def xp_of(array):
    """NumPy for a NumPy array, else CuPy."""
    if isinstance(array, np.ndarray):
        return np
    import cupy

    return cupy
