"""Read GGUF files (llama.cpp's checkpoint format) into Hugging Face names, shapes and config.

Design decisions:
- Our own parser (struct + NumPy), no `gguf` package: the format is a small header, a key/value table, a
  tensor table and aligned tensor data. The file is memory-mapped once (np.memmap); tensor data is never
  copied until a tensor is asked for, and `GGUFModel.tensors` dequantises lazily, one tensor per access, so
  loading a big file costs the fp32 copy the caller keeps and nothing more.
- What comes out is what a Hugging Face folder would hold: `config` is a config.json-style dict for
  Llama / Qwen2 / Qwen3 built from the `<arch>.*` metadata, and `tensors` is keyed by the names of
  `barerl.config.parameter_shapes` with Hugging Face shapes. Everything is checked against
  `ModelConfig` + `parameter_shapes` at open time, so a file that cannot become a model fails before
  any tensor is dequantised.
- llama.cpp's renaming, its q/k row interleave (llama architecture only) and its Llama 3 rope factors
  tensor are undone in `gguf_names`, exactly as transformers' GGUF loader does where it has an equivalent.
- Every problem is a `GGUFError` naming the file and the key or tensor. Nothing in a file is executed:
  strings are only decoded, never evaluated.
"""

from __future__ import annotations

import math
import os
import struct
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from typing import Any

import numpy as np

from barerl.config import ModelConfig, parameter_shapes
from barerl.formats.gguf_names import (
    ARCHITECTURES,
    ROPE_FREQS,
    hf_name,
    llama3_scaling_from_freqs,
    unpermute_rope_rows,
)
from barerl.formats.gguf_quants import GGML_TYPES, dequantize, type_name


class GGUFError(ValueError):
    """A GGUF file is truncated, corrupt, of an unsupported version/type, or lacks a needed key."""


GGUF_MAGIC = b"GGUF"
SUPPORTED_VERSIONS = (2, 3)
MAX_DIMS = 4  # ggml tensors have at most 4 dimensions
DEFAULT_ALIGNMENT = 32

# GGUF metadata value types -> struct format (scalars); 8 = string, 9 = array
_SCALAR_FORMATS = {0: "<B", 1: "<b", 2: "<H", 3: "<h", 4: "<I", 5: "<i", 6: "<f", 7: "<?", 10: "<Q", 11: "<q", 12: "<d"}
_STRING, _ARRAY = 8, 9

@dataclass(frozen=True)
class TensorInfo:
    name: str  # GGUF name, e.g. "blk.0.attn_q.weight"
    shape: tuple[int, ...]  # NumPy (row-major) order: GGUF's dims reversed
    ggml_type: int
    offset: int  # absolute byte offset of the data in the file
    nbytes: int


@dataclass(frozen=True)
class GGUFTokenizerSpec:
    """The tokenizer as llama.cpp stores it (`tokenizer.ggml.*` keys); `Tokenizer.from_gguf` builds it."""

    model: str  # "gpt2" = byte-level BPE; "llama" = sentencepiece; ...
    pre: str | None  # pre-tokenizer name, e.g. "llama-bpe", "qwen2", "smollm"
    tokens: list[str]
    token_types: list[int] | None  # 1 normal, 2 unknown, 3 control, 4 user-defined, 5 unused, 6 byte
    merges: list[str] | None  # "a b" pairs, best first
    scores: list[float] | None
    bos_token_id: int | None
    eos_token_id: int | None
    unk_token_id: int | None
    pad_token_id: int | None
    add_bos_token: bool | None
    add_eos_token: bool | None
    chat_template: str | None
    source: str  # the file, for error messages


