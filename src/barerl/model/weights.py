"""Parameters live in one flat buffer; every tensor is a named view into it.

Names are Hugging Face's, so checkpoints map 1:1. The order inside a layer is chosen so that tensors the
model multiplies together sit next to each other: q, k and v projections form one (q+2kv, C) matrix and
gate and up projections one (2I, C) matrix, so each is a single GEMM. The gradient buffer has the same
layout, which is what lets AdamW run as one fused pass over one flat array.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from barerl.config import ModelConfig, parameter_shapes


def parameter_offsets(cfg: ModelConfig) -> dict[str, tuple[int, tuple[int, ...]]]:
    """name -> (element offset in the flat buffer, shape)."""
    offsets, pos = {}, 0
    for name, shape in parameter_shapes(cfg):
        offsets[name] = (pos, shape)
        pos += math.prod(shape)
    return offsets


def is_norm_or_bias(name: str) -> bool:
    """Parameters that conventionally get no weight decay (as Hugging Face's Trainer does)."""
    return name.endswith(".bias") or "norm" in name


@dataclass
class LayerView:
    """One decoder layer's tensors as views of the flat buffer (shapes in comments)."""

    input_norm: object  # (C,)
    qkv: object  # (q + 2kv, C): q_proj, k_proj, v_proj stacked
    qkv_bias: object | None  # (q + 2kv,)
    q_norm: object | None  # (D,)
    k_norm: object | None  # (D,)
    o_proj: object  # (C, q)
    post_norm: object  # (C,)
    gate_up: object  # (2I, C): gate_proj, up_proj stacked
    down: object  # (C, I)


class ParameterBuffer:
    """A flat array (NumPy or CuPy) with named views laid out as `parameter_shapes` says.

    Used for the working weights, the gradients, the fp32 master copy and the optimizer moments alike.
    """

    def __init__(self, cfg: ModelConfig, flat):
        self.cfg = cfg
        self.flat = flat
        self.offsets = parameter_offsets(cfg)
        total = sum(math.prod(s) for _, s in self.offsets.values())
        if flat.ndim != 1 or flat.shape[0] != total:
            raise ValueError(f"flat buffer has shape {flat.shape}, the model needs ({total},)")
        self.views = {name: self._view(name) for name in self.offsets}
        self.layers = [self._layer(i) for i in range(cfg.num_hidden_layers)]
        self.embed = self.views["model.embed_tokens.weight"]  # (V, C)
        self.final_norm = self.views["model.norm.weight"]  # (C,)
        self.lm_head = self.embed if cfg.tie_word_embeddings else self.views["lm_head.weight"]  # (V, C)

    @classmethod
    def zeros(cls, cfg: ModelConfig, xp, dtype) -> ParameterBuffer:
        total = sum(math.prod(s) for _, s in parameter_shapes(cfg))
        return cls(cfg, xp.zeros(total, dtype=dtype))

    def with_flat(self, flat) -> ParameterBuffer:
        """The same layout over another flat array (the optimizer's master, moments and gradients)."""
        return ParameterBuffer(self.cfg, flat)

    def _view(self, name: str):
        off, shape = self.offsets[name]
        return self.flat[off : off + math.prod(shape)].reshape(shape)

    def _span(self, first: str, last: str, rows: int):
        """View over consecutive tensors first..last as one (rows, cols) matrix."""
        start = self.offsets[first][0]
        end = self.offsets[last][0] + math.prod(self.offsets[last][1])
        return self.flat[start:end].reshape(rows, -1)

    def _layer(self, i: int) -> LayerView:
        cfg, p = self.cfg, f"model.layers.{i}."
        a = p + "self_attn."
        qkv_rows = cfg.q_size + 2 * cfg.kv_size
        has = self.views.__contains__
        return LayerView(
            input_norm=self.views[p + "input_layernorm.weight"],
            qkv=self._span(a + "q_proj.weight", a + "v_proj.weight", qkv_rows),
            qkv_bias=self._span(a + "q_proj.bias", a + "v_proj.bias", 1)[0] if has(a + "q_proj.bias") else None,
            q_norm=self.views.get(a + "q_norm.weight"),
            k_norm=self.views.get(a + "k_norm.weight"),
            o_proj=self.views[a + "o_proj.weight"],
            post_norm=self.views[p + "post_attention_layernorm.weight"],
            gate_up=self._span(p + "mlp.gate_proj.weight", p + "mlp.up_proj.weight", 2 * cfg.intermediate_size),
            down=self.views[p + "mlp.down_proj.weight"],
        )

    def __getitem__(self, name: str):
        return self.views[name]

    def __iter__(self):
        return iter(self.views.items())
