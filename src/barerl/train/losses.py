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
    delta       two-sided clipping (INTELLECT-2): the first r_t is min(r_t, delta)
    top_entropy_quantile < 1: the surrogate only on loss tokens whose entropy is at least the
                  (1 - q)-quantile of the call's loss tokens (TRL's high-entropy mask; the KL term stays
                  on every token, and the normalisation still counts every token)
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
- `PolicyLoss` is prepared once per micro-batch with all that does not depend on `logp` (normalising
  weights, casts); `policy_loss` is the one-call form.
- Token-local losses: where d loss / d logp_t needs logp_t alone (SFT; the policy loss at token level,
  with no correction or a token-level one; with old_logp None the IS weight exp(logp - behaviour) takes
  logp's value, not its gradient), `sft_token_grad` and `PolicyLoss.token_grad` give dlogp one chunk of
  tokens at a time, so the model's LM head runs each chunk's backward right after its forward (one
  vocabulary GEMM per chunk, not two). The chunk path and the whole-batch loss share one elementwise
  definition (`_token_terms`). GSPO and sequence-level corrections need whole sequences: no token_grad.
"""

from __future__ import annotations

import math
from typing import TYPE_CHECKING, NamedTuple

import numpy as np

from barerl.ops.common import xp_of

if TYPE_CHECKING:
    from barerl.model.model import TokenGrad

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


def _check_policy_args(tensors: dict, loss_type, importance_sampling_level, importance_sampling_mode, beta,
                       max_completion_length):
    """tensors: name -> array or None; the first is (T,) and the others must have its shape."""
    (first, reference), *others = tensors.items()
    if reference.ndim != 1:
        raise ValueError(f"{first} must be (T,), got shape {tuple(reference.shape)}")
    for name, t in others:
        if t is not None and tuple(t.shape) != tuple(reference.shape):
            raise ValueError(f"{name} must have {first}'s shape {tuple(reference.shape)}, "
                             f"got {tuple(t.shape)}")
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


def _token_importance_weights(xp, old, behaviour, m, correction: str, cap: float):
    """A token-level correction's w_t = exp(old_t - behaviour_t) on loss tokens, capped as `_capped` says,
    over any slice of the tokens, and where it was over the cap."""
    return _capped(xp, (old - behaviour) * m, math.log(cap), correction.endswith("_mask"))


def _importance_weights(xp, old, behaviour, m, seq_ids, num_seqs, correction: str, cap: float):
    """Behaviour-policy correction w (T,) and its metrics; see the module docstring.

    Stats are taken over loss tokens (token level) or over sequences with loss tokens (sequence level).
    """
    zero_above_cap = correction.endswith("_mask")
    if correction.startswith("sequence"):  # TRL sums (not averages): the product of the token ratios
        seq_log_w = _segment_sum(xp, (old - behaviour) * m, seq_ids, num_seqs)
        seq_weights, over = _capped(xp, seq_log_w, math.log(cap), zero_above_cap)
        weights, w, sel = seq_weights[seq_ids], seq_weights, _segment_sum(xp, m, seq_ids, num_seqs) > 0
    else:
        weights, over = _token_importance_weights(xp, old, behaviour, m, correction, cap)
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


class _TokenTerms(NamedTuple):
    """The elementwise part of the policy loss at each token of a slice of them (see `_token_terms`)."""

    ratio: object  # r_t
    per_token: object  # l_t = w_t * surrogate_t + beta * kl_t
    d_ratio: object  # d loss / d r_t: normalising weight * w_t * d surrogate_t / d r_t
    d_kl: object  # d loss / d logp_t through kl_t (0 without the KL term)
    low_clipped: object
    high_clipped: object
    kl: object  # k3 estimate of each token, None without ref

    @property
    def token_level_dlogp(self):
        """d loss / d logp_t where r_t = exp(logp_t - old_t), so that dr_t / dlogp_t = r_t."""
        return self.d_ratio * self.ratio + self.d_kl


def _token_terms(xp, lp, log_ratio, adv, weights, is_weights, ref, beta, eps_low, eps_high,
                 delta=None) -> _TokenTerms:
    """The loss's elementwise part over any slice of the tokens (all of them for the loss, one chunk for the
    fused head's gradient): one definition, so the two cannot disagree. ref None: no KL term or metric."""
    ratio = xp.exp(log_ratio)
    clipped_ratio = xp.clip(ratio, 1.0 - eps_low, 1.0 + eps_high)
    unclipped = ratio if delta is None else xp.minimum(ratio, delta)
    surrogate = -xp.minimum(unclipped * adv, clipped_ratio * adv)
    low_clipped = (ratio < 1.0 - eps_low) & (adv < 0)
    high_clipped = (ratio > 1.0 + eps_high) & (adv > 0)
    no_gradient = low_clipped | high_clipped
    if delta is not None:  # min(r, delta) is flat above delta: A > 0 takes it there, A < 0 once above the clip
        no_gradient = no_gradient | ((ratio > delta) & ((adv > 0) | ((adv < 0) & (ratio > 1.0 + eps_high))))
    d_surrogate_d_ratio = xp.where(no_gradient, 0.0, -adv).astype(lp.dtype)
    per_token, d_kl, kl = surrogate * is_weights, 0.0, None
    if ref is not None:
        ref_minus_lp = ref - lp
        e = xp.exp(ref_minus_lp)
        kl = e - ref_minus_lp - 1.0
        if beta != 0.0:
            per_token = per_token + beta * kl
            d_kl = weights * beta * (1.0 - e)
    d_ratio = weights * is_weights * d_surrogate_d_ratio
    return _TokenTerms(ratio, per_token, d_ratio, d_kl, low_clipped, high_clipped, kl)


class PolicyLoss:
    """Clipped policy-gradient loss of the GRPO family on one micro-batch's packed tokens, with its gradient.

    Built before the log-probs exist, it holds what does not depend on them (each token's normalising
    weight; advantages, mask, old / behaviour / reference log-probs in the arithmetic's dtype). Called on
    logp (T,), the current policy's log-probs of the tokens (the only input the gradient is taken against),
    it returns (loss: float, dlogp: (T,) array, metrics: dict of floats): clip_ratio/{low,high,region},
    kl (when ref_logp is given) and is_weight/* (when a correction is on). `token_grad` gives the same
    dlogp a chunk of tokens at a time, where that is possible.

    old_logp (T,) or None: log-probs of the policy that generated the rollouts, as computed by the
        trainer (TRL's old_per_token_logps); None means "same as logp" (num_iterations == 1): ratio 1.
    advantages (T,): each token's advantage (its sequence's, broadcast). mask (T,): 1 on loss tokens.
    cu_seqlens (S+1,): sequence boundaries. ref_logp (T,): frozen reference, needed when beta != 0.
    behaviour_logp (T,): the engine's sampling log-probs; with `importance_sampling_mode` (one of
        "token_truncate" (TIS), "token_mask", "sequence_truncate", "sequence_mask" (MIS)) the per-token
        loss is weighted by exp(old - behaviour), capped at `importance_sampling_cap` or zeroed above it.
    epsilon_high defaults to epsilon (symmetric clip); DAPO's clip-higher sets it larger. delta (None: off)
        caps the unclipped ratio (two-sided clipping). top_entropy_quantile < 1 keeps the surrogate on the
        high-entropy share of the loss tokens only: the call then needs `entropy` (T,), and there is no
        token_grad (the mask needs every token's entropy first).
    dtype: of the arithmetic and of dlogp: fp32 (the model's log-probs), or fp64 (finite differences).
    """

    def __init__(
        self,
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
        delta: float | None = None,
        top_entropy_quantile: float = 1.0,
        dtype=np.float32,
    ):
        _check_policy_args(
            {"mask": mask, "old_logp": old_logp, "advantages": advantages, "ref_logp": ref_logp,
             "behaviour_logp": behaviour_logp},
            loss_type, importance_sampling_level, importance_sampling_mode, beta, max_completion_length,
        )
        self.xp = xp = xp_of(mask, advantages)
        self.dtype = dtype
        cast = lambda x: None if x is None else x.astype(dtype)
        self.mask, self.advantages = cast(mask), cast(advantages)
        self.old, self.behaviour, self.ref = cast(old_logp), cast(behaviour_logp), cast(ref_logp)
        self.seq_ids, self.num_seqs = _sequence_ids(xp, cu_seqlens, mask.shape[0])
        self.tokens_per_seq = _segment_sum(xp, self.mask, self.seq_ids, self.num_seqs)
        self.weights = _token_weights(xp, self.mask, self.tokens_per_seq, self.seq_ids, self.num_seqs,
                                      loss_type, max_completion_length, num_items_in_batch,
                                      num_sequences_in_batch, num_micro_batches)
        self.epsilon = (epsilon, epsilon if epsilon_high is None else epsilon_high)
        self.beta, self.level = beta, importance_sampling_level
        self.correction, self.cap = importance_sampling_mode, importance_sampling_cap
        self.delta, self.top_entropy_quantile = delta, top_entropy_quantile

    def __call__(self, logp, entropy=None) -> tuple[float, object, dict]:
        if tuple(logp.shape) != tuple(self.mask.shape):
            raise ValueError(f"logp must have mask's shape {tuple(self.mask.shape)}, got {tuple(logp.shape)}")
        xp, m, seq_ids, num_seqs = self.xp, self.mask, self.seq_ids, self.num_seqs
        seq_tokens = xp.maximum(self.tokens_per_seq, 1.0)
        lp = logp.astype(self.dtype)
        old = lp if self.old is None else self.old
        log_ratio = lp - old
        if self.level == "sequence":  # GSPO: one ratio per sequence, geometric mean
            log_ratio = (_segment_sum(xp, log_ratio * m, seq_ids, num_seqs) / seq_tokens)[seq_ids]
        metrics, is_weights = {}, 1.0
        if self.correction is not None:
            is_weights, metrics = _importance_weights(xp, old, self.behaviour, m, seq_ids, num_seqs,
                                                      self.correction, self.cap)
        if self.top_entropy_quantile < 1.0:  # a 0/1 factor on the surrogate, as the IS weight is one
            is_weights = is_weights * self._high_entropy(entropy)
        terms = _token_terms(xp, lp, log_ratio, self.advantages, self.weights, is_weights, self.ref,
                             self.beta, *self.epsilon, self.delta)
        if self.level == "token":
            dlogp = terms.token_level_dlogp
        else:  # dratio_s / dlogp_u = ratio_s * m_u / n_s for every u in sequence s
            d_seq = _segment_sum(xp, terms.d_ratio, seq_ids, num_seqs) / seq_tokens
            dlogp = d_seq[seq_ids] * terms.ratio * m + terms.d_kl
        if terms.kl is not None:
            metrics["kl"] = (terms.kl * m).sum() / xp.maximum(m.sum(), 1.0)
        metrics.update(_clip_metrics(xp, terms.low_clipped, terms.high_clipped, m, seq_ids, num_seqs,
                                     self.tokens_per_seq, self.level))
        values = _to_floats(xp, {"loss": (self.weights * terms.per_token).sum(), **metrics})
        return values.pop("loss"), dlogp.astype(self.dtype), values

    def _high_entropy(self, entropy):
        """(T,) 1.0 on loss tokens whose entropy is at least the (1 - top_entropy_quantile)-quantile of the loss
        tokens' entropies (linear interpolation, as torch.quantile), else 0.0."""
        if entropy is None or tuple(entropy.shape) != tuple(self.mask.shape):
            raise ValueError(f"top_entropy_quantile={self.top_entropy_quantile} needs the entropy of every token, "
                             f"{tuple(self.mask.shape)}")
        xp, on_loss = self.xp, self.mask > 0
        entropy = xp.asarray(entropy).astype(self.dtype)
        if not bool(on_loss.any()):
            return xp.zeros_like(self.mask)
        threshold = xp.quantile(entropy[on_loss], 1.0 - self.top_entropy_quantile)
        return ((entropy >= threshold) & on_loss).astype(self.dtype)

    @property
    def token_grad(self) -> TokenGrad | None:
        """dlogp of a chunk of tokens, (logp[start:stop], start, stop) -> dlogp[start:stop], for the model's
        fused LM head; None where a token's gradient needs its whole sequence (GSPO's sequence ratio, a
        sequence-level correction) or every token's entropy (top_entropy_quantile < 1)."""
        sequence_correction = self.correction is not None and self.correction.startswith("sequence")
        whole_batch = self.level == "sequence" or sequence_correction or self.top_entropy_quantile < 1.0
        return None if whole_batch else self._chunk_dlogp

    def _chunk_dlogp(self, logp, start: int, stop: int):
        rows = slice(start, stop)
        lp = logp.astype(self.dtype)
        old = lp if self.old is None else self.old[rows]
        is_weights = 1.0
        if self.correction is not None:  # token level: token_grad is None for the sequence-level ones
            is_weights, _ = _token_importance_weights(self.xp, old, self.behaviour[rows], self.mask[rows],
                                                      self.correction, self.cap)
        ref = self.ref[rows] if self.beta != 0.0 else None  # the kl metric is the whole-batch call's
        terms = _token_terms(self.xp, lp, lp - old, self.advantages[rows], self.weights[rows], is_weights,
                             ref, self.beta, *self.epsilon, self.delta)
        return terms.token_level_dlogp.astype(self.dtype)


def policy_loss(logp, old_logp, advantages, mask, cu_seqlens, entropy=None, **options) -> tuple[float, object, dict]:
    """`PolicyLoss(old_logp, advantages, mask, cu_seqlens, **options)(logp, entropy)`, in fp32, or in fp64 when
    logp is fp64: (loss: float, dlogp (T,), metrics: dict of floats)."""
    loss = PolicyLoss(old_logp, advantages, mask, cu_seqlens, dtype=_compute_dtype(logp), **options)
    return loss(logp, entropy)


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
    dt = _compute_dtype(logp)
    dlogp = _sft_dlogp(mask, normaliser, dt)
    return float((dlogp * logp.astype(dt)).sum()), dlogp.astype(dt)


def sft_token_grad(mask, normaliser: float | None = None) -> TokenGrad:
    """`sft_loss`'s dlogp (fp32) a chunk of tokens at a time, for the model's fused LM head: it does not even
    depend on logp."""
    dlogp = _sft_dlogp(mask, normaliser, np.float32)
    return lambda logp, start, stop: dlogp[start:stop]


def _sft_dlogp(mask, normaliser, dtype):
    xp = xp_of(mask)
    m = mask.astype(dtype)
    return -m / (normaliser if normaliser is not None else xp.maximum(m.sum(), 1.0))


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