class _Cursor:
    """Sequential little-endian reads from the mapped file; running off the end is a GGUFError."""

    def __init__(self, buf: memoryview, path: str):
        self.buf, self.path, self.pos = buf, path, 0

    def take(self, n: int, what: str) -> memoryview:
        if n < 0 or self.pos + n > len(self.buf):
            raise GGUFError(
                f"{self.path}: file is truncated or corrupt: reading {what} needs {n} bytes at offset {self.pos}, "
                f"but the file has {len(self.buf)} bytes"
            )
        view = self.buf[self.pos : self.pos + n]
        self.pos += n
        return view

    def scalar(self, fmt: str, what: str):
        return struct.unpack(fmt, self.take(struct.calcsize(fmt), what))[0]

    def string(self, what: str) -> str:
        raw = self.take(self.scalar("<Q", what), what)
        try:
            return str(raw, "utf-8")
        except UnicodeDecodeError as e:
            raise GGUFError(f"{self.path}: {what} is not valid UTF-8 ({e})") from None

    def value(self, vtype: int, what: str) -> Any:
        if vtype in _SCALAR_FORMATS:
            return self.scalar(_SCALAR_FORMATS[vtype], what)
        if vtype == _STRING:
            return self.string(what)
        if vtype == _ARRAY:
            item_type, count = self.scalar("<I", what), self.scalar("<Q", what)
            if item_type in _SCALAR_FORMATS and item_type != 7:
                size = struct.calcsize(_SCALAR_FORMATS[item_type])
                data = self.take(count * size, what)
                return np.frombuffer(data, dtype=_SCALAR_FORMATS[item_type]).tolist()
            return [self.value(item_type, f"{what}[{i}]") for i in range(count)]
        raise GGUFError(f"{self.path}: {what} has unknown value type {vtype} (file corrupt?)")


