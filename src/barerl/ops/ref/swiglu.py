"""The SwiGLU MLP activation: silu(gate) * up over a fused [gate | up] matrix, and its gradient.

The conventions every op follows (packing, fp32 arithmetic, accumulated gradients) are `barerl.ops.ref`'s.
"""

from __future__ import annotations

from barerl.ops.common import as_f32, xp_of

__all__ = ["swiglu", "swiglu_backward"]


def swiglu(gate_up):
    """gate_up (T, 2I) = [gate | up] -> silu(gate) * up (T, I)."""
    xp = xp_of(gate_up)
    g = as_f32(gate_up)
    n = g.shape[-1] // 2
    gate, up = g[:, :n], g[:, n:]
    return (gate / (1.0 + xp.exp(-gate)) * up).astype(gate_up.dtype, copy=False)


def swiglu_backward(da, gate_up):
    """Gradient of `swiglu`: returns d gate_up (T, 2I)."""
    xp = xp_of(da)
    g = as_f32(gate_up)
    n = g.shape[-1] // 2
    gate, up = g[:, :n], g[:, n:]
    daf = as_f32(da)
    sig = 1.0 / (1.0 + xp.exp(-gate))
    silu = gate * sig
    dgate = daf * up * sig * (1.0 + gate * (1.0 - sig))
    return xp.concatenate([dgate, daf * silu], axis=1).astype(gate_up.dtype, copy=False)
