"""safetensors files in and out, our own reader and writer.

The format is an 8-byte little-endian header length, a JSON header (name -> dtype, shape, byte range) and the
raw data; the `safetensors` package's NumPy frontend cannot read bf16, and writing needs no more than
`f.write`. Reading memory-maps the file, so a tensor's bytes are touched only when it is copied somewhere:
loading never holds a second full copy of a model. Every header is validated before any data is read
(offsets inside the file, sizes matching shapes, known dtypes); errors are `CheckpointError`s naming the file
and the tensor.
"""

from __future__ import annotations

import json
import math
import os
import struct
from collections.abc import Iterable

import ml_dtypes
import numpy as np

from barerl.formats import CheckpointError

DTYPES = {"float32": np.dtype(np.float32), "bfloat16": np.dtype(ml_dtypes.bfloat16), "float16": np.dtype(np.float16)}
_ST_TO_NUMPY = {"F32": np.dtype(np.float32), "F16": np.dtype(np.float16),
                "BF16": np.dtype(ml_dtypes.bfloat16), "F64": np.dtype(np.float64)}
_NUMPY_TO_ST = {v: k for k, v in _ST_TO_NUMPY.items()}
_MAX_HEADER_BYTES = 100 * 1024 * 1024  # the limit the reference implementation enforces


def resolve_dtype(dtype) -> np.dtype:
    """'float32' | 'bfloat16' | 'float16' (or the NumPy dtype itself) -> np.dtype."""
    name = dtype if isinstance(dtype, str) else np.dtype(dtype).name
    if name not in DTYPES:
        raise ValueError(f"dtype must be one of {sorted(DTYPES)}, got {dtype!r}")
    return DTYPES[name]


def to_host(a) -> np.ndarray:
    """A NumPy or CuPy array on the host (NumPy arrays as they are)."""
    return a.get() if type(a).__module__.startswith("cupy") else np.asarray(a)


def read_safetensors(path: str) -> dict[str, np.ndarray]:
    """All tensors of one safetensors file as read-only memory-mapped arrays (nothing is read yet)."""
    header, data_start = _read_header(path)
    data = np.memmap(path, dtype=np.uint8, mode="r") if header else None
    tensors = {}
    for name, (dtype, shape, begin, end) in header.items():
        tensors[name] = data[data_start + begin : data_start + end].view(dtype).reshape(shape)
    return tensors


def _read_header(path: str) -> tuple[dict[str, tuple], int]:
    """Validated header: name -> (dtype, shape, begin, end) with byte offsets into the data section."""
    size = os.path.getsize(path)
    with open(path, "rb") as f:
        prefix = f.read(8)
        if len(prefix) < 8:
            raise CheckpointError(f"{path}: {size} bytes is too short to be a safetensors file")
        (n,) = struct.unpack("<Q", prefix)
        if n > min(size - 8, _MAX_HEADER_BYTES):
            raise CheckpointError(f"{path}: header length {n} does not fit in a {size}-byte file "
                                  "(truncated, or not a safetensors file)")
        raw = f.read(n)
    try:
        header = json.loads(raw)
    except ValueError as e:
        raise CheckpointError(f"{path}: header is not valid JSON ({e}); the file is corrupt") from None
    if not isinstance(header, dict):
        raise CheckpointError(f"{path}: header is not a JSON object; the file is corrupt")
    data_len = size - 8 - n
    return {name: _parse_entry(path, name, entry, data_len)
            for name, entry in header.items() if name != "__metadata__"}, 8 + n


def _parse_entry(path: str, name: str, entry, data_len: int) -> tuple:
    def bad(why: str) -> CheckpointError:
        return CheckpointError(f"{path}: tensor '{name}': {why}")

    if not isinstance(entry, dict):
        raise bad(f"header entry is {entry!r}, expected an object")
    st_dtype, shape, offsets = entry.get("dtype"), entry.get("shape"), entry.get("data_offsets")
    if st_dtype not in _ST_TO_NUMPY:
        raise bad(f"dtype {st_dtype!r} is not supported (supported: {', '.join(_ST_TO_NUMPY)})")
    if not (isinstance(shape, list) and all(isinstance(d, int) and d >= 0 for d in shape)):
        raise bad(f"shape {shape!r} is not a list of non-negative integers")
    if not (isinstance(offsets, list) and len(offsets) == 2 and all(isinstance(o, int) for o in offsets)):
        raise bad(f"data_offsets {offsets!r} is not a pair of integers")
    begin, end = offsets
    dtype = _ST_TO_NUMPY[st_dtype]
    if not 0 <= begin <= end:
        raise bad(f"data_offsets {offsets} are not an increasing byte range")
    if end > data_len:
        raise bad(f"data ends at byte {end} but the file holds only {data_len} bytes of data (truncated?)")
    if end - begin != math.prod(shape) * dtype.itemsize:
        raise bad(f"{end - begin} bytes of data do not match shape {shape} of {st_dtype}")
    return dtype, tuple(shape), begin, end


def write_safetensors(path: str, tensors: Iterable[tuple[str, object]], dtype=None,
                      metadata: dict[str, str] | None = None) -> int:
    """Write (name, array) pairs (NumPy or CuPy) as one safetensors file; returns the data size in bytes.

    Arrays are cast to `dtype` (default: their own) and copied to the host one at a time.
    """
    tensors = list(tensors)
    header: dict[str, object] = {"__metadata__": {"format": "pt", **(metadata or {})}}
    pos = 0
    for name, a in tensors:
        dt = resolve_dtype(dtype) if dtype is not None else np.dtype(a.dtype)
        if dt not in _NUMPY_TO_ST:
            raise ValueError(f"{path}: tensor '{name}': cannot store {dt} (supported: {', '.join(_ST_TO_NUMPY)})")
        nbytes = math.prod(a.shape) * dt.itemsize
        header[name] = {"dtype": _NUMPY_TO_ST[dt], "shape": list(a.shape), "data_offsets": [pos, pos + nbytes]}
        pos += nbytes
    raw = json.dumps(header, separators=(",", ":")).encode()
    raw += b" " * (-len(raw) % 8)  # data starts 8-byte aligned, as the reference writer does
    with open(path, "wb") as f:
        f.write(struct.pack("<Q", len(raw)) + raw)
        for name, a in tensors:
            host = np.ascontiguousarray(to_host(a), dtype=_ST_TO_NUMPY[header[name]["dtype"]])
            f.write(memoryview(host.reshape(-1).view(np.uint8)))
    return pos


def stored_dtype_name(array) -> str:
    """safetensors' name of an array's dtype ('BF16', 'F32', ...)."""
    return _NUMPY_TO_ST[np.dtype(array.dtype)]
