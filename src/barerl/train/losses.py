"""Training losses on per-token log-probabilities: GRPO family, SFT, and engine/trainer mismatch metrics.

The model gives one log-probability per packed token, `logp` (T,), for the token that was actually there
(the target). Every loss here is a scalar function of `logp` and returns its gradient `dlogp` (T,) with
it, derived by hand, so the model's backward starts from `dlogp` and nothing here needs autograd.

Design decisions:
- Packed layout as everywhere in barerl: sequences are concatenated, `cu_seqlens` (S+1,) marks them,
  `mask` (T,) is 1 on tokens that carry loss (completion tokens) and 0 elsewhere (prompt, padding).
- Written against an array namespace (`xp_of`): NumPy on the CPU, CuPy on the GPU, same code.
  Arithmetic is fp32, or fp64 when `logp` is fp64 (the finite-difference tests use that). Metrics are
  gathered into one array and copied to the host once, so a call costs one device sync.
- TRL's GRPOTrainer semantics, so a TRL user gets the same numbers (same names too):
    ratio       r_t = exp(logp_t - old_t)   (token), or, GSPO, exp(masked mean over the sequence)
    surrogate   l_t = -min(r_t A_t, clip(r_t, 1 - epsilon, 1 + epsilon_high) A_t) * w_t + beta * kl_t
    kl_t        = exp(ref_t - logp_t) - (ref_t - logp_t) - 1   (k3 estimator)
    w_t         = behaviour-policy correction (1 when off): exp(old - behaviour), per token or summed
                  over the sequence, truncated at the cap ("*_truncate") or zeroed above it ("*_mask").
  Normalisation (sum over loss tokens of l_t divided by):
    grpo     per sequence by its own token count, then by the number of sequences
    bnpo     the number of loss tokens in this micro-batch
    dr_grpo  number of sequences * max_completion_length
    dapo     `num_items_in_batch`: loss tokens of the whole optimizer step (all micro-batches)
  grpo / bnpo / dr_grpo are divided by `num_micro_batches` as TRL divides them by its gradient
  accumulation steps; dapo needs no such factor because its normaliser already spans the whole step.
  `num_sequences_in_batch` replaces "sequences in this call * num_micro_batches" for grpo / dr_grpo when
  packed micro-batches hold different numbers of sequences (TRL's equal-size micro-batches make the two
  agree).
- Gradient of the clipped surrogate w.r.t. the ratio: -A, except where the clip is active (ratio above
  1 + epsilon_high with A > 0, or below 1 - epsilon with A < 0), where it is 0. These are exactly the
  tokens TRL counts as high / low clipped.
"""

from __future__ import annotations

import math

import numpy as np

from barerl.backend.ref import xp_of

LOSS_TYPES = ("grpo", "dr_grpo", "dapo", "bnpo")
SCALE_REWARDS = ("group", "batch", "none")
IMPORTANCE_SAMPLING_LEVELS = ("token", "sequence")
IMPORTANCE_SAMPLING_MODES = ("token_truncate", "token_mask", "sequence_truncate", "sequence_mask")
ADVANTAGE_STD_EPS = 1e-4  # TRL: advantages / (std + 1e-4)
ZERO_STD_ATOL = 1e-8  # TRL: torch.isclose(std, 0), i.e. |std| <= 1e-8


# ---------------------------------------------------------------------------------------------------------
# Advantages


def _reward_std(rewards, group_size: int, scale_rewards: str):
    """Unbiased std per group or over the batch, broadcast to (G, group_size); 0 when undefined."""
    xp = xp_of(rewards)
    grouped = rewards.reshape(-1, group_size)
    if scale_rewards == "batch":
        std = rewards.std(ddof=1) if rewards.size > 1 else xp.zeros(())
        return xp.broadcast_to(std, grouped.shape)
    std = grouped.std(axis=1, ddof=1, keepdims=True) if group_size > 1 else xp.zeros((grouped.shape[0], 1))
    return xp.broadcast_to(std, grouped.shape)


