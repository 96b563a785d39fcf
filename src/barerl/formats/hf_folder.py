"""A Hugging Face model folder's files: config.json, and the weights as one safetensors file or shards with an
index (`model.safetensors.index.json`). Reading gives name -> memory-mapped array, validated against the
config (nothing missing, nothing unexpected); writing takes (name, array) pairs and shards them as transformers
does. Nothing from a folder is ever executed: `pytorch_model.bin` (a pickle) is refused, not read.
"""

from __future__ import annotations

import json
import math
import os
from collections.abc import Mapping, Sequence

import numpy as np

from barerl.config import ModelConfig, parameter_shapes
from barerl.formats import CheckpointError
from barerl.formats.safetensors import read_safetensors, write_safetensors

SAFETENSORS_FILE = "model.safetensors"
SAFETENSORS_INDEX = "model.safetensors.index.json"
_PICKLE_FILES = ("pytorch_model.bin", "pytorch_model.bin.index.json")
_HARMLESS_SUFFIXES = ("rotary_emb.inv_freq",)  # buffers some old exports saved; we recompute them


def folder_tensors(folder: str) -> tuple[dict[str, np.ndarray], dict[str, str], str]:
    """name -> memory-mapped array, name -> the file it is in, and the weights' entry file (single or index)."""
    index_path = os.path.join(folder, SAFETENSORS_INDEX)
    single = os.path.join(folder, SAFETENSORS_FILE)
    if os.path.isfile(index_path):
        weight_map = read_index(index_path)
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


def read_index(index_path: str) -> dict[str, str]:
    try:
        with open(index_path, encoding="utf-8") as f:
            weight_map = json.load(f).get("weight_map")
    except (ValueError, AttributeError) as e:
        raise CheckpointError(f"{index_path}: not a valid index ({e})") from None
    if not isinstance(weight_map, dict) or not all(isinstance(v, str) for v in weight_map.values()):
        raise CheckpointError(f"{index_path}: field 'weight_map': expected an object of tensor -> file name")
    return weight_map


def check_names(cfg: ModelConfig, tensors: Mapping[str, np.ndarray], file_of: dict[str, str],
                 weights_file: str) -> None:
    """Every tensor the config implies is present and nothing else is (shapes are checked as each tensor is
    copied: a GGUF tensor has its final shape only once dequantised)."""
    expected = dict(parameter_shapes(cfg))
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
    for name, shape in expected.items():
        if name not in tensors:
            raise CheckpointError(f"{weights_file}: tensor '{name}' (shape {shape}) is missing from the weights")


def write_weights(folder: str, tensors: Sequence[tuple[str, object]], dtype: np.dtype, max_shard_bytes: int) -> None:
    """(name, array) pairs as `model.safetensors`, or as shards of at most max_shard_bytes with their index."""
    shards: list[list[tuple[str, object]]] = [[]]
    shard_bytes = 0
    for name, array in tensors:
        nbytes = math.prod(array.shape) * dtype.itemsize
        if shards[-1] and shard_bytes + nbytes > max_shard_bytes:
            shards.append([])
            shard_bytes = 0
        shards[-1].append((name, array))
        shard_bytes += nbytes
    if len(shards) == 1:
        write_safetensors(os.path.join(folder, SAFETENSORS_FILE), shards[0], dtype)
        return
    weight_map, total = {}, 0
    for i, shard in enumerate(shards):
        file = f"model-{i + 1:05d}-of-{len(shards):05d}.safetensors"
        total += write_safetensors(os.path.join(folder, file), shard, dtype)
        weight_map.update(dict.fromkeys((name for name, _ in shard), file))
    write_json(os.path.join(folder, SAFETENSORS_INDEX), {"metadata": {"total_size": total}, "weight_map": weight_map})


def write_json(path: str, obj: dict) -> None:
    with open(path, "w", encoding="utf-8") as f:
        json.dump(obj, f, indent=2, sort_keys=True)
        f.write("\n")
