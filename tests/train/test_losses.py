"""Losses against hand-computed values and their gradients against central finite differences.

The reference below (`_trl_padded`) is written the way TRL writes `_compute_loss`: padded (B, L) lists,
plain Python math, one line per formula; the code under test works on packed (T,) arrays.
"""

import math
import statistics

import numpy as np
import pytest

from barerl.train.losses import (
    LOSS_TYPES,
    PolicyLoss,
    group_advantages,
    logprob_mismatch,
    per_token,
    policy_loss,
    sft_loss,
    sft_token_grad,
    zero_std_groups,
)

# ---------------------------------------------------------------------------------------------------------
# Advantages


def test_group_advantages_group_scale():
    rewards = np.array([1.0, 0.0, 0.0, 1.0, 2.0, 2.0, 2.0, 2.0], dtype=np.float32)
    std = math.sqrt((4 * 0.25) / 3)  # unbiased std of [1, 0, 0, 1]
    a = 0.5 / (std + 1e-4)
    np.testing.assert_allclose(group_advantages(rewards, 4), [a, -a, -a, a, 0, 0, 0, 0], rtol=1e-6)
    assert zero_std_groups(rewards, 4).tolist() == [False, True]


def test_group_advantages_batch_and_none():
    rewards = [3.0, 1.0, 0.0, 4.0]
    std = statistics.stdev(rewards)  # unbiased, over the whole batch
    expected = [(3 - 2) / (std + 1e-4), (1 - 2) / (std + 1e-4), (0 - 2) / (std + 1e-4),
                (4 - 2) / (std + 1e-4)]
    r = np.array(rewards)
    np.testing.assert_allclose(group_advantages(r, 2, "batch"), expected, rtol=1e-6)
    np.testing.assert_allclose(group_advantages(r, 2, "none"), [1, -1, -2, 2])
    np.testing.assert_allclose(group_advantages(r, 1, "group"), [0, 0, 0, 0])
    assert zero_std_groups(r, 1).all()


def test_group_advantages_errors():
    with pytest.raises(ValueError, match="multiple of group_size=4"):
        group_advantages(np.zeros(6), 4)
    with pytest.raises(ValueError, match="scale_rewards"):
        group_advantages(np.zeros(4), 2, "std")


# ---------------------------------------------------------------------------------------------------------
# A TRL-shaped reference: padded lists, direct formulas


def _trl_padded(lp, old, adv, mask, loss_type, eps=0.2, eps_high=None, beta=0.0, ref=None, level="token",
                max_len=None, is_w=None, num_items=None, micro=1):
    eps_high = eps if eps_high is None else eps_high
    rows = []
    for b in range(len(lp)):
        n = max(sum(mask[b]), 1)
        seq_lr = sum((lp[b][t] - old[b][t]) * mask[b][t] for t in range(len(lp[b]))) / n
        row = []
        for t in range(len(lp[b])):
            r = math.exp(seq_lr if level == "sequence" else lp[b][t] - old[b][t])
            a = adv[b]
            loss = -min(r * a, min(max(r, 1 - eps), 1 + eps_high) * a)
            if is_w is not None:
                loss *= is_w[b][t]
            if beta:
                d = ref[b][t] - lp[b][t]
                loss += beta * (math.exp(d) - d - 1)
            row.append(loss)
        rows.append(row)
    tok_sum = sum(rows[b][t] * mask[b][t] for b in range(len(rows)) for t in range(len(rows[b])))
    n_tok = max(sum(map(sum, mask)), 1)
    if loss_type == "grpo":
        per_seq = [sum(x * m for x, m in zip(rows[b], mask[b])) / max(sum(mask[b]), 1)
                   for b in range(len(rows))]
        return sum(per_seq) / len(per_seq) / micro
    if loss_type == "bnpo":
        return tok_sum / n_tok / micro
    if loss_type == "dr_grpo":
        return tok_sum / (len(rows) * max_len) / micro
    return tok_sum / (num_items if num_items is not None else n_tok)


def _pack(rows):
    flat = np.array([x for row in rows for x in row], dtype=np.float64)
    return flat


