"""The host BLAS's thread count (NumPy's OpenBLAS), set for one phase of work.

Finding (docs/LOG.md, 2026-12-01): OpenBLAS splits every product above 64^3 multiply-adds over all cores, and
its threads wait for each other at the end of each product. A decode step on the CPU is ~120 products of a
few rows each; whenever another thread or process holds a core (GRPO's reward thread or workers, another
job), each of them waits for a scheduler time slice, spinning: on a 2-core machine the products of 8 rows
took 12x the time and 19x the CPU time on two threads. Those products are memory-bound, so the engine runs
them on one thread (`LLM.generate`); training's large products keep every core.

Control goes through OpenBLAS's own functions, found with ctypes in the process's loaded libraries (as
threadpoolctl does): NumPy's wheels bundle `scipy_openblas` (symbols prefixed `scipy_`), a system NumPy
links `libopenblas`. Elsewhere (MKL, Accelerate, no /proc) `blas_threads` changes nothing.
"""

from __future__ import annotations

import ctypes
import functools
from contextlib import contextmanager

_PREFIXES = ("scipy_openblas", "openblas")
_SUFFIXES = ("64_", "_64_", "")


@functools.lru_cache(maxsize=1)
def _openblas():
    """(get_num_threads, set_num_threads) of the loaded OpenBLAS, or None."""
    import numpy  # noqa: F401 -- loads its BLAS

    try:
        with open("/proc/self/maps", encoding="utf-8") as f:
            paths = {line.split()[-1] for line in f if "openblas" in line.lower() and ".so" in line}
    except OSError:
        return None
    for path in sorted(paths):
        library = ctypes.CDLL(path)
        for prefix in _PREFIXES:
            for suffix in _SUFFIXES:
                get = getattr(library, f"{prefix}_get_num_threads{suffix}", None)
                set_ = getattr(library, f"{prefix}_set_num_threads{suffix}", None)
                if get is not None and set_ is not None:
                    get.restype, set_.argtypes = ctypes.c_int, [ctypes.c_int]
                    return get, set_
    return None


def blas_num_threads() -> int | None:
    """The BLAS's thread count now, or None when it cannot be told."""
    functions = _openblas()
    return None if functions is None else functions[0]()


@contextmanager
def blas_threads(count: int):
    """Run the body with the host BLAS on `count` threads; the previous count comes back after it."""
    functions = _openblas()
    if functions is None:
        yield
        return
    get, set_ = functions
    previous = get()
    set_(count)
    try:
        yield
    finally:
        set_(previous)
