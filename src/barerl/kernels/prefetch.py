"""L2 prefetch of a device array (csrc/prefetch.cu): a hint that costs one short kernel and waits for nothing."""

from __future__ import annotations

import numpy as np

from barerl.kernels.build import load_kernel

_THREADS = 128
_ENABLED = False  # off until measured on the H200 (a device call hit an illegal instruction with it on)
_CHUNK = 1 << 15  # the kernel's bytes per bulk prefetch


def prefetch_l2(x) -> None:
    """Ask L2 to fetch x's bytes (a contiguous array) ahead of its use; returns at once, changes nothing."""
    if not _ENABLED:
        return
    start = x.data.ptr & ~15  # the bulk prefetch wants 16-byte aligned ranges: widen to them
    end = (x.data.ptr + x.nbytes + 15) & ~15
    chunks = -(-(end - start) // _CHUNK)
    kernel = load_kernel("prefetch.cu", "prefetch_l2")
    kernel((-(-chunks // _THREADS),), (_THREADS,), (np.uint64(start), np.int64(end - start)))