# Two sequences: 3 tokens (first is a prompt token, no loss) and 2 tokens.
LP = [[-1.0, -0.5, -2.0], [-0.3, -1.2]]
OLD = [[-1.0, -0.8, -1.7], [-0.6, -1.0]]  # log ratios: (0, 0.3, -0.3), (0.3, -0.2)
REF = [[-0.9, -0.4, -2.2], [-0.5, -1.1]]
MASK = [[0, 1, 1], [1, 1]]
ADV = [1.5, -0.7]
CU = np.array([0, 3, 5], dtype=np.int32)


def _packed_inputs():
    adv = per_token(np.array(ADV), CU)
    return _pack(LP), _pack(OLD), adv, _pack(MASK), CU


def test_per_token():
    assert per_token(np.array(ADV), CU).tolist() == [1.5, 1.5, 1.5, -0.7, -0.7]
    assert per_token(np.array([1, 2, 3]), np.array([0, 2, 2, 3])).tolist() == [1, 1, 3]  # an empty sequence
    with pytest.raises(ValueError, match=r"values must be \(S,\) = \(2,\)"):
        per_token(np.zeros(3), CU)


def test_policy_loss_hand_value_grpo():
    """Token-level, symmetric clip 0.2: written out token by token."""
    lp, old, adv, mask, cu = _packed_inputs()
    loss, _, metrics = policy_loss(lp, old, adv, mask, cu, loss_type="grpo", epsilon=0.2)
    # seq 0 (A=1.5>0): r=e^0.3=1.3499 > 1.2 -> clipped to 1.2; r=e^-0.3=0.7408 -> unclipped branch
    seq0 = (-(1.2 * 1.5) - math.exp(-0.3) * 1.5) / 2
    # seq 1 (A=-0.7<0): r=e^0.3 -> -min(r*A, 1.2*A) = -(r*A); r=e^-0.2=0.8187 -> -(r*A)
    seq1 = (math.exp(0.3) * 0.7 + math.exp(-0.2) * 0.7) / 2
    assert loss == pytest.approx((seq0 + seq1) / 2, rel=1e-12)
    # clipped: token (seq0, e^0.3, A>0) is high-clipped; nothing low-clipped (e^-0.3 < 0.8 but A>0 there)
    assert metrics["clip_ratio/high"] == pytest.approx(1 / 4)
    assert metrics["clip_ratio/low"] == 0.0
    assert metrics["clip_ratio/region"] == pytest.approx(1 / 4)


@pytest.mark.parametrize("loss_type", ["grpo", "bnpo", "dr_grpo", "dapo"])
@pytest.mark.parametrize("level", ["token", "sequence"])
@pytest.mark.parametrize("beta", [0.0, 0.04])
def test_policy_loss_matches_trl_formula(loss_type, level, beta):
    lp, old, adv, mask, cu = _packed_inputs()
    kwargs = {"loss_type": loss_type, "epsilon": 0.2, "epsilon_high": 0.28, "beta": beta,
              "importance_sampling_level": level, "max_completion_length": 4,
              "ref_logp": _pack(REF) if beta else None}
    loss, _, metrics = policy_loss(lp, old, adv, mask, cu, **kwargs)
    expected = _trl_padded(LP, OLD, ADV, MASK, loss_type, eps=0.2, eps_high=0.28, beta=beta, ref=REF,
                           level=level, max_len=4)
    assert loss == pytest.approx(expected, rel=1e-12)
    if beta:
        kl = [math.exp(REF[b][t] - LP[b][t]) - (REF[b][t] - LP[b][t]) - 1
              for b in range(2) for t in range(len(LP[b])) if MASK[b][t]]
        assert metrics["kl"] == pytest.approx(sum(kl) / len(kl), rel=1e-12)


def test_micro_batch_normalisers():
    lp, old, adv, mask, cu = _packed_inputs()
    for loss_type in ["grpo", "bnpo", "dr_grpo"]:
        one, _, _ = policy_loss(lp, old, adv, mask, cu, loss_type=loss_type, max_completion_length=4)
        three, _, _ = policy_loss(lp, old, adv, mask, cu, loss_type=loss_type, max_completion_length=4,
                                  num_micro_batches=3)
        assert three == pytest.approx(one / 3, rel=1e-12)
    dapo, _, _ = policy_loss(lp, old, adv, mask, cu, loss_type="dapo", num_items_in_batch=10)
    assert dapo == pytest.approx(_trl_padded(LP, OLD, ADV, MASK, "dapo", num_items=10), rel=1e-12)
    # grpo over a step whose micro-batches hold 2 + 6 sequences: sum of per-sequence means / 8
    grpo8, _, _ = policy_loss(lp, old, adv, mask, cu, loss_type="grpo", num_sequences_in_batch=8)
    assert grpo8 == pytest.approx(_trl_padded(LP, OLD, ADV, MASK, "grpo") * 2 / 8, rel=1e-12)


