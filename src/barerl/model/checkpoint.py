"""Hugging Face checkpoints into and out of the model's flat `ParameterBuffer`: config.json + safetensors (single
or sharded), or a GGUF file.

Design decisions:
- The files are `barerl.formats`' business (readers, writers, validation, the atomic writer); this module
  copies tensors into and out of the buffer. Reading memory-maps the files, so a tensor's bytes are touched
  only when it is copied into the flat buffer: loading never holds a second full copy of the model, only one
  tensor in flight (on CuPy, the host copy of one tensor at a time). GGUF tensors are dequantised one at a
  time as they are copied.
- Tensor names are checked against the config before any data is copied (nothing missing, nothing
  unexpected); each shape is checked as its tensor is copied (a GGUF tensor has its shape only once
  dequantised). Errors are `CheckpointError`s naming the file and the tensor; config problems stay
  `ConfigError`s.
- Weights must be finite: a tensor holding NaN or inf is refused as it is copied, naming it. A folder barerl
  wrote as a training checkpoint has its files checked against their recorded checksums first.
- Saving is atomic (formats/atomic.py), and never replaces a folder that is not a checkpoint.
"""

from __future__ import annotations

import dataclasses
import os

import numpy as np

from barerl.config import ModelConfig
from barerl.formats import CheckpointError
from barerl.formats.atomic import atomic_folder
from barerl.formats.checksums import verify_model_files
from barerl.formats.hf_folder import check_names, folder_tensors, write_json, write_weights
from barerl.formats.paths import is_gguf, resolve_model_path
from barerl.formats.safetensors import resolve_dtype
from barerl.model.weights import ParameterBuffer


def load_checkpoint(path: str | os.PathLike, dtype="float32", xp=np,
                    verify: bool = True) -> tuple[ModelConfig, ParameterBuffer]:
    """Load a Hugging Face model folder or a .gguf file into one flat buffer of `dtype` on `xp`. A folder
    barerl wrote as a training checkpoint has its files checked against their recorded checksums first
    (`verify=False`: the caller did)."""
    path = resolve_model_path(path)
    if is_gguf(path):
        from barerl.formats.gguf import read_gguf

        gguf = read_gguf(path)
        cfg = ModelConfig.from_dict(gguf.config, source=path)
        # `gguf.tensors` dequantises on access: it stays lazy, so one fp32 tensor exists at a time
        tensors, file_of, weights_file = gguf.tensors, dict.fromkeys(gguf.tensors, path), path
    else:
        if verify:
            verify_model_files(path)
        cfg = ModelConfig.from_file(os.path.join(path, "config.json"))
        tensors, file_of, weights_file = folder_tensors(path)
    check_names(cfg, tensors, file_of, weights_file)
    params = ParameterBuffer(cfg, xp.empty(cfg.num_parameters(), dtype=resolve_dtype(dtype)))
    for name, view in params:
        array = tensors[name]
        if tuple(array.shape) != view.shape:
            raise CheckpointError(f"{file_of[name]}: tensor '{name}' has shape {tuple(array.shape)}, but the "
                                  f"config implies {view.shape}")
        _check_finite(copy_into(view, array), name, file_of[name])
    return cfg, params


def _check_finite(values: np.ndarray, name: str, file: str) -> None:
    """NaN or inf weights make NaN logits, from which sampling returns token 0 as if nothing were wrong."""
    if not np.isfinite(values).all():
        bad = int((~np.isfinite(values)).sum())
        raise CheckpointError(f"{file}: tensor '{name}' holds {bad} NaN or infinite values of {values.size}: the "
                              "checkpoint is damaged, or was saved from a run that diverged")


def copy_into(view, array: np.ndarray) -> np.ndarray:
    """Cast one host tensor into its view of the flat buffer (NumPy: in place; CuPy: one upload); returns the
    values as stored, on the host (cast: a float32 beyond float16's range is inf there)."""
    if isinstance(view, np.ndarray):
        view[...] = array
        return view
    host = np.ascontiguousarray(array, dtype=view.dtype)
    view.set(host)
    return host


def save_checkpoint(folder: str | os.PathLike, cfg: ModelConfig, params: ParameterBuffer, tokenizer=None,
                    generation_config: dict | None = None, dtype=None, max_shard_bytes: int = 5 * 10**9) -> None:
    """Write a Hugging Face model folder atomically (formats/atomic.py): a crash leaves the old or the new
    checkpoint whole. Refuses to replace anything but a checkpoint (see `check_replaceable`)."""
    check_replaceable(folder)
    with atomic_folder(folder) as tmp:
        write_checkpoint(tmp, cfg, params, tokenizer, generation_config, dtype, max_shard_bytes)


def write_checkpoint(folder: str | os.PathLike, cfg: ModelConfig, params: ParameterBuffer, tokenizer=None,
                     generation_config: dict | None = None, dtype=None, max_shard_bytes: int = 5 * 10**9) -> None:
    """The files of a Hugging Face model folder, into the existing `folder` (not atomic: `save_checkpoint` is).

    `dtype` is the on-disk dtype (default: the buffer's); `tokenizer` is anything with
    `save_pretrained(folder)`; `generation_config` adds fields to generation_config.json.
    """
    folder = os.fspath(folder)
    disk_dtype = resolve_dtype(dtype if dtype is not None else params.flat.dtype)
    write_weights(folder, list(params), disk_dtype, max_shard_bytes)
    write_json(os.path.join(folder, "config.json"), dataclasses.replace(cfg, torch_dtype=disk_dtype.name).to_dict())
    generation = {"bos_token_id": cfg.bos_token_id, "eos_token_id": cfg.eos_token_id}
    generation = {k: v for k, v in generation.items() if v is not None}
    write_json(os.path.join(folder, "generation_config.json"), {**generation, **(generation_config or {})})
    if tokenizer is not None:
        tokenizer.save_pretrained(folder)


def check_replaceable(folder: str | os.PathLike, marker: str = "config.json") -> None:
    """Refuse to replace anything but a checkpoint (a flat folder with a `marker` file, config.json for a
    model): saving to a wrong path, e.g. a run's output folder holding checkpoint subfolders, must not delete
    data."""
    folder = os.path.abspath(os.fspath(folder))
    if os.path.exists(folder):
        if not os.path.isdir(folder):
            raise CheckpointError(f"{folder}: exists and is not a folder")
        entries = [os.path.join(folder, e) for e in os.listdir(folder)]
        if entries and (not os.path.isfile(os.path.join(folder, marker)) or any(map(os.path.isdir, entries))):
            raise CheckpointError(f"{folder}: exists and is not a plain checkpoint folder (no {marker}, or "
                                  "subfolders); refusing to replace it. Save to a new folder or delete it first")