def _grouped(rewards, group_size: int):
    if rewards.ndim != 1 or group_size < 1 or rewards.shape[0] % group_size:
        raise ValueError(
            f"rewards must be (N,) with N a multiple of group_size={group_size}; "
            f"got shape {tuple(rewards.shape)}"
        )
    return rewards.astype(np.float64)


def group_advantages(rewards, group_size: int, scale_rewards: str = "group"):
    """Group-relative advantages, (N,) fp32, for N = num_prompts * group_size rewards in group order.

    A_i = r_i - mean(group), divided by (std + 1e-4) where std is the unbiased std of the group
    (`"group"`), of the whole batch (`"batch"`), or not divided (`"none"`), as TRL's `scale_rewards`.
    """
    if scale_rewards not in SCALE_REWARDS:
        raise ValueError(f"scale_rewards must be one of {SCALE_REWARDS}, got {scale_rewards!r}")
    r = _grouped(rewards, group_size)
    grouped = r.reshape(-1, group_size)
    advantages = grouped - grouped.mean(axis=1, keepdims=True)
    if scale_rewards != "none":
        advantages = advantages / (_reward_std(r, group_size, scale_rewards) + ADVANTAGE_STD_EPS)
    return advantages.reshape(-1).astype(np.float32)


def zero_std_groups(rewards, group_size: int):
    """(G,) bool: groups whose rewards are all equal (zero advantage, no signal).

    DAPO's dynamic sampling drops these groups and samples more prompts; TRL logs their fraction as
    `frac_reward_zero_std`.
    """
    r = _grouped(rewards, group_size)
    return _reward_std(r, group_size, "group")[:, 0] <= ZERO_STD_ATOL


# ---------------------------------------------------------------------------------------------------------
# Helpers on packed sequences


def _compute_dtype(logp):
    return np.float64 if logp.dtype == np.float64 else np.float32


def _sequence_ids(xp, cu_seqlens, num_tokens: int):
    cu = xp.asarray(cu_seqlens)
    if cu.ndim != 1 or cu.shape[0] < 2 or int(cu[0]) != 0 or int(cu[-1]) != num_tokens:
        raise ValueError(f"cu_seqlens must be (S+1,) from 0 to T={num_tokens}; got {cu_seqlens!r}")
    return xp.searchsorted(cu[1:], xp.arange(num_tokens), side="right"), cu.shape[0] - 1


def per_token(values, cu_seqlens):
    """(S,) per-sequence values (e.g. advantages) -> (T,), each repeated over its sequence's tokens."""
    xp = xp_of(values)
    cu = xp.asarray(cu_seqlens)
    seq_ids, num_seqs = _sequence_ids(xp, cu, int(cu[-1]))
    if values.shape != (num_seqs,):
        raise ValueError(f"values must be (S,) = ({num_seqs},) for cu_seqlens, got {tuple(values.shape)}")
    return values[seq_ids]


def _segment_sum(xp, values, seq_ids, num_seqs: int):
    return xp.bincount(seq_ids, weights=values, minlength=num_seqs).astype(values.dtype)


def _to_floats(xp, named: dict) -> dict:
    """One device-to-host copy for all scalar metrics."""
    if not named:
        return {}
    values = xp.stack([xp.asarray(v, dtype=np.float64) for v in named.values()]).tolist()
    return dict(zip(named, values))


# ---------------------------------------------------------------------------------------------------------
# Policy loss (GRPO family)