def test_gspo_sequence_ratio():
    """GSPO: one ratio per sequence, exp(mean masked log-ratio); clip fractions count sequences."""
    lp, old, adv, mask, cu = _packed_inputs()
    loss, _, metrics = policy_loss(lp, old, adv, mask, cu, loss_type="bnpo",
                                   importance_sampling_level="sequence", epsilon=0.01)
    r0, r1 = math.exp((0.3 - 0.3) / 2), math.exp((0.3 - 0.2) / 2)  # 1.0 and e^0.05 = 1.0513 > 1.01
    # seq 0 unclipped (ratio 1); seq 1 has A<0 and ratio above 1+eps: -min(r*A, 1.01*A) = -r*A (unclipped)
    expected = (2 * -(r0 * 1.5) + 2 * (r1 * 0.7)) / 4
    assert loss == pytest.approx(expected, rel=1e-12)
    assert metrics["clip_ratio/region"] == 0.0
    adv_pos = np.abs(adv)
    _, _, metrics = policy_loss(lp, old, adv_pos, mask, cu, importance_sampling_level="sequence",
                                epsilon=0.01)
    assert metrics["clip_ratio/high"] == pytest.approx(0.5)  # seq 1 of 2


def test_truncated_and_masked_importance_sampling():
    lp, old, adv, mask, cu = _packed_inputs()
    behaviour = old - np.array([0.7, 0.5, 2.0, -0.1, 1.0])  # old - behaviour = (.7, .5, 2, -.1, 1)
    cap = 3.0  # e^2 = 7.39 and e^2.5 are above it; e^1 = 2.72 and e^0.9 = 2.46 are below
    tis_w = [[1.0, math.exp(0.5), cap], [math.exp(-0.1), math.exp(1.0)]]
    mis_w = [[1.0, math.exp(0.5), 0.0], [math.exp(-0.1), math.exp(1.0)]]
    seq_sum = [0.5 + 2.0, -0.1 + 1.0]  # the prompt token (0.7) is outside the mask and does not count
    seq_tis = [[min(math.exp(seq_sum[0]), cap)] * 3, [min(math.exp(seq_sum[1]), cap)] * 2]
    seq_mis = [[0.0] * 3, [math.exp(seq_sum[1])] * 2]
    for mode, w in [("token_truncate", tis_w), ("token_mask", mis_w), ("sequence_truncate", seq_tis),
                    ("sequence_mask", seq_mis)]:
        loss, _, metrics = policy_loss(lp, old, adv, mask, cu, loss_type="bnpo", behaviour_logp=behaviour,
                                       importance_sampling_mode=mode, importance_sampling_cap=cap)
        assert loss == pytest.approx(_trl_padded(LP, OLD, ADV, MASK, "bnpo", is_w=w), rel=1e-12), mode
    _, _, metrics = policy_loss(lp, old, adv, mask, cu, behaviour_logp=behaviour,
                                importance_sampling_mode="token_mask")
    assert metrics["is_weight/masked_fraction"] == pytest.approx(1 / 4)
    assert metrics["is_weight/max"] == pytest.approx(math.exp(1.0))
    _, _, metrics = policy_loss(lp, old, adv, mask, cu, behaviour_logp=behaviour,
                                importance_sampling_mode="sequence_truncate")
    assert metrics["is_weight/truncated_fraction"] == pytest.approx(1 / 2)
    assert metrics["is_weight/min"] == pytest.approx(math.exp(0.9))
    assert metrics["is_weight/mean"] == pytest.approx((cap + math.exp(0.9)) / 2)


def test_old_logp_none_means_ratio_one():
    lp, _, adv, mask, cu = _packed_inputs()
    loss, dlogp, _ = policy_loss(lp, None, adv, mask, cu, loss_type="bnpo")
    assert loss == pytest.approx(-(1.5 * 2 - 0.7 * 2) / 4)
    np.testing.assert_allclose(dlogp, -adv * mask / 4)


