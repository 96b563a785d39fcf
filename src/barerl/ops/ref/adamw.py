"""Reference optimizer ops: global gradient norm and a fused AdamW step over one flat parameter buffer.

Every trainable tensor lives in one flat buffer (`model.weights.ParameterBuffer`), and the gradients, the
fp32 master copy and both moments share its layout, so the whole optimizer is a single elementwise pass
over flat (N,) arrays. The signatures are the CUDA kernels' contracts:

- `grad_norm(grad)`: one reduction, fp32 accumulation whatever the gradient dtype.
- `adamw_step(...)`: reads grad, updates master and the moments in place and writes the working weights
  (bf16 / fp16 / fp32, what forward passes and the inference engine read) in place: that write is how
  the engine sees the update. Weight decay is selected per element by `decay_mask` (uint8/bool, 1 byte per
  parameter), which a kernel reads with plain indexing; `None` decays everything.
- `grad_scale` multiplies the gradient on the fly (gradient clipping, 1/num_tokens normalisation), so the
  gradient buffer is never rewritten.
- `rounding_seed` (bf16 working weights) rounds the master to bf16 stochastically instead of to nearest:
  up with probability equal to the distance from the lower neighbour, in units of the gap, so the working
  weights equal the master in expectation. Rounding to nearest loses every update smaller than half a bf16
  step (2^-9 relative) for good when the master starts on the bf16 grid (any bf16 checkpoint): at RL's
  learning rates (1e-6 .. 1e-5) the policy then does not move. The 16 random bits of element i at step t are
  `splitmix64(seed, t * 2^40 + i + 1) >> 48`, a pure function, so a resumed run rewrites the same weights.
- `offset` is the index of the arrays' element 0 in the whole buffer (its rounding counter), so a caller that
  updates the buffer slice by slice (the optimizer's offloaded state, streamed through the device) gets the
  same bits as one call over all of it.
- `master_low16` (with stochastic rounding) holds the master as its low 16 bits alone: the working weight's
  bits are (master's bits + the step's 16 random bits) >> 16, so the high half is the working weight's bits
  less the carry out of (low half + random bits), and `master_from_low16` rebuilds the very fp32 value. The
  offloaded optimizer keeps its master so: 2 bytes a parameter instead of 4, each way over the link.

The math is torch.optim.AdamW's (decoupled decay, bias correction on the step size and on sqrt(v)). The
arrays are processed in chunks, as a kernel's grid would, so the temporaries stay small on a large model.
"""

from __future__ import annotations

import math

import numpy as np

from barerl.ops.common import BFLOAT16, xp_of
from barerl.ops.ref.counter_rng import splitmix64

__all__ = ["adamw_step", "grad_norm", "master_from_low16", "stochastic_round_bfloat16"]

CHUNK = 1 << 20  # elements per chunk: bounds the fp32 temporaries (a few MiB each)


def grad_norm(grad) -> float:
    """Global L2 norm of a flat gradient (N,), accumulated in fp32 (then fp64 across chunks)."""
    xp = xp_of(grad)
    total = 0.0
    for start in range(0, grad.shape[0], CHUNK):
        g = grad[start : start + CHUNK].astype(np.float32, copy=False)
        total += float(xp.dot(g, g))
    return math.sqrt(total)


