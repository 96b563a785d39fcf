"""One decoder layer's forward pass as a flat list of backend ops (llm.c style).

The same layer serves training (attention over packed sequences) and inference (attention against the
paged KV cache): the caller passes `attend(q, k, v) -> (o, lse)`, and may pass `rotate`, a stand-in for
`ops.qk_norm_rope` taking its arguments (the engine's also writes k and v into the KV cache). Shapes:
T tokens, C hidden, H query heads, K kv heads, D head dim, I intermediate.
"""

from __future__ import annotations

from dataclasses import dataclass

from barerl.config import ModelConfig
from barerl.model.weights import LayerView


@dataclass
class LayerActivations:
    """What backward needs from a layer's forward (kept, or recomputed from x_in under checkpointing)."""

    x_in: object  # (T, C) layer input
    h1: object  # (T, C) input_layernorm output
    rstd1: object  # (T,)
    qkv: object  # (T, (H + 2K) D) before norm/rope
    qkv_rot: object  # (T, (H + 2K) D) after norm/rope
    q_rstd: object  # (T, H) or (T, 0)
    k_rstd: object  # (T, K) or (T, 0)
    o: object  # (T, H, D) attention output
    lse: object  # (H, T)
    x_mid: object  # (T, C) residual after attention
    h2: object  # (T, C) post_attention_layernorm output
    rstd2: object  # (T,)
    gate_up: object  # (T, 2I)
    act: object  # (T, I) swiglu output


@dataclass
class RopeContext:
    positions: object  # (T,) int32, on the device
    cos: object  # (P, D/2) fp32, on the device
    sin: object


def split_heads(cfg: ModelConfig, qkv):
    """Views q (T, H, D), k (T, K, D), v (T, K, D) of a (T, (H + 2K) D) buffer."""
    T, D = qkv.shape[0], cfg.head_dim
    H, K = cfg.num_attention_heads, cfg.num_key_value_heads
    q = qkv[:, : H * D].reshape(T, H, D)
    k = qkv[:, H * D : (H + K) * D].reshape(T, K, D)
    v = qkv[:, (H + K) * D :].reshape(T, K, D)
    return q, k, v


def layer_activations(ops, cfg: ModelConfig, w: LayerView, x, rope: RopeContext, attend, rotate=None):
    """x (T, C) -> LayerActivations: every op of the layer but the last (`layer_output`), whose result backward
    never needs, so recomputation in backward stops here. `rotate` (default ops.qk_norm_rope) takes
    qk_norm_rope's arguments and returns what it returns."""
    rotate = ops.qk_norm_rope if rotate is None else rotate
    T = x.shape[0]
    h1, rstd1 = ops.rmsnorm(x, w.input_norm, cfg.rms_norm_eps)
    qkv = ops.linear(h1, w.qkv, w.qkv_bias)
    qkv_rot, q_rstd, k_rstd = rotate(
        qkv, rope.positions, rope.cos, rope.sin, cfg.num_attention_heads, cfg.num_key_value_heads,
        w.q_norm, w.k_norm, cfg.rms_norm_eps,
    )
    q, k, v = split_heads(cfg, qkv_rot)
    o, lse = attend(q, k, v)
    x_mid = ops.linear(o.reshape(T, cfg.q_size), w.o_proj, residual=x)
    h2, rstd2 = ops.rmsnorm(x_mid, w.post_norm, cfg.rms_norm_eps)
    gate_up = ops.linear(h2, w.gate_up)
    act = ops.swiglu(gate_up)
    return LayerActivations(x, h1, rstd1, qkv, qkv_rot, q_rstd, k_rstd, o, lse, x_mid, h2, rstd2, gate_up, act)


def layer_output(ops, w: LayerView, a: LayerActivations):
    """The layer's last op: x_out (T, C) = x_mid + down(act)."""
    return ops.linear(a.act, w.down, residual=a.x_mid)


def layer_forward(ops, cfg: ModelConfig, w: LayerView, x, rope: RopeContext, attend, rotate=None):
    """x (T, C) -> x_out (T, C), with nothing kept for backward (inference)."""
    return layer_output(ops, w, layer_activations(ops, cfg, w, x, rope, attend, rotate))