# ---------------------------------------------------------------------------------------------------------
# Gradients against finite differences


def _central_difference(f, x, h=1e-6):
    grad = np.zeros_like(x)
    for i in range(x.size):
        xp_, xm = x.copy(), x.copy()
        xp_[i] += h
        xm[i] -= h
        grad[i] = (f(xp_) - f(xm)) / (2 * h)
    return grad


def _random_batch(seed, lengths=(5, 1, 7, 4)):
    rng = np.random.default_rng(seed)
    t = sum(lengths)
    cu = np.concatenate([[0], np.cumsum(lengths)]).astype(np.int32)
    lp = rng.uniform(-3, -0.1, t)
    old = lp + rng.uniform(-0.5, 0.5, t)  # ratios in [0.6, 1.65]: some clipped on each side
    adv = np.repeat(rng.normal(size=len(lengths)), lengths)
    mask = (rng.uniform(size=t) > 0.25).astype(np.float64)
    return lp, old, adv, mask, cu, lp + rng.normal(0, 0.3, t), old + rng.normal(0, 0.4, t)


@pytest.mark.parametrize("loss_type", ["grpo", "bnpo", "dr_grpo", "dapo"])
@pytest.mark.parametrize("level", ["token", "sequence"])
@pytest.mark.parametrize("correction", [None, "token_truncate", "sequence_mask"])
def test_policy_gradient_finite_differences(loss_type, level, correction):
    lp, old, adv, mask, cu, ref, behaviour = _random_batch(seed=len(loss_type) + 10 * len(level))
    kwargs = {"loss_type": loss_type, "epsilon": 0.2, "epsilon_high": 0.28, "beta": 0.05, "ref_logp": ref,
              "importance_sampling_level": level, "max_completion_length": 8, "behaviour_logp": behaviour,
              "importance_sampling_mode": correction, "importance_sampling_cap": 1.5, "num_micro_batches": 2}
    _, dlogp, metrics = policy_loss(lp, old, adv, mask, cu, **kwargs)
    numeric = _central_difference(lambda x: policy_loss(x, old, adv, mask, cu, **kwargs)[0], lp)
    err = np.abs(dlogp - numeric).max()
    assert err < 1e-7, f"max abs err {err:.3g}, rel {err / np.abs(numeric).max():.3g}"
    assert dlogp.dtype == np.float64 and np.all(dlogp[mask == 0] == 0)
    if level == "token":
        assert metrics["clip_ratio/region"] > 0  # the test covers the clipped branch


def test_fp32_in_fp32_out():
    lp, old, adv, mask, cu, _, _ = _random_batch(seed=1)
    loss32, d32, _ = policy_loss(lp.astype(np.float32), old.astype(np.float32), adv, mask, cu)
    loss64, d64, _ = policy_loss(lp, old, adv, mask, cu)
    assert d32.dtype == np.float32
    assert loss32 == pytest.approx(loss64, rel=1e-5)
    np.testing.assert_allclose(d32, d64, rtol=1e-5, atol=1e-7)


def test_policy_loss_errors():
    lp, old, adv, mask, cu = _packed_inputs()
    with pytest.raises(ValueError, match="max_completion_length"):
        policy_loss(lp, old, adv, mask, cu, loss_type="dr_grpo")
    with pytest.raises(ValueError, match="ref_logp"):
        policy_loss(lp, old, adv, mask, cu, beta=0.1)
    with pytest.raises(ValueError, match="loss_type"):
        policy_loss(lp, old, adv, mask, cu, loss_type="ppo")
    with pytest.raises(ValueError, match="behaviour_logp"):
        policy_loss(lp, old, adv, mask, cu, importance_sampling_mode="token_truncate")
    with pytest.raises(ValueError, match="cu_seqlens"):
        policy_loss(lp, old, adv, mask, np.array([0, 3, 4]))
    with pytest.raises(ValueError, match="advantages"):
        policy_loss(lp, old, adv[:3], mask, cu)


# ---------------------------------------------------------------------------------------------------------
# Token-local gradients a chunk of tokens at a time (the model's fused LM head) against the whole batch's


def _in_chunks(token_grad, logp, chunk_size=3):
    t = logp.shape[0]
    return np.concatenate([token_grad(logp[a : a + chunk_size], a, min(a + chunk_size, t))
                           for a in range(0, t, chunk_size)])


