"""Where each rank's share of a flat buffer and of a list of micro-batches lies, and the fixed tree in which
partial sums meet.

- The tree: n partial sums add up as (sum of the first ceil(n / 2)) + (sum of the rest), recursively. Its
  shape depends on n alone, so a sum computed as subtrees on several ranks and joined across them has the
  bits of the sum computed on one rank, as long as every rank's share is one subtree.
- `rank_blocks` cuts n items into contiguous blocks, one per rank, by splitting the ranks and the items
  alongside: the first ceil(R / 2) ranks take the first ceil(n * ceil(R / 2) / R) items. For a power-of-two
  number of ranks that is the tree's own split at every level, so each block is a subtree and the ranks'
  partial sums, joined by `tree_sum` over ranks, are the one-rank tree's sum. For other rank counts the
  split follows the ranks (balanced work) and the sum is deterministic, but not the one-rank bits.
- `ShardLayout`: rank r owns elements [r S, (r + 1) S) of a flat buffer of n elements (the last shards may
  be shorter or empty), S a multiple of `grain`, so that the gradient norm's blocks of `grain` elements
  never straddle two shards. Transfers go in buckets: bucket k is the k-th run of `piece` elements of every
  shard, so each bucket moves the same amount between every pair of ranks and bounds the staging memory.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass

MIN_GRAIN = 256  # elements of the smallest norm block
MAX_NORM_BLOCKS = 4096  # the grain grows with the buffer so that a norm sums about this many blocks at most


def left_size(n: int) -> int:
    """How many of n partial sums the tree's left half takes."""
    return (n + 1) // 2


def tree_sum(parts: list, add: Callable[[object, object], None]):
    """Sum of `parts` in the fixed tree, into parts[0]: add(a, b) adds b into a in place."""
    if len(parts) > 1:
        half = left_size(len(parts))
        add(tree_sum(parts[:half], add), tree_sum(parts[half:], add))
    return parts[0]


def rank_blocks(num_items: int, num_ranks: int) -> list[range]:
    """Contiguous blocks of range(num_items), one per rank, each a subtree of the items' tree (module doc)."""
    blocks: list[range] = []

    def split(lo: int, hi: int, first_rank: int, end_rank: int) -> None:
        ranks = end_rank - first_rank
        if ranks == 1:
            blocks.append(range(lo, hi))
            return
        left_ranks = left_size(ranks)
        mid = lo + -(-(hi - lo) * left_ranks // ranks)
        split(lo, mid, first_rank, first_rank + left_ranks)
        split(mid, hi, first_rank + left_ranks, end_rank)

    split(0, num_items, 0, num_ranks)
    return blocks


def norm_grain(num_elements: int) -> int:
    """Elements of one block of the gradient norm: a power of two, a function of the buffer's size alone."""
    return max(MIN_GRAIN, 1 << max(0, math.ceil(math.log2(max(1, num_elements) / MAX_NORM_BLOCKS))))


@dataclass(frozen=True)
class ShardLayout:
    num_elements: int
    num_ranks: int
    grain: int  # shard sizes are multiples of it
    shard_size: int  # elements of every shard but the last ones
    piece: int  # elements of one shard in one bucket

    @classmethod
    def build(cls, num_elements: int, num_ranks: int, bucket_elements: int) -> ShardLayout:
        """bucket_elements: what one bucket holds on the receiving rank, all ranks' pieces together."""
        grain = norm_grain(num_elements)
        shard_size = -(-num_elements // (grain * num_ranks)) * grain
        piece = max(1, min(shard_size, bucket_elements // num_ranks))
        return cls(num_elements, num_ranks, grain, shard_size, piece)

    def shard(self, rank: int) -> slice:
        start = min(rank * self.shard_size, self.num_elements)
        return slice(start, min(start + self.shard_size, self.num_elements))

    @property
    def num_buckets(self) -> int:
        return -(-self.shard_size // self.piece)

    def piece_of(self, rank: int, bucket: int) -> slice:
        """Rank's elements in `bucket`, as a slice of the whole buffer (empty past its shard's end)."""
        shard = self.shard(rank)
        start = min(shard.start + bucket * self.piece, shard.stop)
        return slice(start, min(start + self.piece, shard.stop))
