"""The fused LM head (`lm_head_forward_backward`: each chunk's backward right after its forward, on the same
logits) against the reference's unfused `lm_head_logprobs` then `lm_head_backward`."""

import ml_dtypes
import numpy as np
import pytest

from barerl.ops import ref

T = 13


def inputs(dtype, seed=0, C=8, V=40):
    rng = np.random.default_rng(seed)
    h = rng.standard_normal((T, C)).astype(np.float32).astype(dtype)
    w = (rng.standard_normal((V, C)) * C**-0.5).astype(np.float32).astype(dtype)
    dw = (rng.standard_normal((V, C)) * 1e-3).astype(np.float32)  # accumulated into: not zero
    return h, w, rng.integers(0, V, T).astype(np.int32), dw


def gradient_at(logp):
    """A token-local d loss / d logp that depends on the log-prob (as a policy loss's does)."""
    return np.float32(0.3) * np.sin(logp) - np.float32(0.1)


@pytest.mark.parametrize("dtype", [np.dtype(np.float32), np.dtype(ml_dtypes.bfloat16)], ids=str)
@pytest.mark.parametrize("chunk_size", [1, 4, 5, T, 64])  # 4 and 5 do not divide T
def test_fused_head_equals_forward_then_backward(dtype, chunk_size):
    h, w, targets, dw = inputs(dtype)
    inv_t = 1 / 0.7
    dw_fused = dw.copy()
    logp, lse, entropy = ref.lm_head_logprobs(h, w, targets, inv_t, chunk_size)
    dh = ref.lm_head_backward(gradient_at(logp), h, w, targets, lse, dw, inv_t, chunk_size)

    calls = []

    def token_grad(logp_chunk, start, stop):
        calls.append((start, stop))
        np.testing.assert_allclose(logp_chunk, logp[start:stop], rtol=1e-6, err_msg="token_grad's log-probs")
        return gradient_at(logp_chunk)

    fused = ref.lm_head_forward_backward(h, w, targets, token_grad, dw_fused, inv_t, chunk_size)
    assert calls == [(a, min(a + chunk_size, T)) for a in range(0, T, chunk_size)]
    for name, got, want in zip(("logprobs", "lse", "entropy", "dh", "dw"), (*fused, dw_fused),
                               (logp, lse, entropy, dh, dw), strict=True):
        assert got.dtype == want.dtype, name
        np.testing.assert_allclose(got.astype(np.float32), want.astype(np.float32), rtol=1e-6, atol=1e-7,
                                   err_msg=name)