@pytest.mark.parametrize("loss_type", LOSS_TYPES)
@pytest.mark.parametrize("epsilon_high", [None, 0.28])
@pytest.mark.parametrize("beta", [0.0, 0.05])
@pytest.mark.parametrize("with_old", [True, False], ids=["old", "old=None"])
@pytest.mark.parametrize("correction", [None, "token_truncate", "token_mask"])
def test_policy_token_grad_equals_policy_loss_dlogp(loss_type, epsilon_high, beta, with_old, correction):
    lp, old, adv, mask, cu, ref, behaviour = _random_batch(seed=len(loss_type))
    lp, old, adv, mask, ref, behaviour = (x.astype(np.float32) for x in (lp, old, adv, mask, ref, behaviour))
    old = old if with_old else None
    kwargs = {"loss_type": loss_type, "epsilon": 0.2, "epsilon_high": epsilon_high, "beta": beta,
              "ref_logp": ref, "max_completion_length": 8, "behaviour_logp": behaviour,
              "importance_sampling_mode": correction, "importance_sampling_cap": 1.5, "num_micro_batches": 2}
    _, want, metrics = policy_loss(lp, old, adv, mask, cu, **kwargs)
    got = _in_chunks(PolicyLoss(old, adv, mask, cu, **kwargs).token_grad, lp)
    assert got.dtype == np.float32
    np.testing.assert_allclose(got, want, rtol=1e-6, atol=1e-9)
    if with_old:
        assert metrics["clip_ratio/region"] > 0  # the clipped branch is covered
    if correction:
        assert metrics[f"is_weight/{'masked' if correction == 'token_mask' else 'truncated'}_fraction"] > 0


@pytest.mark.parametrize("level,correction", [("sequence", None), ("sequence", "token_truncate"),
                                              ("token", "sequence_truncate"), ("token", "sequence_mask")])
def test_no_token_grad_where_the_gradient_needs_whole_sequences(level, correction):
    _, old, adv, mask, cu, _, behaviour = _random_batch(seed=0)
    policy = PolicyLoss(old, adv, mask, cu, importance_sampling_level=level, behaviour_logp=behaviour,
                        importance_sampling_mode=correction)
    assert policy.token_grad is None


def test_sft_token_grad_equals_sft_loss_dlogp():
    lp, _, _, mask, _, _, _ = _random_batch(seed=2)
    lp, mask = lp.astype(np.float32), mask.astype(np.float32)
    for normaliser in (None, 40):
        _, want = sft_loss(lp, mask, normaliser)
        got = _in_chunks(sft_token_grad(mask, normaliser), lp)
        assert got.dtype == np.float32
        np.testing.assert_array_equal(got, want)


# ---------------------------------------------------------------------------------------------------------
# SFT loss and mismatch


def test_sft_loss_and_gradient():
    lp = np.array([-1.0, -2.0, -0.5, -4.0])
    mask = np.array([0.0, 1.0, 1.0, 0.0])
    loss, dlogp = sft_loss(lp, mask)
    assert loss == pytest.approx((2.0 + 0.5) / 2)
    np.testing.assert_allclose(dlogp, [0, -0.5, -0.5, 0])
    loss, dlogp = sft_loss(lp, mask, normaliser=10)
    assert loss == pytest.approx(0.25)
    numeric = _central_difference(lambda x: sft_loss(x, mask, 10)[0], lp)
    np.testing.assert_allclose(dlogp, numeric, atol=1e-9)


def test_logprob_mismatch():
    engine = np.array([-1.0, -2.0, -0.5, -3.0, -9.0])
    trainer = np.array([-1.0, -2.1, -0.3, -3.0, 0.0])
    mask = np.array([1, 1, 1, 1, 0])
    m = logprob_mismatch(engine, trainer, mask)
    d = [0.0, -0.1, 0.2, 0.0]
    assert m["max"] == pytest.approx(0.2)
    assert m["mean"] == pytest.approx(0.3 / 4)
    assert m["p99"] == pytest.approx(np.percentile(np.abs(d), 99))
    assert m["kl"] == pytest.approx(sum(math.exp(x) - x - 1 for x in d) / 4)
    assert logprob_mismatch(engine, engine, mask) == {"max": 0.0, "mean": 0.0, "p99": 0.0, "kl": 0.0}
    assert logprob_mismatch(engine, trainer, np.zeros(5))["max"] == 0.0