def _check_policy_args(logp, tensors: dict, loss_type, importance_sampling_level, importance_sampling_mode,
                       beta, max_completion_length):
    if logp.ndim != 1:
        raise ValueError(f"logp must be (T,), got shape {tuple(logp.shape)}")
    for name, t in tensors.items():
        if t is not None and tuple(t.shape) != tuple(logp.shape):
            raise ValueError(f"{name} must have logp's shape {tuple(logp.shape)}, got {tuple(t.shape)}")
    if loss_type not in LOSS_TYPES:
        raise ValueError(f"loss_type must be one of {LOSS_TYPES}, got {loss_type!r}")
    if importance_sampling_level not in IMPORTANCE_SAMPLING_LEVELS:
        raise ValueError(
            f"importance_sampling_level must be one of {IMPORTANCE_SAMPLING_LEVELS}, "
            f"got {importance_sampling_level!r}"
        )
    if importance_sampling_mode is not None and importance_sampling_mode not in IMPORTANCE_SAMPLING_MODES:
        raise ValueError(
            f"importance_sampling_mode must be None or one of {IMPORTANCE_SAMPLING_MODES}, "
            f"got {importance_sampling_mode!r}"
        )
    if importance_sampling_mode is not None and tensors["behaviour_logp"] is None:
        raise ValueError(f"importance_sampling_mode={importance_sampling_mode!r} needs behaviour_logp")
    if beta != 0.0 and tensors["ref_logp"] is None:
        raise ValueError(f"beta={beta} needs ref_logp (log-probs of the frozen reference model)")
    if loss_type == "dr_grpo" and not max_completion_length:
        raise ValueError("loss_type='dr_grpo' needs max_completion_length")


def _capped(xp, log_w, log_cap: float, zero_above_cap: bool):
    """min(exp(log_w), cap), or exp(log_w) zeroed above the cap, without overflowing exp."""
    over_cap = log_w > log_cap
    weights = xp.exp(xp.minimum(log_w, log_cap))
    if zero_above_cap:
        weights = xp.where(over_cap, 0.0, weights).astype(log_w.dtype)
    return weights, over_cap


def _importance_weights(xp, old, behaviour, m, seq_ids, num_seqs, correction: str, cap: float):
    """Behaviour-policy correction w (T,) and its metrics; see the module docstring.

    Stats are taken over loss tokens (token level) or over sequences with loss tokens (sequence level).
    """
    diff = (old - behaviour) * m
    zero_above_cap = correction.endswith("_mask")
    if correction.startswith("sequence"):  # TRL sums (not averages): the product of the token ratios
        seq_log_w = _segment_sum(xp, diff, seq_ids, num_seqs)
        seq_weights, over = _capped(xp, seq_log_w, math.log(cap), zero_above_cap)
        weights, w, sel = seq_weights[seq_ids], seq_weights, _segment_sum(xp, m, seq_ids, num_seqs) > 0
    else:
        weights, over = _capped(xp, diff, math.log(cap), zero_above_cap)
        w, sel = weights, m > 0
    count = xp.maximum(sel.sum(), 1)
    any_selected = sel.any()
    kind = "masked_fraction" if zero_above_cap else "truncated_fraction"
    metrics = {
        "is_weight/mean": xp.where(sel, w, 0).sum() / count,
        "is_weight/min": xp.where(any_selected, xp.where(sel, w, xp.inf).min(), 0.0),
        "is_weight/max": xp.where(any_selected, xp.where(sel, w, -xp.inf).max(), 0.0),
        f"is_weight/{kind}": (over & sel).sum() / count,
    }
    return weights, metrics


def _token_weights(xp, m, tokens_per_seq, seq_ids, num_seqs, loss_type, max_completion_length,
                   num_items_in_batch, num_sequences_in_batch, num_micro_batches):
    """Per-token factor turning per-token losses into the scalar loss: loss = sum(weight * l)."""
    sequences = num_sequences_in_batch if num_sequences_in_batch is not None else num_seqs * num_micro_batches
    if loss_type == "grpo":
        return m / xp.maximum(tokens_per_seq, 1.0)[seq_ids] / sequences
    if loss_type == "dr_grpo":
        return m / (sequences * max_completion_length)
    if loss_type == "bnpo":
        return m / (xp.maximum(m.sum(), 1.0) * num_micro_batches)
    normaliser = max(num_items_in_batch, 1.0) if num_items_in_batch is not None else xp.maximum(m.sum(), 1.0)
    return m / normaliser  # dapo


