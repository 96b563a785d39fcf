"""Fused q/k RMSNorm + RoPE kernels against the reference ops, and the forward's KV-cache store
(`qk_norm_rope_store`, the engine's decode path)."""

from __future__ import annotations

import numpy as np
import pytest
from kernel_harness import (
    BF16,
    DTYPES,
    FP32,
    TOLERANCE,
    assert_close,
    assert_same_bits,
    cu_seqlens,
    f32,
    poisoned,
)

from barerl.ops import ref

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
    from barerl.ops import cuda

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


BLOCK = 16
# an int: that many decode tokens at random positions; a list: packed prefill sequences of those lengths
TOKEN_CASES = {"decode-1": 1, "decode-7": 7, "prefill-5-130-1": [5, 130, 1]}


def _positions(draw, case):
    return draw.integers((case,), 200) if isinstance(case, int) else cu_seqlens(case)[1]


def _slots(draw, tokens: int, num_slots: int):
    """Distinct flat cache slots; every fifth token from the second on is padding (-1)."""
    import cupy

    slots = draw.rng.permutation(num_slots)[:tokens].astype(np.int32)
    slots[1::5] = -1
    return cupy.asarray(slots)


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("cache_dtype", [BF16, FP32], ids=str)
@pytest.mark.parametrize("head_dim", [64, 128])
@pytest.mark.parametrize("heads", [(8, 2), (4, 4)])
@pytest.mark.parametrize("case", TOKEN_CASES)
@pytest.mark.parametrize("norm", [True, False])
def test_qk_norm_rope_store(draw, dtype, cache_dtype, head_dim, heads, case, norm):
    """out and rstd are the plain kernel's, bit for bit; the NaN-poisoned caches hold exactly what store_kv
    writes from that out (slot -1 rows and other slots untouched), and match the fp32 reference op."""
    import cupy

    from barerl.ops import cuda

    H, K = heads
    positions = _positions(draw, TOKEN_CASES[case])
    T = positions.shape[0]
    cos, sin = _tables(200, head_dim)
    qkv = draw.normal((T, (H + 2 * K) * head_dim), dtype, 2.0)
    qn = draw.normal((head_dim,), dtype) if norm else None
    kn = draw.normal((head_dim,), dtype) if norm else None
    num_blocks = T // BLOCK + 3
    slots = _slots(draw, T, num_blocks * BLOCK)
    k_cache, v_cache = (poisoned((num_blocks, BLOCK, K, head_dim), cache_dtype) for _ in range(2))
    got = cuda.qk_norm_rope_store(qkv, positions, cos, sin, H, K, qn, kn, 1e-6, k_cache, v_cache, slots)

    plain = cuda.qk_norm_rope(qkv, positions, cos, sin, H, K, qn, kn, 1e-6)
    for name, out, want in zip(("out", "q_rstd", "k_rstd"), got, plain):
        assert_same_bits(name, out, want)
    k_want, v_want = (cupy.asnumpy(poisoned(k_cache.shape, cache_dtype)) for _ in range(2))  # on the host:
    kv = cupy.asnumpy(got[0])[:, H * head_dim :].reshape(T, 2, K, head_dim)  # NumPy + ml_dtypes casts
    ref.store_kv(kv[:, 0], kv[:, 1], k_want, v_want, cupy.asnumpy(slots))
    assert_same_bits("k_cache", k_cache, cupy.asarray(k_want))
    assert_same_bits("v_cache", v_cache, cupy.asarray(v_want))

    ref_norms = (f32(qn), f32(kn)) if norm else (None, None)
    k_ref, v_ref = (cupy.zeros(k_cache.shape, FP32) for _ in range(2))
    rope_ref = (f32(qkv), positions, cos, sin, H, K, *ref_norms, 1e-6)
    out_ref, *_ = ref.qk_norm_rope_store(*rope_ref, k_ref, v_ref, slots)
    assert_close("out", got[0], out_ref, dtype)
    live = slots[slots >= 0]
    tol = max(TOLERANCE[dtype], TOLERANCE[cache_dtype])  # rounded to the activations' dtype, then the cache's
    for name, cache, cache_ref in (("k_cache", k_cache, k_ref), ("v_cache", v_cache, v_ref)):
        rows, rows_ref = (c.reshape(-1, K, head_dim)[live] for c in (cache, cache_ref))
        assert_close(f"{name} rows", rows, rows_ref, dtype, tol)


@pytest.mark.parametrize("cache_dtype", [BF16, FP32], ids=str)
def test_qk_norm_rope_store_head_dim_without_kernel(draw, cache_dtype):
    """head_dim 32: the reference rotation, then the store_kv kernel."""
    from barerl.ops import cuda

    H, K, D = 4, 2, 32
    positions = _positions(draw, 7)
    cos, sin = _tables(200, D)
    qkv = draw.normal((7, (H + 2 * K) * D), FP32)
    slots = _slots(draw, 7, 3 * BLOCK)
    caches = [poisoned((3, BLOCK, K, D), cache_dtype) for _ in range(4)]
    out, *_ = cuda.qk_norm_rope_store(qkv, positions, cos, sin, H, K, None, None, 1e-6, *caches[:2], slots)
    out_ref, *_ = ref.qk_norm_rope_store(qkv, positions, cos, sin, H, K, None, None, 1e-6, *caches[2:], slots)
    assert_same_bits("out", out, out_ref)
    assert_same_bits("k_cache", caches[0], caches[2])
    assert_same_bits("v_cache", caches[1], caches[3])


def test_qk_norm_rope_store_no_tokens(draw):
    from barerl.ops import cuda

    cos, sin = _tables(16, 64)
    cache = draw.normal((2, BLOCK, 2, 64), BF16)
    before = cache.copy()
    qkv, positions, slots = draw.normal((0, 8 * 64), BF16), draw.integers((0,), 16), draw.integers((0,), 32)
    out, _, _ = cuda.qk_norm_rope_store(qkv, positions, cos, sin, 4, 2, None, None, 1e-6, cache, cache, slots)
    assert out.shape == (0, 8 * 64)
    assert_same_bits("cache", cache, before)