@pytest.mark.gpu
def test_policy_loss_on_cupy_matches_numpy():
    cp = pytest.importorskip("cupy")
    try:
        cp.cuda.runtime.getDeviceCount()
    except cp.cuda.runtime.CUDARuntimeError:
        pytest.skip("no CUDA device")
    lp, old, adv, mask, cu, ref, behaviour = _random_batch(seed=3)
    kwargs = {"loss_type": "grpo", "beta": 0.04, "importance_sampling_level": "sequence",
              "importance_sampling_mode": "token_truncate"}
    args = [x.astype(np.float32) for x in (lp, old, adv, mask)]
    loss, d, metrics = policy_loss(*args, cu, ref_logp=ref.astype(np.float32), behaviour_logp=behaviour,
                                   **kwargs)
    gpu = [cp.asarray(x) for x in args]
    loss_g, d_g, metrics_g = policy_loss(*gpu, cp.asarray(cu), ref_logp=cp.asarray(ref, dtype=cp.float32),
                                         behaviour_logp=cp.asarray(behaviour), **kwargs)
    assert loss_g == pytest.approx(loss, rel=1e-5)
    np.testing.assert_allclose(cp.asnumpy(d_g), d, rtol=1e-4, atol=1e-7)
    assert metrics_g.keys() == metrics.keys()


# ---------------------------------------------------------------------------------------------------------
# TRL's delta (two-sided clipping) and top_entropy_quantile (high-entropy tokens only)


def test_delta_hand_value_and_gradient():
    """delta=1.25 caps seq 1's first ratio e^0.3=1.35 (A<0), where the clip alone would not: its loss is
    1.25 * 0.7 instead of e^0.3 * 0.7, and its gradient 0. The rest is test_policy_loss_hand_value_grpo's."""
    lp, old, adv, mask, cu = _packed_inputs()
    loss, dlogp, _ = policy_loss(lp, old, adv, mask, cu, loss_type="grpo", epsilon=0.2, delta=1.25)
    seq0 = (-(1.2 * 1.5) - math.exp(-0.3) * 1.5) / 2  # A > 0: the clip at 1.2 binds before delta
    seq1 = (1.25 * 0.7 + math.exp(-0.2) * 0.7) / 2
    assert loss == pytest.approx((seq0 + seq1) / 2, rel=1e-12)
    # grpo weights each loss token 1/2 (its sequence's tokens) * 1/2 (sequences); dlogp = -A r w where unclipped
    expected = [0.0, 0.0, -1.5 * math.exp(-0.3) / 4, 0.0, 0.7 * math.exp(-0.2) / 4]
    np.testing.assert_allclose(dlogp, expected, rtol=1e-12, atol=1e-15)
    undamped, _, _ = policy_loss(lp, old, adv, mask, cu, loss_type="grpo", epsilon=0.2)
    assert undamped == pytest.approx(loss + (math.exp(0.3) - 1.25) * 0.7 / 4, rel=1e-12)


@pytest.mark.parametrize("delta", [1.1, 1.4])  # below and above 1 + epsilon_high
@pytest.mark.parametrize("level", ["token", "sequence"])
def test_delta_gradient_finite_differences(delta, level):
    lp, old, adv, mask, cu, ref, _ = _random_batch(seed=7)
    kwargs = {"loss_type": "dapo", "epsilon": 0.2, "epsilon_high": 0.28, "beta": 0.05, "ref_logp": ref,
              "importance_sampling_level": level, "delta": delta}
    _, dlogp, _ = policy_loss(lp, old, adv, mask, cu, **kwargs)
    numeric = _central_difference(lambda x: policy_loss(x, old, adv, mask, cu, **kwargs)[0], lp)
    err = np.abs(dlogp - numeric).max()
    assert err < 1e-7, f"max abs err {err:.3g}, rel {err / np.abs(numeric).max():.3g}"
    if level == "token":  # the chunked gradient of the fused head agrees
        loss = PolicyLoss(old, adv, mask, cu, dtype=np.float64, **kwargs)
        np.testing.assert_allclose(_in_chunks(loss.token_grad, lp), dlogp, rtol=1e-12, atol=1e-15)


