"""advance_decode on the GPU (csrc/advance_decode.cu): the next decode step's inputs from this step's tokens.

Inside a CUDA graph of several decode steps this runs between every two of them; one kernel replaces the
reference's dozen elementwise CuPy kernels. Other dtypes than the engine's (int32 inputs, int64 counters)
run the reference on the same arrays.
"""

from __future__ import annotations

import numpy as np

from barerl.ops import ref
from barerl.ops.cuda.build import load_kernel
from barerl.ops.cuda.launch import num_blocks

_THREADS = 128
_INT32_ARGS = ("tokens", "input_ids", "positions", "context_lens", "slot_mapping", "block_tables")


def advance_decode(tokens, input_ids, positions, context_lens, slot_mapping, counters, block_tables, block_size):
    """The contract of ops.ref.advance_decode (in place, rows with slot -1 untouched)."""
    arrays = dict(zip(_INT32_ARGS, (tokens, input_ids, positions, context_lens, slot_mapping, block_tables)))
    rows = positions.shape[0]
    covered = (all(a.dtype == np.int32 for a in arrays.values()) and counters.dtype == np.int64
               and all(a.shape == (rows,) for a in (tokens, input_ids, context_lens, slot_mapping, counters))
               and block_tables.ndim == 2 and block_tables.shape[0] == rows and block_tables.flags.c_contiguous)
    if not covered:
        ref.advance_decode(tokens, input_ids, positions, context_lens, slot_mapping, counters, block_tables,
                           block_size)
    elif rows:
        load_kernel("advance_decode.cu", "advance_decode")(
            (num_blocks(rows, _THREADS),), (_THREADS,),
            (tokens, input_ids, positions, context_lens, slot_mapping, counters, block_tables,
             np.int32(block_tables.shape[1]), np.int32(block_size), np.int32(rows)),
        )
