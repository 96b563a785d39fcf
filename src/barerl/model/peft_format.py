"""LoRA adapters in Hugging Face PEFT's format, out and in: `adapter_config.json` + `adapter_model.safetensors`.

Design decisions:
- Tensor names are peft's for a causal LM: `base_model.model.model.layers.N.self_attn.q_proj.lora_A.weight`
  (r, in) and `...lora_B.weight` (out, r); `peft.PeftModel.from_pretrained(transformers_model, folder)` loads
  them as saved. They are written in the working weights' dtype: the adapters the engine ran. The files are
  `barerl.formats.safetensors`' and JSON; `save_adapter` writes a folder atomically (formats/atomic.py) and
  never replaces one that is not an adapter, `write_adapter` writes into a folder being made (a training
  checkpoint's).
- The config carries what peft needs to rebuild the modules (r, lora_alpha, lora_dropout, target_modules,
  use_rslora, base_model_name_or_path) and states peft's defaults for the rest. Reading accepts peft's LoRA
  and rsLoRA as barerl computes them and refuses, naming the file and the field, every option that would
  change the math (DoRA, per-module ranks, biases, layers left out, modules saved whole) instead of loading it
  wrongly.
- Reading fills the buffer on the host and copies it to the device in one piece, in place when the model
  has adapters of the same layout already (a resumed or reloaded run: CUDA graphs keep their addresses).
"""

from __future__ import annotations

import json
import os

import numpy as np

from barerl.formats import CheckpointError
from barerl.formats.atomic import atomic_folder
from barerl.formats.hf_folder import write_json
from barerl.formats.paths import resolve_model_path
from barerl.formats.safetensors import read_safetensors, to_host, write_safetensors
from barerl.model.checkpoint import check_replaceable
from barerl.model.lora import TARGET_MODULES, LoraAdapters, LoraConfig, LoraWeights, attach

ADAPTER_CONFIG = "adapter_config.json"
ADAPTER_WEIGHTS = "adapter_model.safetensors"
PREFIX = "base_model.model."
# options that change peft's math, with the value barerl computes
_PLAIN_LORA = {"bias": "none", "use_dora": False, "fan_in_fan_out": False,
               "lora_bias": False, "modules_to_save": None, "layers_to_transform": None, "layers_pattern": None,
               "rank_pattern": {}, "alpha_pattern": {}, "exclude_modules": None, "target_parameters": None,
               "trainable_token_indices": None, "layer_replication": None, "use_qalora": False,
               "alora_invocation_tokens": None}


def is_adapter(path: str | os.PathLike) -> bool:
    return os.path.isfile(os.path.join(path, ADAPTER_CONFIG))


def adapter_base(folder: str | os.PathLike) -> str:
    """The base model an adapter names (base_model_name_or_path)."""
    base = _read_config(folder).get("base_model_name_or_path")
    if not base:
        raise CheckpointError(f"{os.path.join(folder, ADAPTER_CONFIG)}: field 'base_model_name_or_path': no base "
                              "model named (load the base, then load_adapter(model, folder))")
    return base


def save_adapter(folder: str | os.PathLike, adapters: LoraAdapters, base_model: str | None = None) -> None:
    """Write adapter_config.json and adapter_model.safetensors as the folder `folder`, atomically: a crash
    leaves the old adapter or the new one whole. Refuses to replace anything but an adapter folder."""
    check_replaceable(folder, marker=ADAPTER_CONFIG)
    with atomic_folder(folder) as tmp:
        write_adapter(tmp, adapters, base_model)


def write_adapter(folder: str | os.PathLike, adapters: LoraAdapters, base_model: str | None = None) -> None:
    """adapter_config.json and adapter_model.safetensors into the existing `folder` (not atomic:
    `save_adapter` is)."""
    host = adapters.weights.with_flat(to_host(adapters.weights.flat))
    write_safetensors(os.path.join(folder, ADAPTER_WEIGHTS),
                      [(PREFIX + name, np.ascontiguousarray(view)) for name, view in host.peft_tensors()])
    lora = adapters.config
    alpha = int(lora.lora_alpha) if float(lora.lora_alpha).is_integer() else lora.lora_alpha
    config = {"peft_type": "LORA", "task_type": "CAUSAL_LM", "base_model_name_or_path": base_model,
              "r": lora.r, "lora_alpha": alpha, "lora_dropout": lora.lora_dropout, "use_rslora": lora.use_rslora,
              "target_modules": list(lora.target_modules), "inference_mode": True, "init_lora_weights": True,
              "revision": None, **_PLAIN_LORA}
    write_json(os.path.join(folder, ADAPTER_CONFIG), config)