# entropies of the 5 packed tokens; the loss tokens' are 0.5, 2.0, 1.0, 3.0
ENTROPY = np.array([9.0, 0.5, 2.0, 1.0, 3.0])


@pytest.mark.parametrize("beta", [0.0, 0.04])
def test_top_entropy_quantile_hand_value(beta):
    """q=0.5: the threshold is the 0.5-quantile of [0.5, 1, 2, 3] (linear: 1.5), so tokens 2 and 4 keep their
    surrogate; the KL term stays on all four loss tokens and dapo still divides by four (as TRL)."""
    lp, old, adv, mask, cu = _packed_inputs()
    options = {"loss_type": "dapo", "epsilon": 0.2, "beta": beta, "ref_logp": _pack(REF),
               "top_entropy_quantile": 0.5}
    loss, dlogp, _ = policy_loss(lp, old, adv, mask, cu, entropy=ENTROPY, **options)
    kl = sum(math.exp(r - x) - (r - x) - 1 for r, x, m in zip(_pack(REF), lp, mask) if m)
    surrogate = -math.exp(-0.3) * 1.5 + math.exp(-0.2) * 0.7  # tokens 2 (A=1.5) and 4 (A=-0.7), unclipped
    assert loss == pytest.approx((surrogate + beta * kl) / 4, rel=1e-12)
    if beta == 0.0:
        np.testing.assert_allclose(dlogp, [0, 0, -1.5 * math.exp(-0.3) / 4, 0, 0.7 * math.exp(-0.2) / 4],
                                   rtol=1e-12, atol=1e-15)


def test_top_entropy_quantile_edges():
    lp, old, adv, mask, cu = _packed_inputs()
    only_top, _, _ = policy_loss(lp, old, adv, mask, cu, entropy=ENTROPY, top_entropy_quantile=0.0)
    assert only_top == pytest.approx(math.exp(-0.2) * 0.7 / 4, rel=1e-12)  # the highest-entropy token alone
    every, _, _ = policy_loss(lp, old, adv, mask, cu, entropy=ENTROPY, top_entropy_quantile=1.0)
    assert every == policy_loss(lp, old, adv, mask, cu)[0]
    loss = PolicyLoss(old, adv, mask, cu, top_entropy_quantile=0.2)
    assert loss.token_grad is None  # the mask needs every token's entropy before any gradient
    with pytest.raises(ValueError, match="needs the entropy"):
        loss(lp)


def test_top_entropy_quantile_gradient_finite_differences():
    lp, old, adv, mask, cu, ref, behaviour = _random_batch(seed=5)
    entropy = np.random.default_rng(0).uniform(0, 4, lp.size)
    kwargs = {"loss_type": "grpo", "beta": 0.05, "ref_logp": ref, "behaviour_logp": behaviour,
              "importance_sampling_mode": "token_truncate", "top_entropy_quantile": 0.3, "entropy": entropy}
    _, dlogp, _ = policy_loss(lp, old, adv, mask, cu, **kwargs)
    numeric = _central_difference(lambda x: policy_loss(x, old, adv, mask, cu, **kwargs)[0], lp)
    assert np.abs(dlogp - numeric).max() < 1e-7


@pytest.mark.gpu
def test_delta_and_top_entropy_quantile_on_cupy_match_numpy():
    cp = pytest.importorskip("cupy")
    lp, old, adv, mask, cu, ref, _ = _random_batch(seed=3)
    entropy = np.random.default_rng(0).uniform(0, 4, lp.size).astype(np.float32)
    options = {"loss_type": "dapo", "beta": 0.04, "delta": 1.3, "top_entropy_quantile": 0.4}
    args = [x.astype(np.float32) for x in (lp, old, adv, mask)]
    loss, d, _ = policy_loss(*args, cu, ref_logp=ref.astype(np.float32), entropy=entropy, **options)
    loss_g, d_g, _ = policy_loss(*(cp.asarray(x) for x in args), cp.asarray(cu), entropy=cp.asarray(entropy),
                                 ref_logp=cp.asarray(ref, dtype=cp.float32), **options)
    assert loss_g == pytest.approx(loss, rel=1e-5)
    np.testing.assert_allclose(cp.asnumpy(d_g), d, rtol=1e-4, atol=1e-7)
