"""Helpers for kernel-vs-reference tests: fresh random inputs, poisoned outputs, error reports.

Imported by the tests (`from kernel_harness import ...`); the fixtures live in conftest.py.

Every GPU test compares a `ops.cuda` op with its twin in `ops.ref` run on fp32 copies of the same
inputs (on CuPy, so the oracle is fast), and reports max abs and relative error per tensor. Relative error is
||out - ref|| / ||ref|| in fp64; NaN never passes. Inputs are drawn fresh for every test (a new seed per call,
printed on failure), never zeros.
"""

from __future__ import annotations

import importlib
import os

import ml_dtypes
import numpy as np

BF16 = np.dtype(ml_dtypes.bfloat16)
FP16 = np.dtype(np.float16)
FP32 = np.dtype(np.float32)
DTYPES = [BF16, FP16, FP32]

# dtype of the kernel's inputs/outputs -> relative-error tolerance against the fp32 reference
TOLERANCE = {FP32: 1e-5, FP16: 2e-3, BF16: 1e-2}

_NAN_BITS = {2: 0x7FC0, 4: 0x7FC00000}  # NaN in bf16 and in fp16 (0x7FC0 is both), and in fp32
_UINT = {2: np.uint16, 4: np.uint32}


class Draw:
    """Fresh random device arrays for one test; the seed is printed so a failure can be replayed."""

    def __init__(self, seed: int) -> None:
        self.seed = seed
        self.rng = np.random.default_rng(seed)

    def normal(self, shape, dtype, scale: float = 1.0):
        import cupy

        host = (self.rng.standard_normal(shape) * scale).astype(np.float32)
        return cupy.asarray(host.astype(dtype))

    def uniform(self, shape, dtype, low: float, high: float):
        import cupy

        return cupy.asarray(self.rng.uniform(low, high, shape).astype(np.float32).astype(dtype))

    def integers(self, shape, high: int, low: int = 0):
        import cupy

        return cupy.asarray(self.rng.integers(low, high, shape).astype(np.int32))


def poisoned(shape, dtype):
    """A device array filled with NaN: any element a kernel forgets to write fails the comparison."""
    import cupy

    dtype = np.dtype(dtype)
    out = cupy.empty(shape, dtype)
    out.view(_UINT[dtype.itemsize]).fill(_NAN_BITS[dtype.itemsize])
    return out


def poison(array) -> None:
    """Fill an existing device array with NaN in place."""
    array.view(_UINT[array.dtype.itemsize]).fill(_NAN_BITS[array.dtype.itemsize])


def f32(x):
    """An fp32 device copy of a device array (through the host, whatever its dtype); ints are kept."""
    import cupy

    host = cupy.asnumpy(x)
    return cupy.asarray(host if host.dtype.kind in "iu" else host.astype(np.float32))


def errors(out, ref) -> tuple[float, float]:
    """(max abs error, relative error ||out - ref|| / ||ref||) in fp64; NaN anywhere gives NaN."""
    import cupy

    o = cupy.asnumpy(out).astype(np.float64)
    r = cupy.asnumpy(ref).astype(np.float64)
    assert o.shape == r.shape, f"shape {o.shape} != reference {r.shape}"
    diff = o - r
    max_abs = float(np.abs(diff).max()) if diff.size else 0.0
    norm = float(np.linalg.norm(r))
    rel = float(np.linalg.norm(diff)) / norm if norm > 0 else float(np.linalg.norm(diff))
    return max_abs, rel


def assert_close(name: str, out, ref, dtype, tol: float | None = None) -> None:
    """Check one tensor against its reference at the dtype's tolerance; print both errors."""
    tol = TOLERANCE[np.dtype(dtype)] if tol is None else tol
    max_abs, rel = errors(out, ref)
    print(f"{name}: max abs {max_abs:.3e}, rel {rel:.3e} (tol {tol:.0e})")
    if os.environ.get("BARERL_ERROR_LOG"):  # bench/gpu_run.sh stage tests collects every comparison
        test = os.environ.get("PYTEST_CURRENT_TEST", "?").split(" ")[0]
        with open(os.environ["BARERL_ERROR_LOG"], "a") as log:
            log.write(f"{test}\t{name}\t{max_abs:.3e}\t{rel:.3e}\t{tol:.0e}\n")
    assert np.isfinite(rel), f"{name}: NaN or inf in the output (unwritten or overflowed elements)"
    assert rel < tol, f"{name}: relative error {rel:.3e} over {tol:.0e} (max abs {max_abs:.3e})"


def assert_same_bits(name: str, out, ref) -> None:
    """Check one tensor equals its reference bit for bit (NaN included: poisoned rows must stay poisoned)."""
    import cupy

    same_kind = out.dtype == ref.dtype and out.shape == ref.shape
    assert same_kind, f"{name}: {out.dtype} {out.shape} != reference {ref.dtype} {ref.shape}"
    bits = _UINT[out.dtype.itemsize]
    mismatches = int((cupy.asarray(out).view(bits) != cupy.asarray(ref).view(bits)).sum())
    print(f"{name}: {mismatches} mismatching elements of {out.size}")
    assert mismatches == 0, f"{name}: {mismatches} elements differ from the reference"


def cu_seqlens(lengths):
    """Device int32 (S+1,) boundaries and (T,) positions of packed sequences with these lengths."""
    import cupy

    cu = np.concatenate([[0], np.cumsum(lengths)]).astype(np.int32)
    positions = np.concatenate([np.arange(n) for n in lengths]).astype(np.int32)
    return cupy.asarray(cu), cupy.asarray(positions)


def launcher(family: str):
    """The module `barerl.ops.cuda.<family>` (its launchers and launch rules). `from barerl.ops.cuda import
    attention` gives the op of that name, which the package exports, not the module."""
    return importlib.import_module(f"barerl.ops.cuda.{family}")