def adamw_step(
    master,
    grad,
    exp_avg,
    exp_avg_sq,
    decay_mask,
    lr: float,
    beta1: float,
    beta2: float,
    eps: float,
    weight_decay: float,
    step: int,
    grad_scale: float = 1.0,
    working_out=None,
    rounding_seed: int | None = None,
    offset: int = 0,
    master_low16=None,
) -> None:
    """One AdamW update, in place, on flat (N,) arrays.

    master (N,) fp32       parameters, updated in place (None with master_low16)
    grad (N,) any float     read only; the gradient used is grad * grad_scale
    exp_avg, exp_avg_sq     (N,) fp32 first and second moments, updated in place
    decay_mask (N,) or None nonzero where weight decay applies; None: everywhere
    step                    1-based count of this update (bias correction)
    working_out (N,) or None the working weights, overwritten with master cast to their dtype
    rounding_seed           None: round to nearest; an int: stochastic rounding (bf16 working weights only)
    offset                  element 0's index in the whole buffer (the rounding's counter)
    master_low16 (N,) uint16 or None: the master as its low halves, with working_out (rounded stochastically
                            at step - 1) holding the rest; updated in place
    """
    if step < 1:
        raise ValueError(f"adamw_step: step is 1-based, got {step}")
    if (master is None) == (master_low16 is None):
        raise ValueError("adamw_step: give master or master_low16, not both")
    if master_low16 is not None and (rounding_seed is None or master_low16.dtype != np.uint16):
        raise ValueError("adamw_step: master_low16 (uint16) needs stochastic rounding (rounding_seed)")
    n = (master if master is not None else master_low16).shape[0]
    for name, a in (("grad", grad), ("exp_avg", exp_avg), ("exp_avg_sq", exp_avg_sq),
                    ("decay_mask", decay_mask), ("working_out", working_out), ("master_low16", master_low16)):
        if a is not None and a.shape != (n,):
            raise ValueError(f"adamw_step: {name} has shape {a.shape}, master has ({n},)")
    if rounding_seed is not None and (working_out is None or working_out.dtype != BFLOAT16):
        raise ValueError("adamw_step: stochastic rounding (rounding_seed) needs bf16 working_out")
    step_size = lr / (1.0 - beta1**step)
    bias_correction2_sqrt = math.sqrt(1.0 - beta2**step)
    decay = np.float32(1.0 - lr * weight_decay)
    for start in range(0, n, CHUNK):
        s = slice(start, start + CHUNK)
        m, v = exp_avg[s], exp_avg_sq[s]
        if master is not None:
            p = master[s]
        else:
            p = master_from_low16(working_out[s], master_low16[s], rounding_seed, step - 1, offset + start)
        g = grad[s].astype(np.float32) * np.float32(grad_scale)
        if weight_decay != 0.0:
            if decay_mask is None:
                p *= decay
            else:
                p *= xp_of(p).where(decay_mask[s] != 0, decay, np.float32(1.0))
        m *= np.float32(beta1)
        m += np.float32(1.0 - beta1) * g
        v *= np.float32(beta2)
        v += np.float32(1.0 - beta2) * g * g
        denom = xp_of(p).sqrt(v) / np.float32(bias_correction2_sqrt) + np.float32(eps)
        p -= np.float32(step_size) * m / denom
        if rounding_seed is not None:
            working_out[s] = stochastic_round_bfloat16(p, rounding_seed, step, offset + start)
        elif working_out is not None:
            working_out[s] = p.astype(working_out.dtype)
        if master_low16 is not None:
            master_low16[s] = p.view(np.uint32).astype(np.uint16)  # the low half (astype truncates)


def stochastic_round_bfloat16(x, seed: int, step: int, offset: int = 0):
    """x (n,) fp32 -> bf16, rounded stochastically with the bits of elements offset .. offset + n of `step`.

    Adding 16 random bits below bf16's last mantissa bit and truncating rounds the magnitude up with
    probability (distance to the lower neighbour) / gap; sign-magnitude makes that unbiased for negative x
    too. Inf and NaN round to nearest.
    """
    xp = xp_of(x)
    random16 = _rounding_bits(xp, seed, step, offset, x.shape[0])
    bits = xp.ascontiguousarray(x, dtype=np.float32).view(xp.uint32)
    rounded = ((bits + random16) >> xp.uint32(16)).astype(xp.uint16)
    nearest = x.astype(BFLOAT16).view(xp.uint16)
    # selected as bits: CuPy's where() would promote bf16 operands to fp32
    special = (bits & xp.uint32(0x7F800000)) == xp.uint32(0x7F800000)
    return xp.where(special, nearest, rounded).view(BFLOAT16)


def master_from_low16(working, low16, seed: int, step: int, offset: int = 0):
    """The fp32 master whose stochastic rounding at `step` gave the bf16 `working` and whose low 16 bits are
    `low16` (elements offset .. offset + n): high half = working's bits - carry(low16 + the step's bits). Exact
    for every master rounded that way (not for Inf / NaN, which round to nearest)."""
    xp = xp_of(working)
    low = low16.astype(np.uint32)
    carry = (low + _rounding_bits(xp, seed, step, offset, low.shape[0])) >> np.uint32(16)
    high = working.view(np.uint16).astype(np.uint32) - carry
    return ((high << np.uint32(16)) | low).view(np.float32)


def _rounding_bits(xp, seed: int, step: int, offset: int, n: int):
    """The 16 random bits (uint32) of elements offset .. offset + n at `step`."""
    u64 = xp.uint64
    key = (u64(step) << u64(40)) + xp.arange(offset, offset + n, dtype=u64) + u64(1)
    return (splitmix64(u64(seed), key) >> u64(48)).astype(xp.uint32)
