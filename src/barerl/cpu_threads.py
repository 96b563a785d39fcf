"""The host BLAS's thread count (NumPy's OpenBLAS) while barerl computes on the CPU.

Finding (docs/LOG.md, 2026-12-01): OpenBLAS splits every product above 64^3 multiply-adds over all cores, and
its threads wait for each other, spinning, at the end of each product. When anything else holds a core (the
loop's own Python work, GRPO's reward thread or workers, another job), each product waits for a scheduler
time slice: on the 2-core machine a GRPO step of SmolLM2-135M took 2-5x the time and twice the CPU time of
the same step on one thread, products of 8 rows (decoding) 12x the time. So the engine (`LLM.generate`) and
the training loops run the BLAS on one thread fewer than the cores the process may use (a core for Python),
at least one: `cpu_blas_threads`. A count the user set (OPENBLAS_NUM_THREADS, OMP_NUM_THREADS) is kept.

Control goes through OpenBLAS's own functions, found with ctypes in the process's loaded libraries (as
threadpoolctl does): NumPy's wheels bundle `scipy_openblas` (symbols prefixed `scipy_`), a system NumPy
links `libopenblas`. Elsewhere (MKL, Accelerate, no /proc) `blas_threads` changes nothing.
"""

from __future__ import annotations

import ctypes
import functools
import os
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


def cpu_blas_threads():
    """Context manager running barerl's CPU work on `max(1, cores - 1)` BLAS threads, unless
    the user set the count in the environment (then nothing changes)."""
    if any(os.environ.get(name) for name in ("OPENBLAS_NUM_THREADS", "OMP_NUM_THREADS")):
        return blas_threads(None)
    cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else (os.cpu_count() or 1)
    return blas_threads(max(1, cores - 1))


def on_cpu_blas_threads(fn):
    """Decorator: `fn` runs within `cpu_blas_threads()` (the count decided at each call)."""

    @functools.wraps(fn)
    def wrapper(*args, **kwargs):
        with cpu_blas_threads():
            return fn(*args, **kwargs)

    return wrapper


@contextmanager
def blas_threads(count: int | None):
    """Run the body with the host BLAS on `count` threads (None: as it is); the previous count comes back."""
    functions = _openblas() if count is not None else None
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
