"""One decode step's inputs turned into the next step's on the device (a CUDA graph holds several steps).

The conventions every op follows (packing, fp32 arithmetic, accumulated gradients) are `barerl.ops.ref`'s.
"""

from __future__ import annotations

from barerl.ops.common import xp_of

__all__ = ["advance_decode"]


def advance_decode(tokens, input_ids, positions, context_lens, slot_mapping, counters, block_tables, block_size):
    """Turn one decode step's inputs (one token per sequence, in place) into the next step's, on the device:
    each live row (slot >= 0) feeds its sampled token back, moves to the next position and cache slot
    (block_tables (S, max_blocks) must already hold that block) and draws its next sample with counter + 1.
    Padding rows (slot -1) stay as they are. Elementwise, no host round trip: a CUDA graph can hold
    several decode steps."""
    xp = xp_of(positions)
    live = slot_mapping >= 0
    next_positions = positions + 1
    column = xp.where(live, next_positions // block_size, 0)
    block = block_tables[xp.arange(positions.shape[0]), column]
    input_ids[...] = xp.where(live, tokens.astype(input_ids.dtype), input_ids)
    slot_mapping[...] = xp.where(live, block * block_size + next_positions % block_size, -1)
    positions[...] = xp.where(live, next_positions, positions)
    context_lens[...] = xp.where(live, context_lens + 1, context_lens)
    counters[...] = xp.where(live, counters + 1, counters)
