"""Model configuration, read from a Hugging Face `config.json`.

One frozen dataclass describes every supported family (Qwen3, Qwen2/2.5, Llama 3.x, SmolLM2); the
differences between families are data (`Family`), not code paths. Unknown architectures and missing or
contradictory fields raise `ConfigError` naming the file and the field: a user should never see a numpy
traceback for a bad checkpoint.
"""

from __future__ import annotations

import dataclasses
import json
import math
import os
from dataclasses import dataclass, field
from typing import Any


class ConfigError(ValueError):
    """A config file (or dict) is missing a field, has a wrong value, or names an unsupported model."""


@dataclass(frozen=True)
class Family:
    """What differs between the supported architectures."""

    model_type: str
    qk_norm: bool  # Qwen3: RMSNorm over each q/k head before RoPE
    default_qkv_bias: bool  # Qwen2: bias on q, k and v projections


FAMILIES: dict[str, Family] = {
    "Qwen3ForCausalLM": Family("qwen3", qk_norm=True, default_qkv_bias=False),
    "Qwen2ForCausalLM": Family("qwen2", qk_norm=False, default_qkv_bias=True),
    "LlamaForCausalLM": Family("llama", qk_norm=False, default_qkv_bias=False),
}
MODEL_TYPE_TO_ARCH = {fam.model_type: arch for arch, fam in FAMILIES.items()}

_REQUIRED = (
    "vocab_size",
    "hidden_size",
    "intermediate_size",
    "num_hidden_layers",
    "num_attention_heads",
)


@dataclass(frozen=True)
class ModelConfig:
    architecture: str
    vocab_size: int
    hidden_size: int
    intermediate_size: int
    num_hidden_layers: int
    num_attention_heads: int
    num_key_value_heads: int
    head_dim: int
    rms_norm_eps: float = 1e-6
    rope_theta: float = 10000.0
    rope_scaling: dict | None = None
    tie_word_embeddings: bool = False
    attention_bias: bool = False
    max_position_embeddings: int = 4096
    bos_token_id: int | None = None
    eos_token_id: int | list[int] | None = None
    pad_token_id: int | None = None
    torch_dtype: str = "float32"
    extra: dict = field(default_factory=dict, compare=False, repr=False)

    @property
    def family(self) -> Family:
        return FAMILIES[self.architecture]

    @property
    def qk_norm(self) -> bool:
        return self.family.qk_norm

    @property
    def q_size(self) -> int:
        return self.num_attention_heads * self.head_dim

    @property
    def kv_size(self) -> int:
        return self.num_key_value_heads * self.head_dim

    @property
    def eos_token_ids(self) -> list[int]:
        if self.eos_token_id is None:
            return []
        return list(self.eos_token_id) if isinstance(self.eos_token_id, list) else [self.eos_token_id]

    @classmethod
    def from_dict(cls, d: dict[str, Any], source: str = "config") -> ModelConfig:
        def fail(field_name: str, why: str) -> ConfigError:
            return ConfigError(f"{source}: field '{field_name}': {why}")

        arch = _architecture_of(d, source)
        for name in _REQUIRED:
            if name not in d:
                raise fail(name, "missing")
            if not isinstance(d[name], int) or isinstance(d[name], bool) or d[name] <= 0:
                raise fail(name, f"must be a positive integer, got {d[name]!r}")
        heads = d["num_attention_heads"]
        kv_heads = d.get("num_key_value_heads") or heads
        if not isinstance(kv_heads, int) or kv_heads <= 0 or heads % kv_heads:
            raise fail("num_key_value_heads", f"{kv_heads!r} must be a positive divisor of {heads}")
        head_dim = d.get("head_dim") or d["hidden_size"] // heads
        if not isinstance(head_dim, int) or head_dim <= 0 or head_dim % 2:
            raise fail("head_dim", f"must be a positive even integer, got {head_dim!r}")
        eps = d.get("rms_norm_eps", 1e-6)
        if not isinstance(eps, (int, float)) or not eps > 0:
            raise fail("rms_norm_eps", f"must be a positive number, got {eps!r}")
        rope_params = d.get("rope_parameters") or {}  # transformers >= 5 nests theta and scaling here
        if not isinstance(rope_params, dict):
            raise fail("rope_parameters", f"expected an object, got {rope_params!r}")
        theta = rope_params.get("rope_theta", d.get("rope_theta", 10000.0))
        if not isinstance(theta, (int, float)) or not theta > 0:
            raise fail("rope_theta", f"must be a positive number, got {theta!r}")
        scaling = _rope_scaling_of(d.get("rope_scaling") or rope_params or None, fail)
        if d.get("hidden_act", "silu") != "silu":
            raise fail("hidden_act", f"only 'silu' is supported, got {d['hidden_act']!r}")
        bias = d.get("attention_bias", FAMILIES[arch].default_qkv_bias)
        if not isinstance(bias, bool):
            raise fail("attention_bias", f"must be true or false, got {bias!r}")
        known = {f.name for f in dataclasses.fields(cls)} | {
            "architectures", "model_type", "hidden_act", "rope_parameters", "dtype"
        }
        return cls(
            architecture=arch,
            vocab_size=d["vocab_size"],
            hidden_size=d["hidden_size"],
            intermediate_size=d["intermediate_size"],
            num_hidden_layers=d["num_hidden_layers"],
            num_attention_heads=heads,
            num_key_value_heads=kv_heads,
            head_dim=head_dim,
            rms_norm_eps=float(eps),
            rope_theta=float(theta),
            rope_scaling=scaling,
            tie_word_embeddings=bool(d.get("tie_word_embeddings", False)),
            attention_bias=bias,
            max_position_embeddings=int(d.get("max_position_embeddings", 4096)),
            bos_token_id=d.get("bos_token_id"),
            eos_token_id=d.get("eos_token_id"),
            pad_token_id=d.get("pad_token_id"),
            torch_dtype=str(d.get("torch_dtype") or d.get("dtype") or "float32"),
            extra={k: v for k, v in d.items() if k not in known},
        )

    @classmethod
    def from_file(cls, path: str | os.PathLike) -> ModelConfig:
        path = os.fspath(path)
        try:
            with open(path, encoding="utf-8") as f:
                d = json.load(f)
        except FileNotFoundError:
            raise ConfigError(f"{path}: no such file (a model folder needs a config.json)") from None
        except json.JSONDecodeError as e:
            raise ConfigError(f"{path}: not valid JSON ({e})") from None
        if not isinstance(d, dict):
            raise ConfigError(f"{path}: expected a JSON object")
        return cls.from_dict(d, source=path)

    def to_dict(self) -> dict[str, Any]:
        """The config in Hugging Face's `config.json` form (loadable by transformers)."""
        d = dict(self.extra)
        d.update(
            architectures=[self.architecture],
            model_type=self.family.model_type,
            hidden_act="silu",
            vocab_size=self.vocab_size,
            hidden_size=self.hidden_size,
            intermediate_size=self.intermediate_size,
            num_hidden_layers=self.num_hidden_layers,
            num_attention_heads=self.num_attention_heads,
            num_key_value_heads=self.num_key_value_heads,
            head_dim=self.head_dim,
            rms_norm_eps=self.rms_norm_eps,
            rope_theta=self.rope_theta,
            rope_scaling=self.rope_scaling,
            tie_word_embeddings=self.tie_word_embeddings,
            attention_bias=self.attention_bias,
            max_position_embeddings=self.max_position_embeddings,
            bos_token_id=self.bos_token_id,
            eos_token_id=self.eos_token_id,
            pad_token_id=self.pad_token_id,
            torch_dtype=self.torch_dtype,
        )
        return d

    def num_parameters(self) -> int:
        return sum(math.prod(shape) for _, shape in parameter_shapes(self))


