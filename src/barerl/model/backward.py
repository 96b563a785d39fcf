"""One decoder layer's backward pass, written by hand, op by op, in reverse order of `layer_forward`.

Weight gradients accumulate into `g` (a LayerView of the gradient buffer, same layout as the weights);
the returned array is the gradient of the layer input. The residual stream's gradient flows straight
through both residual adds, so each norm's backward adds it to its own (in fp32, before rounding once).
"""

from __future__ import annotations

from barerl.config import ModelConfig
from barerl.model.forward import LayerActivations, RopeContext, split_heads
from barerl.model.weights import LayerView


def layer_backward(
    ops, cfg: ModelConfig, w: LayerView, g: LayerView, a: LayerActivations, dx_out, rope: RopeContext,
    cu_seqlens, scale: float,
):
    T = dx_out.shape[0]
    # x_out = x_mid + down(act)
    d_act = ops.linear_backward(dx_out, a.act, w.down, g.down)
    d_gate_up = ops.swiglu_backward(d_act, a.gate_up)
    d_h2 = ops.linear_backward(d_gate_up, a.h2, w.gate_up, g.gate_up)
    dx_mid = ops.rmsnorm_backward(d_h2, a.x_mid, w.post_norm, a.rstd2, g.post_norm, residual_grad=dx_out)
    # x_mid = x_in + o_proj(o)
    d_o = ops.linear_backward(dx_mid, a.o.reshape(T, cfg.q_size), w.o_proj, g.o_proj)
    q, k, v = split_heads(cfg, a.qkv_rot)
    d_qkv_rot = ops.attention_backward(
        d_o.reshape(T, cfg.num_attention_heads, cfg.head_dim), q, k, v, a.o, a.lse, cu_seqlens, scale
    )
    d_qkv = ops.qk_norm_rope_backward(
        d_qkv_rot, a.qkv, rope.positions, rope.cos, rope.sin, cfg.num_attention_heads,
        cfg.num_key_value_heads, w.q_norm, w.k_norm, a.q_rstd, a.k_rstd, g.q_norm, g.k_norm,
    )
    d_h1 = ops.linear_backward(d_qkv, a.h1, w.qkv, g.qkv, g.qkv_bias)
    return ops.rmsnorm_backward(d_h1, a.x_in, w.input_norm, a.rstd1, g.input_norm, residual_grad=dx_mid)