def policy_loss(
    logp,
    old_logp,
    advantages,
    mask,
    cu_seqlens,
    *,
    loss_type: str = "dapo",
    epsilon: float = 0.2,
    epsilon_high: float | None = None,
    beta: float = 0.0,
    ref_logp=None,
    importance_sampling_level: str = "token",
    max_completion_length: int | None = None,
    behaviour_logp=None,
    importance_sampling_mode: str | None = None,
    importance_sampling_cap: float = 3.0,
    num_items_in_batch: float | None = None,
    num_sequences_in_batch: int | None = None,
    num_micro_batches: int = 1,
):
    """Clipped policy-gradient loss of the GRPO family on packed tokens, with its gradient.

    logp (T,): current policy log-probs of the tokens; the only input the gradient is taken against.
    old_logp (T,) or None: log-probs of the policy that generated the rollouts, as computed by the
        trainer (TRL's old_per_token_logps); None means "same as logp" (num_iterations == 1): ratio 1.
    advantages (T,): each token's advantage (its sequence's, broadcast). mask (T,): 1 on loss tokens.
    cu_seqlens (S+1,): sequence boundaries. ref_logp (T,): frozen reference, needed when beta != 0.
    behaviour_logp (T,): the engine's sampling log-probs; with `importance_sampling_mode` (one of
        "token_truncate" (TIS), "token_mask", "sequence_truncate", "sequence_mask" (MIS)) the per-token
        loss is weighted by exp(old - behaviour), capped at `importance_sampling_cap` or zeroed above it.
    epsilon_high defaults to epsilon (symmetric clip); DAPO's clip-higher sets it larger.
    Returns (loss: float, dlogp: (T,) array, metrics: dict of floats): clip_ratio/{low,high,region},
    kl (when ref_logp is given) and is_weight/* (when a correction is on).
    """
    _check_policy_args(
        logp, {"old_logp": old_logp, "advantages": advantages, "mask": mask, "ref_logp": ref_logp,
               "behaviour_logp": behaviour_logp},
        loss_type, importance_sampling_level, importance_sampling_mode, beta, max_completion_length,
    )
    xp = xp_of(logp)
    dt = _compute_dtype(logp)
    lp, m, adv = logp.astype(dt), mask.astype(dt), advantages.astype(dt)
    old = lp if old_logp is None else old_logp.astype(dt)
    seq_ids, num_seqs = _sequence_ids(xp, cu_seqlens, lp.shape[0])
    tokens_per_seq = _segment_sum(xp, m, seq_ids, num_seqs)
    eps_low, eps_high = epsilon, epsilon if epsilon_high is None else epsilon_high

    log_ratio = lp - old
    if importance_sampling_level == "sequence":  # GSPO: one ratio per sequence, geometric mean
        seq_log_ratio = _segment_sum(xp, log_ratio * m, seq_ids, num_seqs) / xp.maximum(tokens_per_seq, 1.0)
        log_ratio = seq_log_ratio[seq_ids]
    ratio = xp.exp(log_ratio)
    clipped_ratio = xp.clip(ratio, 1.0 - eps_low, 1.0 + eps_high)
    surrogate = -xp.minimum(ratio * adv, clipped_ratio * adv)
    low_clipped = (ratio < 1.0 - eps_low) & (adv < 0)
    high_clipped = (ratio > 1.0 + eps_high) & (adv > 0)
    d_surrogate_d_ratio = xp.where(low_clipped | high_clipped, 0.0, -adv).astype(dt)

    metrics = {}
    is_weights = xp.ones_like(lp)
    if importance_sampling_mode is not None:
        is_weights, is_metrics = _importance_weights(
            xp, old, behaviour_logp.astype(dt), m, seq_ids, num_seqs, importance_sampling_mode,
            importance_sampling_cap,
        )
        metrics.update(is_metrics)
    per_token = surrogate * is_weights
    weights = _token_weights(xp, m, tokens_per_seq, seq_ids, num_seqs, loss_type, max_completion_length,
                             num_items_in_batch, num_sequences_in_batch, num_micro_batches)

    d_ratio = weights * is_weights * d_surrogate_d_ratio  # dloss / dratio_t
    if importance_sampling_level == "token":
        dlogp = d_ratio * ratio
    else:  # dratio_s / dlogp_u = ratio_s * m_u / n_s for every u in sequence s
        d_seq = _segment_sum(xp, d_ratio, seq_ids, num_seqs) / xp.maximum(tokens_per_seq, 1.0)
        dlogp = d_seq[seq_ids] * ratio * m
    num_loss_tokens = xp.maximum(m.sum(), 1.0)
    if ref_logp is not None:
        ref_minus_lp = ref_logp.astype(dt) - lp
        kl = xp.exp(ref_minus_lp) - ref_minus_lp - 1.0
        metrics["kl"] = (kl * m).sum() / num_loss_tokens
        if beta != 0.0:
            per_token = per_token + beta * kl
            dlogp = dlogp + weights * beta * (1.0 - xp.exp(ref_minus_lp))
    metrics.update(_clip_metrics(xp, low_clipped, high_clipped, m, seq_ids, num_seqs, tokens_per_seq,
                                 importance_sampling_level))
    loss = (weights * per_token).sum()
    values = _to_floats(xp, {"loss": loss, **metrics})
    return values.pop("loss"), dlogp.astype(dt), values


