"""The LM head under the engine's sampling filter (top-k / top-p / min-p): log-probs equal the sampler's,
and gradients equal torch autograd of the same masked log-softmax (the GRPO-level check is in
tests/train/test_loops.py)."""

import numpy as np
import pytest
import torch

from barerl.ops import ref
from barerl.ops.ref.sampling import _filtered_chunk

FILTERS = [(3, 1.0, 0.0), (0, 0.8, 0.0), (0, 1.0, 0.2), (5, 0.9, 0.05)]


def inputs(seed=0, T=13, C=8, V=40):
    rng = np.random.default_rng(seed)
    h = rng.standard_normal((T, C)).astype(np.float32)
    w = rng.standard_normal((V, C)).astype(np.float32)
    return h, w, rng.integers(0, V, T).astype(np.int32)


@pytest.mark.parametrize("top_k,top_p,min_p", FILTERS)
def test_filtered_logprobs_equal_the_samplers(top_k, top_p, min_p):
    h, w, _ = inputs()
    T = h.shape[0]
    logits = ref.lm_head_logits(h, w)
    t = np.full(T, 0.7, np.float32)
    tokens, _ = ref.sample(logits, t, np.full(T, top_k, np.int32), np.full(T, top_p, np.float32),
                           np.full(T, min_p, np.float32), np.arange(T, dtype=np.uint64), np.zeros(T, np.int64))
    expected = ref.logprobs_under_sampling(logits, tokens, t, np.full(T, top_k, np.int32),
                                           np.full(T, top_p, np.float32), np.full(T, min_p, np.float32))
    got, _, _ = ref.lm_head_logprobs_filtered(h, w, tokens, 1 / 0.7, top_k, top_p, min_p, chunk_size=5)
    np.testing.assert_allclose(got, expected, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("top_k,top_p,min_p", FILTERS)
def test_filtered_gradient_equals_autograd(top_k, top_p, min_p):
    h, w, targets = inputs(1)
    inv_t = 1 / 0.9
    logp, lse, _ = ref.lm_head_logprobs_filtered(h, w, targets, inv_t, top_k, top_p, min_p, chunk_size=4)
    g = np.random.default_rng(2).standard_normal(h.shape[0]).astype(np.float32)
    dw = np.zeros_like(w)
    dh = ref.lm_head_backward_filtered(g, h, w, targets, lse, dw, inv_t, top_k, top_p, min_p, chunk_size=4)

    _, keep = _filtered_chunk(h, w, targets, inv_t, top_k, top_p, min_p)  # the kept set, held fixed
    th, tw = torch.tensor(h, dtype=torch.float64, requires_grad=True), torch.tensor(w, dtype=torch.float64,
                                                                                       requires_grad=True)
    z = (th @ tw.T) * inv_t
    z = z.masked_fill(~torch.tensor(keep), float("-inf"))
    tlogp = torch.log_softmax(z, -1)[torch.arange(len(targets)), torch.tensor(targets, dtype=torch.long)]
    np.testing.assert_allclose(logp, tlogp.detach().numpy(), rtol=1e-5, atol=1e-5)
    (tlogp * torch.tensor(g, dtype=torch.float64)).sum().backward()
    np.testing.assert_allclose(dh, th.grad.numpy(), rtol=1e-4, atol=1e-5)
    np.testing.assert_allclose(dw, tw.grad.numpy(), rtol=1e-4, atol=1e-5)