class GGUFModel:
    """An opened GGUF file: metadata, tensor table, HF-style `config`, lazy HF-named `tensors`, tokenizer spec."""

    def __init__(self, path: str):
        self.path = path
        try:
            self._data = np.memmap(path, dtype=np.uint8, mode="r")
        except FileNotFoundError:
            raise GGUFError(f"{path}: no such file") from None
        except ValueError:  # numpy refuses to map an empty file
            raise GGUFError(f"{path}: file is empty, not a GGUF file") from None
        cur = _Cursor(memoryview(self._data), path)
        magic = bytes(cur.take(4, "the magic number"))
        if magic != GGUF_MAGIC:
            raise GGUFError(f"{path}: not a GGUF file (magic {magic!r}, expected {GGUF_MAGIC!r})")
        self.version = cur.scalar("<I", "the version")
        if self.version not in SUPPORTED_VERSIONS:
            swapped = int.from_bytes(self.version.to_bytes(4, "little"), "big") in SUPPORTED_VERSIONS
            hint = " (a big-endian file? only little-endian GGUF is supported)" if swapped else ""
            raise GGUFError(f"{path}: GGUF version {self.version} is not supported (supported: 2, 3){hint}")
        num_tensors, num_kv = cur.scalar("<Q", "the tensor count"), cur.scalar("<Q", "the metadata count")
        self.metadata: dict[str, Any] = {}
        for i in range(num_kv):
            key = cur.string(f"metadata key #{i}")
            self.metadata[key] = cur.value(cur.scalar("<I", f"the type of metadata '{key}'"), f"metadata '{key}'")
        entries = [self._read_tensor_entry(cur, i) for i in range(num_tensors)]
        alignment = self.metadata.get("general.alignment", DEFAULT_ALIGNMENT)
        if not isinstance(alignment, int) or alignment <= 0:
            raise GGUFError(f"{path}: metadata 'general.alignment' must be a positive integer, got {alignment!r}")
        data_start = -(-cur.pos // alignment) * alignment
        self.tensor_infos: dict[str, TensorInfo] = {}
        for name, shape, ggml_type, rel_offset in entries:
            self.tensor_infos[name] = self._locate(name, shape, ggml_type, rel_offset, data_start, alignment)
        self.config = self._build_config()
        self._hf_to_gguf = self._match_tensors(self.config)
        self.tokenizer_spec = _tokenizer_spec(self.metadata, path)
        self.tensors = HFTensors(self)

    def _read_tensor_entry(self, cur: _Cursor, i: int) -> tuple[str, tuple[int, ...], int, int]:
        name = cur.string(f"the name of tensor #{i}")
        what = f"tensor table entry '{name}'"
        ndims = cur.scalar("<I", what)
        if not 1 <= ndims <= MAX_DIMS:
            raise GGUFError(f"{self.path}: {what}: {ndims} dimensions (corrupt tensor table; ggml allows 1..4)")
        dims = [cur.scalar("<Q", what) for _ in range(ndims)]
        ggml_type, offset = cur.scalar("<I", what), cur.scalar("<Q", what)
        return name, tuple(reversed(dims)), ggml_type, offset

    def _locate(self, name, shape, ggml_type, rel_offset, data_start, alignment) -> TensorInfo:
        if name in self.tensor_infos:
            raise GGUFError(f"{self.path}: tensor '{name}' appears twice in the tensor table")
        if ggml_type not in GGML_TYPES:
            supported = ", ".join(type_name(t) for t in GGML_TYPES)
            raise GGUFError(
                f"{self.path}: tensor '{name}' has type {type_name(ggml_type)}, which barerl cannot dequantise "
                f"(supported: {supported})"
            )
        block, type_size, _ = GGML_TYPES[ggml_type]
        if shape[-1] % block:
            raise GGUFError(
                f"{self.path}: tensor '{name}': row length {shape[-1]} is not a multiple of the "
                f"{type_name(ggml_type)} block size {block} (corrupt tensor table)"
            )
        nbytes = math.prod(shape) // block * type_size
        start = data_start + rel_offset
        if rel_offset % alignment:
            raise GGUFError(f"{self.path}: tensor '{name}': offset {rel_offset} is not {alignment}-byte aligned")
        if start + nbytes > len(self._data):
            raise GGUFError(
                f"{self.path}: tensor '{name}': data (bytes {start}..{start + nbytes}) runs past the end of "
                f"the file ({len(self._data)} bytes): the file is truncated or its tensor table corrupt"
            )
        return TensorInfo(name, shape, ggml_type, start, nbytes)

    def meta(self, key: str, default: Any = ...) -> Any:
        """Metadata value; a missing key without a default is a GGUFError naming it."""
        if key in self.metadata:
            return self.metadata[key]
        if default is ...:
            raise GGUFError(f"{self.path}: metadata key '{key}' is missing")
        return default

    def read_tensor(self, name: str) -> np.ndarray:
        """Tensor `name` (GGUF naming) dequantised to float32, in NumPy order, exactly as stored."""
        if name not in self.tensor_infos:
            raise GGUFError(f"{self.path}: no tensor named '{name}'")
        info = self.tensor_infos[name]
        return dequantize(self._data[info.offset : info.offset + info.nbytes], info.ggml_type, info.shape)

    def _build_config(self) -> dict[str, Any]:
        arch = self.meta("general.architecture")
        if arch not in ARCHITECTURES:
            raise GGUFError(
                f"{self.path}: metadata 'general.architecture': {arch!r} is not supported "
                f"(supported: {', '.join(ARCHITECTURES)})"
            )

        def get(key: str, default: Any = ..., kind: type = int) -> Any:
            value = self.meta(f"{arch}.{key}", default)
            types = (int, float) if kind is float else int
            if value is not default and (not isinstance(value, types) or isinstance(value, bool)):
                raise GGUFError(f"{self.path}: metadata '{arch}.{key}' must be a {kind.__name__}, got {value!r}")
            return value

        hidden, heads = get("embedding_length"), get("attention.head_count")
        head_dim = get("attention.key_length", None)
        if head_dim is None and arch == "llama":  # transformers reads llama's head_dim from the rope dimension
            head_dim = get("rope.dimension_count", None)
        tokens = self.metadata.get("tokenizer.ggml.tokens")
        vocab = get("vocab_size", None) or (len(tokens) if tokens else self._embedding_rows())
        config = {
            "architectures": [ARCHITECTURES[arch]],
            "model_type": arch,
            "hidden_act": "silu",
            "vocab_size": vocab,
            "hidden_size": hidden,
            "intermediate_size": get("feed_forward_length"),
            "num_hidden_layers": get("block_count"),
            "num_attention_heads": heads,
            "num_key_value_heads": get("attention.head_count_kv", heads),
            "head_dim": head_dim or hidden // heads,
            "rms_norm_eps": get("attention.layer_norm_rms_epsilon", kind=float),
            "rope_theta": float(get("rope.freq_base", 10000.0, kind=float)),
            "rope_scaling": self._rope_scaling(arch),
            "max_position_embeddings": get("context_length", 4096),
            "tie_word_embeddings": "output.weight" not in self.tensor_infos,
            "attention_bias": "blk.0.attn_q.bias" in self.tensor_infos,
            "torch_dtype": "float32",
        }
        for name in ("bos", "eos", "pad", "unk"):
            key = {"unk": "unknown", "pad": "padding"}.get(name, name)
            config[f"{name}_token_id"] = self.metadata.get(f"tokenizer.ggml.{key}_token_id")
        return config

    def _embedding_rows(self) -> int:
        info = self.tensor_infos.get("token_embd.weight")
        if info is None:
            raise GGUFError(f"{self.path}: no vocabulary size: no '<arch>.vocab_size', tokens or token_embd.weight")
        return info.shape[0]

    def _rope_scaling(self, arch: str) -> dict | None:
        kind = self.metadata.get(f"{arch}.rope.scaling.type")
        if kind not in (None, "none"):  # linear / yarn: passed on so ModelConfig reports it as unsupported
            return {
                "rope_type": kind,
                "factor": self.metadata.get(f"{arch}.rope.scaling.factor"),
                "original_max_position_embeddings": self.metadata.get(
                    f"{arch}.rope.scaling.original_context_length"
                ),
            }
        if ROPE_FREQS not in self.tensor_infos:
            return None
        theta = float(self.meta(f"{arch}.rope.freq_base", 10000.0))
        scaling = llama3_scaling_from_freqs(self.read_tensor(ROPE_FREQS), theta)
        if scaling is None:
            raise GGUFError(f"{self.path}: tensor '{ROPE_FREQS}' does not match Llama 3 rope scaling (unsupported)")
        return scaling

    def _match_tensors(self, config: dict[str, Any]) -> dict[str, str]:
        """HF name -> GGUF name, after checking that every parameter the config implies is in the file with the
        right shape, and that nothing unknown is."""
        cfg = ModelConfig.from_dict(config, source=self.path)
        expected = dict(parameter_shapes(cfg))
        found = {}
        for name, info in self.tensor_infos.items():
            hf = hf_name(name)
            if hf is None and name != ROPE_FREQS:
                raise GGUFError(f"{self.path}: tensor '{name}' is not part of a {cfg.architecture} model")
            if hf is not None:
                found[hf] = name
        for hf, shape in expected.items():
            if hf not in found:
                raise GGUFError(f"{self.path}: tensor for '{hf}' is missing (the metadata implies it)")
            info = self.tensor_infos[found[hf]]
            if info.shape != shape:
                raise GGUFError(
                    f"{self.path}: tensor '{info.name}' has shape {info.shape}, the metadata implies {shape} "
                    f"for '{hf}'"
                )
        extra = sorted(set(found) - set(expected))
        if extra:
            raise GGUFError(f"{self.path}: tensor '{found[extra[0]]}' does not fit the metadata's model ({extra[0]})")
        return {hf: found[hf] for hf in expected}


class HFTensors(Mapping):
    """HF parameter name -> float32 array with HF shape, dequantised on each access (nothing is cached)."""

    def __init__(self, model: GGUFModel):
        self._model = model
        self._names = model._hf_to_gguf

    def __getitem__(self, hf: str) -> np.ndarray:
        if hf not in self._names:
            raise KeyError(hf)
        model, name = self._model, self._names[hf]
        w = model.read_tensor(name)
        if model.config["model_type"] == "llama" and (".attn_q." in name or ".attn_k." in name):
            heads = model.config["num_attention_heads" if ".attn_q." in name else "num_key_value_heads"]
            w = unpermute_rope_rows(w, heads)
        return w

    def __iter__(self) -> Iterator[str]:
        return iter(self._names)

    def __len__(self) -> int:
        return len(self._names)


def _tokenizer_spec(meta: dict[str, Any], path: str) -> GGUFTokenizerSpec | None:
    if "tokenizer.ggml.tokens" not in meta:
        return None
    for key, kind in (("tokens", str), ("merges", str), ("token_type", int)):
        value = meta.get(f"tokenizer.ggml.{key}", [])
        if not isinstance(value, list) or not all(isinstance(v, kind) for v in value):
            raise GGUFError(f"{path}: metadata 'tokenizer.ggml.{key}' must be a list of {kind.__name__}")
    get = meta.get
    return GGUFTokenizerSpec(
        model=get("tokenizer.ggml.model", "gpt2"),
        pre=get("tokenizer.ggml.pre"),
        tokens=meta["tokenizer.ggml.tokens"],
        token_types=get("tokenizer.ggml.token_type"),
        merges=get("tokenizer.ggml.merges"),
        scores=get("tokenizer.ggml.scores"),
        bos_token_id=get("tokenizer.ggml.bos_token_id"),
        eos_token_id=get("tokenizer.ggml.eos_token_id"),
        unk_token_id=get("tokenizer.ggml.unknown_token_id"),
        pad_token_id=get("tokenizer.ggml.padding_token_id"),
        add_bos_token=get("tokenizer.ggml.add_bos_token"),
        add_eos_token=get("tokenizer.ggml.add_eos_token"),
        chat_template=get("tokenizer.chat_template"),
        source=path,
    )


def read_gguf(path: str | os.PathLike) -> GGUFModel:
    """Open a GGUF file: parse and validate metadata and tensor table; tensors dequantise on access."""
    return GGUFModel(os.fspath(path))