def read_adapter(folder: str | os.PathLike, lora_dropout: float = 0.0) -> tuple[LoraConfig, dict]:
    """A PEFT adapter folder's LoraConfig and its tensors (memory-mapped; names without peft's prefix). The
    targeted modules are those the weights hold (peft's config may list every layer's module paths);
    `lora_dropout` is the run's, not the file's. `folder` may be a Hub id (formats/paths.py)."""
    folder = resolve_model_path(folder)
    raw = _read_config(folder)
    path = os.path.join(folder, ADAPTER_WEIGHTS)
    if not os.path.isfile(path):
        raise CheckpointError(f"{folder}: no {ADAPTER_WEIGHTS}")
    tensors = {name.removeprefix(PREFIX): array for name, array in read_safetensors(path).items()}
    modules = {name.split(".")[-3] for name in tensors if name.endswith(".lora_A.weight")}
    try:
        return LoraConfig(r=raw.get("r"), lora_alpha=raw.get("lora_alpha"), lora_dropout=lora_dropout,
                          target_modules=tuple(modules), use_rslora=raw.get("use_rslora", False)), tensors
    except (ValueError, TypeError) as e:
        raise CheckpointError(f"{path}: {e}") from None


def _read_config(folder) -> dict:
    """adapter_config.json, checked for options barerl does not compute."""
    path = os.path.join(folder, ADAPTER_CONFIG)
    if not os.path.isfile(path):
        raise CheckpointError(f"{folder}: not a PEFT adapter (no {ADAPTER_CONFIG})")
    try:
        with open(path, encoding="utf-8") as f:
            raw = json.load(f)
    except ValueError as e:
        raise CheckpointError(f"{path}: not valid JSON ({e})") from None
    if raw.get("peft_type") != "LORA":
        raise CheckpointError(f"{path}: field 'peft_type': barerl reads LORA adapters, got {raw.get('peft_type')!r}")
    for key, plain in _PLAIN_LORA.items():
        value = raw.get(key)
        if not (value is None or value == plain or (isinstance(value, (list, dict)) and not value)):
            raise CheckpointError(f"{path}: field '{key}': {value!r} is not supported (barerl computes plain "
                                  f"LoRA: {key}={plain!r})")
    targets = raw.get("target_modules")  # a string is "all-linear" or a pattern: the tensors say what it chose
    for name in [] if isinstance(targets, str) else targets or []:  # peft matches names by their ending
        if name.rsplit(".", 1)[-1] not in TARGET_MODULES:
            raise CheckpointError(f"{path}: field 'target_modules': {name!r} is not a projection barerl adapts "
                                  f"({', '.join(TARGET_MODULES)})")
    return raw


def load_adapter(model, folder: str | os.PathLike, lora_dropout: float = 0.0) -> LoraAdapters:
    """Give `model` the PEFT adapter in `folder` (or load it into the model's adapters of the same layout, in
    place). `lora_dropout`: the dropout training will use (the file's is a record of its own run)."""
    folder = resolve_model_path(folder)
    lora, tensors = read_adapter(folder, lora_dropout)
    path = os.path.join(folder, ADAPTER_WEIGHTS)
    host = LoraWeights.zeros(model.cfg, lora, np, np.float32)
    views = dict(host.peft_tensors())
    for name in sorted(set(tensors) | set(views)):
        if name not in views:
            raise CheckpointError(f"{path}: unexpected tensor '{PREFIX}{name}' (not an adapter of modules "
                                  f"{list(lora.target_modules)} on every layer of a {model.cfg.num_hidden_layers}-"
                                  f"layer {model.cfg.architecture})")
        if name not in tensors:
            raise CheckpointError(f"{path}: tensor '{PREFIX}{name}' is missing (adapters on some layers only are "
                                  "not supported)")
        if tuple(tensors[name].shape) != views[name].shape:
            raise CheckpointError(f"{path}: tensor '{PREFIX}{name}' has shape {tuple(tensors[name].shape)}, the "
                                  f"model and r={lora.r} imply {views[name].shape}")
        views[name][...] = tensors[name]
    current = model.lora
    if current is None:
        return attach(model, host)
    if _layout(current.config) != _layout(lora):
        raise ValueError(f"{folder}: the model has adapters of another layout ({current.config}) than {lora}")
    current.weights.flat[...] = model.xp.asarray(host.flat.astype(model.dtype))
    return current


def _layout(lora: LoraConfig) -> tuple:
    """What fixes an adapter buffer's layout and scale (dropout is a training choice)."""
    return lora.r, lora.scale, lora.target_modules