# ---------------------------------------------------------------------------------------------------------
# The tensors a config implies, with their Hugging Face names and shapes, in the flat buffer's order


def layer_parameter_shapes(cfg: ModelConfig, i: int) -> list[tuple[str, tuple[int, ...]]]:
    C, I, D = cfg.hidden_size, cfg.intermediate_size, cfg.head_dim
    p = f"model.layers.{i}."
    shapes = [
        (p + "input_layernorm.weight", (C,)),
        (p + "self_attn.q_proj.weight", (cfg.q_size, C)),
        (p + "self_attn.k_proj.weight", (cfg.kv_size, C)),
        (p + "self_attn.v_proj.weight", (cfg.kv_size, C)),
    ]
    if cfg.attention_bias:
        shapes += [
            (p + "self_attn.q_proj.bias", (cfg.q_size,)),
            (p + "self_attn.k_proj.bias", (cfg.kv_size,)),
            (p + "self_attn.v_proj.bias", (cfg.kv_size,)),
        ]
    if cfg.qk_norm:
        shapes += [(p + "self_attn.q_norm.weight", (D,)), (p + "self_attn.k_norm.weight", (D,))]
    shapes += [
        (p + "self_attn.o_proj.weight", (C, cfg.q_size)),
        (p + "post_attention_layernorm.weight", (C,)),
        (p + "mlp.gate_proj.weight", (I, C)),
        (p + "mlp.up_proj.weight", (I, C)),
        (p + "mlp.down_proj.weight", (C, I)),
    ]
    return shapes


def parameter_shapes(cfg: ModelConfig) -> list[tuple[str, tuple[int, ...]]]:
    """Every trainable tensor, in buffer order, with its Hugging Face name."""
    shapes = [("model.embed_tokens.weight", (cfg.vocab_size, cfg.hidden_size))]
    for i in range(cfg.num_hidden_layers):
        shapes += layer_parameter_shapes(cfg, i)
    shapes.append(("model.norm.weight", (cfg.hidden_size,)))
    if not cfg.tie_word_embeddings:
        shapes.append(("lm_head.weight", (cfg.vocab_size, cfg.hidden_size)))
    return shapes


def _architecture_of(d: dict, source: str) -> str:
    archs = d.get("architectures")
    if archs:
        if not isinstance(archs, list) or not archs:
            raise ConfigError(f"{source}: field 'architectures': expected a list of names, got {archs!r}")
        arch = archs[0]
    elif "model_type" in d:
        arch = MODEL_TYPE_TO_ARCH.get(d["model_type"], d["model_type"])
    else:
        raise ConfigError(f"{source}: field 'architectures': missing (and no 'model_type' either)")
    if arch not in FAMILIES:
        supported = ", ".join(sorted(FAMILIES))
        raise ConfigError(f"{source}: field 'architectures': unsupported architecture {arch!r} (supported: {supported})")
    return arch


def _rope_scaling_of(scaling, fail) -> dict | None:
    if scaling is None:
        return None
    if not isinstance(scaling, dict):
        raise fail("rope_scaling", f"expected an object or null, got {scaling!r}")
    kind = scaling.get("rope_type", scaling.get("type"))
    if kind in (None, "default"):
        return None
    if kind != "llama3":
        raise fail("rope_scaling", f"rope_type {kind!r} is not supported (supported: llama3)")
    for key in ("factor", "low_freq_factor", "high_freq_factor", "original_max_position_embeddings"):
        if not isinstance(scaling.get(key), (int, float)):
            raise fail("rope_scaling", f"llama3 scaling needs a number for '{key}'")
    return {k: v for k, v in scaling.items() if k != "rope_theta"}
