"""FlashAttention-2 kernels (packed causal varlen, GQA) against the reference ops."""

from __future__ import annotations

import numpy as np
import pytest
from kernel_harness import BF16, FP16, FP32, assert_close, cu_seqlens, f32, launcher, poison

from barerl.ops import ref

pytestmark = pytest.mark.gpu

LENGTHS = {
    "short": [1, 2, 17],  # a 1-token sequence has dq = 0 exactly: others keep the relative error meaningful
    "ragged": [5, 130, 64, 1, 257],
    "long": [1152, 700],
}

# kernel block shapes (attention_launcher.CONFIG entries) the tests cover; {} is the default
CONFIGS = {
    "default": {},
    "w8": {"fwd_warps": 8, "fwd_mt": 1, "bwd_warps": 8},
    "mt1": {"fwd_mt": 1},
    "mt2-bn32": {"fwd_mt": 2, "fwd_bn": 32},
}


def _qkv(draw, dtype, T, H, K, D):
    """q, k, v as row-strided views of one fused (T, (H + 2K) * D) buffer, as the model makes them."""
    qkv = draw.normal((T, (H + 2 * K) * D), dtype)
    q = qkv[:, : H * D].reshape(T, H, D)
    k = qkv[:, H * D : (H + K) * D].reshape(T, K, D)
    v = qkv[:, (H + K) * D :].reshape(T, K, D)
    return q, k, v


@pytest.mark.parametrize("dtype", [BF16, FP16], ids=str)
@pytest.mark.parametrize("head_dim", [64, 128])
@pytest.mark.parametrize("heads", [(4, 4), (8, 4), (8, 2)], ids=lambda h: f"gqa{h[0] // h[1]}")
@pytest.mark.parametrize("lengths", list(LENGTHS), ids=str)
@pytest.mark.parametrize("config", list(CONFIGS))
def test_attention(draw, dtype, head_dim, heads, lengths, config, monkeypatch):
    from barerl.ops import cuda
    attention_launcher = launcher("attention")

    for key, value in CONFIGS[config].items():
        monkeypatch.setitem(attention_launcher.CONFIG, key, value)

    H, K = heads
    cu, _ = cu_seqlens(LENGTHS[lengths])
    T = int(cu[-1])
    q, k, v = _qkv(draw, dtype, T, H, K, head_dim)
    scale = head_dim**-0.5
    o, lse = cuda.attention(q, k, v, cu, scale)
    o_ref, lse_ref = ref.attention(f32(q), f32(k), f32(v), cu, scale)
    assert o.dtype == dtype and lse.dtype == FP32
    assert_close("o", o, o_ref, dtype)
    assert_close("lse", lse, lse_ref, dtype, 1e-3)

    do = draw.normal((T, H, head_dim), dtype)
    dqkv = cuda.attention_backward(do, q, k, v, o, lse, cu, scale)
    want = ref.attention_backward(f32(do), f32(q), f32(k), f32(v), f32(o), lse, cu, scale)
    assert dqkv.dtype == dtype and dqkv.shape == (T, (H + 2 * K) * head_dim)
    cuts = np.cumsum([0, H, K, K]) * head_dim  # dq, dk, dv side by side
    for name, a, b in zip(("dq", "dk", "dv"), cuts[:-1], cuts[1:], strict=True):
        assert_close(name, dqkv[:, a:b], want[:, a:b], dtype)


def test_attention_writes_everything(draw):
    """Outputs are fresh arrays; run twice over NaN-poisoned previous results: nothing stale survives."""
    from barerl.ops import cuda

    cu, _ = cu_seqlens([33, 1, 70])
    q, k, v = _qkv(draw, BF16, 104, 4, 2, 128)
    o, lse = cuda.attention(q, k, v, cu, 0.1)
    poison(o)
    poison(lse)
    o2, lse2 = cuda.attention(q, k, v, cu, 0.1)
    o_ref, lse_ref = ref.attention(f32(q), f32(k), f32(v), cu, 0.1)
    assert_close("o", o2, o_ref, BF16)
    assert_close("lse", lse2, lse_ref, BF16, 1e-3)
