"""Fused q/k RMSNorm + RoPE kernels against the reference ops."""

from __future__ import annotations

import numpy as np
import pytest
from kernel_harness import DTYPES, FP32, assert_close, cu_seqlens, f32

from barerl.backend import ref

pytestmark = pytest.mark.gpu


def _tables(max_pos: int, head_dim: int, theta: float = 1e6):
    import cupy

    inv = 1.0 / theta ** (np.arange(0, head_dim, 2) / head_dim)
    angles = np.arange(max_pos)[:, None] * inv[None, :]
    return cupy.asarray(np.cos(angles).astype(np.float32)), cupy.asarray(np.sin(angles).astype(np.float32))


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("head_dim", [64, 128])
@pytest.mark.parametrize("heads", [(16, 8), (4, 4), (8, 2)])
@pytest.mark.parametrize("norm", [True, False])
def test_qk_norm_rope(draw, dtype, head_dim, heads, norm):
    from barerl.backend import cuda

    H, K = heads
    _, positions = cu_seqlens([5, 130, 1])
    T = positions.shape[0]
    cos, sin = _tables(200, head_dim)
    qkv = draw.normal((T, (H + 2 * K) * head_dim), dtype, 2.0)
    qn = draw.normal((head_dim,), dtype) if norm else None
    kn = draw.normal((head_dim,), dtype) if norm else None
    out, q_rstd, k_rstd = cuda.qk_norm_rope(qkv, positions, cos, sin, H, K, qn, kn, 1e-6)
    ref_norms = (f32(qn), f32(kn)) if norm else (None, None)
    out_ref, q_rstd_ref, k_rstd_ref = ref.qk_norm_rope(f32(qkv), positions, cos, sin, H, K, *ref_norms, 1e-6)
    assert out.dtype == dtype and q_rstd.shape == q_rstd_ref.shape
    assert_close("out", out, out_ref, dtype)
    if norm:
        assert_close("q_rstd", q_rstd, q_rstd_ref, FP32)
        assert_close("k_rstd", k_rstd, k_rstd_ref, FP32)

    dout = draw.normal(qkv.shape, dtype)
    dqn, dkn = draw.normal((head_dim,), FP32), draw.normal((head_dim,), FP32)
    dqn_ref, dkn_ref = dqn.copy(), dkn.copy()
    dqkv = cuda.qk_norm_rope_backward(dout, qkv, positions, cos, sin, H, K, qn, kn, q_rstd, k_rstd, dqn, dkn)
    dqkv_ref = ref.qk_norm_rope_backward(
        f32(dout), f32(qkv), positions, cos, sin, H, K, *ref_norms, q_rstd_ref, k_rstd_ref, dqn_ref, dkn_ref
    )
    assert_close("dqkv", dqkv, dqkv_ref, dtype)
    if norm:
        assert_close("dq_norm", dqn, dqn_ref, dtype)
        assert_close("dk_norm", dkn, dkn_ref, dtype)