def _clip_metrics(xp, low, high, m, seq_ids, num_seqs, tokens_per_seq, level):
    """Fractions of loss tokens (token level) or of sequences (sequence level) whose clip is active."""
    flags = {"clip_ratio/low": low, "clip_ratio/high": high, "clip_ratio/region": low | high}
    if level == "token":
        count = xp.maximum(m.sum(), 1.0)
        return {k: (f * m).sum() / count for k, f in flags.items()}
    has_tokens = tokens_per_seq > 0
    count = xp.maximum(has_tokens.sum(), 1)
    per_seq = {k: _segment_sum(xp, f * m, seq_ids, num_seqs) / xp.maximum(tokens_per_seq, 1.0)
               for k, f in flags.items()}
    return {k: xp.where(has_tokens, v, 0).sum() / count for k, v in per_seq.items()}


# ---------------------------------------------------------------------------------------------------------
# SFT loss and engine/trainer mismatch


def sft_loss(logp, mask, normaliser: float | None = None):
    """Masked negative log-likelihood: -sum(mask * logp) / normaliser, with dlogp.

    normaliser defaults to the number of loss tokens in this call; when micro-batching pass the loss
    tokens of the whole optimizer step so the accumulated gradient is the mean over all of them.
    Returns (loss: float, dlogp (T,)).
    """
    if logp.shape != mask.shape:
        raise ValueError(f"logp {tuple(logp.shape)} and mask {tuple(mask.shape)} must have the same shape")
    xp = xp_of(logp)
    dt = _compute_dtype(logp)
    m = mask.astype(dt)
    n = normaliser if normaliser is not None else xp.maximum(m.sum(), 1.0)
    dlogp = -m / n
    return float((dlogp * logp.astype(dt)).sum()), dlogp.astype(dt)


def logprob_mismatch(engine_logp, trainer_logp, mask) -> dict:
    """How far the engine's sampling log-probs are from the trainer's, over loss tokens.

    Returns floats: max, mean and p99 of |trainer - engine|, and kl: the k3 estimate of
    KL(engine || trainer) from the engine's samples, mean of exp(d) - d - 1 with d = trainer - engine.
    Both sides run the same code in barerl, so all of these should be ~0.
    """
    xp = xp_of(engine_logp, trainer_logp)
    sel = xp.asarray(mask) > 0
    d = (trainer_logp.astype(np.float64) - engine_logp.astype(np.float64))[sel]
    if d.size == 0:
        return {"max": 0.0, "mean": 0.0, "p99": 0.0, "kl": 0.0}
    a = xp.abs(d)
    return _to_floats(xp, {"max": a.max(), "mean": a.mean(), "p99": xp.percentile(a, 99),
                           "kl": (xp.exp(d) - d - 1.0).mean()})
