"""`Model.forward_backward` with a token-local loss's `token_grad` (the fused LM head: each chunk's backward
inside its forward) against the same loss without it: the same loss, metrics and gradients, for SFT and
for the GRPO policy loss, on a tiny random model (reference backend, fp32) and a batch of two head chunks."""

import numpy as np
import pytest
from train_helpers import tiny_cfg

from barerl.model.model import Model, PackedBatch
from barerl.model.sampling_filter import SamplingFilter
from barerl.ops.common import DEFAULT_LM_HEAD_CHUNK
from barerl.train.data import Example
from barerl.train.losses import PolicyLoss, per_token, sft_loss, sft_token_grad

LENGTHS = (600, 7, 500)  # 1,107 tokens, 1,097 with a loss: a full chunk of the LM head, then a partial one


@pytest.fixture(scope="module")
def model():
    return Model.random(tiny_cfg(), "cpu", "float32", seed=0)


@pytest.fixture(scope="module")
def batch(model):
    rng = np.random.default_rng(1)
    seqs = [rng.integers(0, model.cfg.vocab_size, n).tolist() for n in LENGTHS]
    prompt = 3
    return PackedBatch.from_examples([Example(s, [0] * prompt + [1] * (len(s) - prompt)) for s in seqs])


def _train_step(model, batch, loss_fn, sampling, token_grad=None):
    grads = model.zeros_like_params()
    loss, metrics = model.forward_backward(batch, loss_fn, grads, sampling, token_grad=token_grad)
    return loss, metrics, grads.flat


def _assert_fused_equals_unfused(model, batch, loss_fn, token_grad, sampling):
    calls = []

    def counted(logp, start, stop):
        calls.append((start, stop))
        return token_grad(logp, start, stop)

    loss, metrics, grads = _train_step(model, batch, loss_fn, sampling)
    fused_loss, fused_metrics, fused_grads = _train_step(model, batch, loss_fn, sampling, counted)
    # the fused head ran chunk by chunk over the rows that carry a loss, each chunk seen as its span of tokens
    chunk, rows = DEFAULT_LM_HEAD_CHUNK, np.flatnonzero(batch.loss_mask)
    assert calls == [(rows[0], rows[chunk - 1] + 1), (rows[chunk], rows[-1] + 1)]
    assert fused_loss == pytest.approx(loss, rel=1e-6)
    assert fused_metrics == pytest.approx(metrics, rel=1e-6, abs=1e-9)
    np.testing.assert_allclose(fused_grads, grads, rtol=1e-6, atol=1e-9)


def test_sft_fused_head_equals_unfused(model, batch):
    mask = batch.loss_mask
    loss_fn = lambda logp, entropy: (*sft_loss(logp, mask, 900), {})
    _assert_fused_equals_unfused(model, batch, loss_fn, sft_token_grad(mask, 900), SamplingFilter())


def _policy_loss(model, batch, sampling, with_old, correction):
    rng = np.random.default_rng(2)
    logp, _ = model.logprobs(batch, sampling)
    noisy = lambda scale: (logp + rng.normal(0, scale, logp.shape)).astype(np.float32)
    advantages = per_token(rng.normal(size=len(LENGTHS)).astype(np.float32), batch.cu_seqlens)
    return PolicyLoss(noisy(0.3) if with_old else None, advantages, batch.loss_mask, batch.cu_seqlens,
                      loss_type="grpo", epsilon_high=0.28, beta=0.04, ref_logp=noisy(0.2),
                      behaviour_logp=noisy(0.4), importance_sampling_mode=correction,
                      importance_sampling_cap=1.5)


@pytest.mark.parametrize("with_old", [True, False], ids=["old", "old=None"])
@pytest.mark.parametrize("correction", [None, "token_truncate"])
def test_policy_loss_fused_head_equals_unfused(model, batch, with_old, correction):
    sampling = SamplingFilter(temperature=0.8)
    policy = _policy_loss(model, batch, sampling, with_old, correction)
    loss_fn = lambda logp, entropy: policy(logp)
    _assert_fused_equals_unfused(model, batch, loss_fn, policy.token_grad, sampling)


def test_a_truncating_filter_keeps_the_unfused_head(model, batch):
    sampling = SamplingFilter(temperature=0.8, top_k=5)
    policy = _policy_loss(model, batch, sampling, True, None)
    loss_fn = lambda logp, entropy: policy(logp)

    def never(logp, start, stop):
        raise AssertionError("the filtered head has no fused twin: token_grad must not be called")

    loss, metrics, _ = _train_step(model, batch, loss_fn, sampling, never)
    assert (loss, metrics) == _train_step(model, batch, loss_fn, sampling)[:2]
