"""Chunked LM-head log-probs and backward against the reference ops."""

from __future__ import annotations

import pytest
from kernel_harness import DTYPES, FP32, assert_close, assert_same_bits, f32

from barerl.ops import ref

pytestmark = pytest.mark.gpu


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("shape", [(1, 64, 1000), (300, 128, 5003), (70, 256, 151936)])
@pytest.mark.parametrize("chunk_size", [32, 1024])
def test_lm_head(draw, dtype, shape, chunk_size):
    from barerl.ops import cuda

    T, C, V = shape
    h, w = draw.normal((T, C), dtype), draw.normal((V, C), dtype, 2 * C**-0.5)
    targets = draw.integers((T,), V)
    tau = 1 / 0.7
    out = cuda.lm_head_logprobs(h, w, targets, tau, chunk_size)
    want = ref.lm_head_logprobs(f32(h), f32(w), targets, tau, chunk_size)
    tol = 1e-5 if dtype == FP32 else 1e-3  # fp32 outputs: only the bf16/fp16 operands' rounding remains
    for name, o, r in zip(("logprobs", "lse", "entropy"), out, want, strict=True):
        assert o.dtype == FP32
        assert_close(name, o, r, dtype, tol)

    dlogprobs = draw.normal((T,), FP32)
    dw = draw.normal((V, C), FP32, 1e-3)  # small: the accumulated gradient must dominate the check
    dw_ref = dw.copy()
    dh = cuda.lm_head_backward(dlogprobs, h, w, targets, out[1], dw, tau, chunk_size)
    dh_ref = ref.lm_head_backward(dlogprobs, f32(h), f32(w), targets, want[1], dw_ref, tau, chunk_size)
    assert dh.dtype == dtype
    assert_close("dh", dh, dh_ref, dtype)
    assert_close("dw", dw, dw_ref, dtype)


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("shape", [(300, 128, 5003), (70, 256, 151936)])
@pytest.mark.parametrize("chunk_size", [32, 1024])  # 32 does not divide 300 or 70
def test_fused_lm_head_equals_forward_then_backward(draw, dtype, shape, chunk_size):
    """The same kernels in the same order per chunk as lm_head_logprobs then lm_head_backward: the same bits."""
    from barerl.ops import cuda

    T, C, V = shape
    h, w = draw.normal((T, C), dtype), draw.normal((V, C), dtype, 2 * C**-0.5)
    targets = draw.integers((T,), V)
    scale = draw.normal((T,), FP32)
    tau = 1 / 0.7
    gradient_at = lambda logp, start, stop: scale[start:stop] * (logp - 0.5)  # token-local, logp-dependent
    dw = draw.normal((V, C), FP32, 1e-3)
    dw_fused = dw.copy()
    logprobs, lse, entropy = cuda.lm_head_logprobs(h, w, targets, tau, chunk_size)
    dh = cuda.lm_head_backward(gradient_at(logprobs, 0, T), h, w, targets, lse, dw, tau, chunk_size)

    calls = []

    def token_grad(logp, start, stop):
        calls.append((start, stop))
        return gradient_at(logp, start, stop)

    fused = cuda.lm_head_forward_backward(h, w, targets, token_grad, dw_fused, tau, chunk_size)
    assert calls == [(a, min(a + chunk_size, T)) for a in range(0, T, chunk_size)]
    for name, got, want in zip(("logprobs", "lse", "entropy", "dh", "dw"), (*fused, dw_fused),
                               (logprobs, lse, entropy, dh, dw), strict=True):
        assert_same_bits(name, got, want)
