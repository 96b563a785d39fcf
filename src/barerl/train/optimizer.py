"""AdamW over the flat parameter buffer: fp32 master weights, fp32 moments, one fused update per step.

Design:
- The optimizer owns four flat fp32 buffers laid out like the model's (`ParameterBuffer`): gradients,
  master weights and the two moments. Backward passes accumulate into `grads`; `step` turns them into an
  update of the master weights and writes the working weights (the model's own buffer, which the engine
  reads) in the same pass. When the working weights are already fp32 they *are* the master weights: no
  second copy is kept.
- Weight decay skips norms and biases, as Hugging Face's Trainer does (`is_norm_or_bias`); the selection is
  a per-element mask built once, so the update stays one elementwise pass.
- Clipping by global norm is folded into the update as a gradient scale (torch's `clip_grad_norm_`
  formula), so the gradient buffer is never rewritten. A step whose gradient norm is not finite is skipped
  (nothing changes, the step count does not advance) and reported in the metrics.
- bf16 working weights are rounded from the master stochastically (`rounding_seed`, see
  backend.ref.optim): round-to-nearest would lose every update below half a bf16 step, which at RL's
  learning rates is nearly all of them (a SmolLM2 GRPO run stayed flat until this; fp32 learned).
- Arrays are NumPy or CuPy, whatever the model's buffer is; the math is `backend.grad_norm` and
  `backend.adamw_step`, so this file is the same on every device.
- `offload()` (GRPO's `offload_optimizer`) moves the fp32 state to (pinned) host memory and drops the
  gradient buffer, which is all zeros between a step and the next backward, so that the engine's KV cache
  can use that memory while it generates. The gradients come back as zeros when a backward first asks for
  them, the state just before the next step (or a state_dict / load): results do not change.
"""

from __future__ import annotations

import math
from types import ModuleType

import numpy as np

from barerl.backend.ref.optim import BFLOAT16, stochastic_round_bfloat16
from barerl.model.weights import ParameterBuffer, is_norm_or_bias

ARRAY_KEYS = ("master", "exp_avg", "exp_avg_sq")


class AdamW:
    def __init__(
        self,
        params: ParameterBuffer,
        backend: ModuleType,
        betas: tuple[float, float] = (0.9, 0.999),
        eps: float = 1e-8,
        weight_decay: float = 0.0,
        max_grad_norm: float | None = 1.0,
        rounding_seed: int | None = None,
    ):
        self.params = params  # working weights: the model's buffer, rewritten by every step
        self.backend = backend
        self.beta1, self.beta2 = betas
        self.eps = eps
        self.weight_decay = weight_decay
        self.max_grad_norm = max_grad_norm
        self.step_count = 0
        # Stochastic rounding applies to bf16 working weights only (fp16 and fp32 round to nearest).
        self.rounding_seed = rounding_seed if params.flat.dtype == BFLOAT16 else None
        cfg, xp = params.cfg, backend.xp_of(params.flat)
        self.shares_master = params.flat.dtype == np.float32
        master_flat = params.flat if self.shares_master else params.flat.astype(np.float32)
        self.master = ParameterBuffer(cfg, master_flat)
        self.exp_avg = ParameterBuffer.zeros(cfg, xp, np.float32)
        self.exp_avg_sq = ParameterBuffer.zeros(cfg, xp, np.float32)
        self._grads: ParameterBuffer | None = ParameterBuffer.zeros(cfg, xp, np.float32)
        self.decay_mask = self._build_decay_mask(xp) if weight_decay else None
        self.xp = xp
        self.offloaded = False
        self._host: dict[str, np.ndarray] = {}  # offload's host buffers, kept for the next offload

    @classmethod
    def from_config(cls, params: ParameterBuffer, backend: ModuleType, cfg) -> AdamW:
        """From a `barerl.train.config.TrainConfig` (adam_beta1/2, adam_epsilon, weight_decay, max_grad_norm,
        stochastic_rounding with the run's seed)."""
        return cls(params, backend, betas=(cfg.adam_beta1, cfg.adam_beta2), eps=cfg.adam_epsilon,
                   weight_decay=cfg.weight_decay, max_grad_norm=cfg.max_grad_norm,
                   rounding_seed=cfg.seed if cfg.stochastic_rounding else None)

    def _build_decay_mask(self, xp):
        mask = np.ones(self.master.flat.shape[0], dtype=np.uint8)
        for name, (offset, shape) in self.master.offsets.items():
            if is_norm_or_bias(name):
                mask[offset : offset + math.prod(shape)] = 0
        return xp.asarray(mask)

    @property
    def grads(self) -> ParameterBuffer:
        """The fp32 gradient buffer backward passes accumulate into (zeros again after an offload)."""
        if self._grads is None:
            self._grads = ParameterBuffer.zeros(self.params.cfg, self.xp, np.float32)
        return self._grads

    def zero_grad(self) -> None:
        if self._grads is not None:
            self._grads.flat.fill(0)

    def _offloadable(self) -> tuple[str, ...]:
        return ARRAY_KEYS[1:] if self.shares_master else ARRAY_KEYS  # a shared master is the model itself

    def offload(self) -> None:
        """Master weights (unless shared) and moments to host memory, the gradient buffer dropped."""
        if self.offloaded:
            return
        for key in self._offloadable():
            device = getattr(self, key).flat
            if key not in self._host:
                self._host[key] = _host_buffer(self.xp, device.shape)
            if self.xp is np:
                self._host[key][...] = device
            else:
                device.get(out=self._host[key])
            setattr(self, key, ParameterBuffer(self.params.cfg, self._host[key]))
        self._grads = None
        self.offloaded = True
        _release_cached_device_memory(self.xp)

    def restore(self) -> None:
        """The offloaded state back on the device (the step, state_dict and load_state_dict call this)."""
        if not self.offloaded:
            return
        _release_cached_device_memory(self.xp)  # freed activations first: the state takes their place
        for key in self._offloadable():
            host = getattr(self, key).flat
            device = host.copy() if self.xp is np else self.xp.asarray(host)
            setattr(self, key, ParameterBuffer(self.params.cfg, device))
        self.offloaded = False

    def step(self, lr: float, grad_scale: float = 1.0) -> dict:
        """Apply the accumulated gradients (times grad_scale), clipped to max_grad_norm.

        Returns metrics: grad_norm (of grad * grad_scale, before clipping), clipped (1.0 if clipping
        scaled the update down), skipped (1.0 if the norm was not finite and nothing was updated), lr.
        """
        self.restore()
        norm = self.backend.grad_norm(self.grads.flat) * abs(grad_scale)
        metrics = {"grad_norm": norm, "clipped": 0.0, "skipped": 0.0, "lr": lr}
        if not math.isfinite(norm):
            metrics["skipped"] = 1.0
            return metrics
        scale = grad_scale
        if self.max_grad_norm is not None and self.max_grad_norm > 0:
            clip_coef = self.max_grad_norm / (norm + 1e-6)  # torch.nn.utils.clip_grad_norm_
            if clip_coef < 1.0:
                scale *= clip_coef
                metrics["clipped"] = 1.0
        self.step_count += 1
        self.backend.adamw_step(
            self.master.flat, self.grads.flat, self.exp_avg.flat, self.exp_avg_sq.flat, self.decay_mask,
            lr, self.beta1, self.beta2, self.eps, self.weight_decay, self.step_count, grad_scale=scale,
            working_out=None if self.shares_master else self.params.flat, rounding_seed=self.rounding_seed,
        )
        return metrics

    def hyperparameters(self) -> dict:
        return {"betas": [self.beta1, self.beta2], "eps": self.eps, "weight_decay": self.weight_decay,
                "max_grad_norm": self.max_grad_norm, "rounding_seed": self.rounding_seed}

    def state_dict(self) -> dict:
        """{"step": int, "hyperparameters": dict, "arrays": {name: flat fp32 array (NumPy or CuPy)}}."""
        self.restore()
        arrays = {"master": self.master.flat, "exp_avg": self.exp_avg.flat, "exp_avg_sq": self.exp_avg_sq.flat}
        return {"step": self.step_count, "hyperparameters": self.hyperparameters(), "arrays": arrays}

    def load_state_dict(self, state: dict) -> None:
        """Copy a state_dict's arrays (NumPy or CuPy) into this optimizer, then refresh the working weights.

        Hyperparameters are not taken from the state: the run's config decides them (a resumed run may
        change e.g. weight decay on purpose).
        """
        self.restore()
        arrays = state["arrays"]
        missing = [k for k in ARRAY_KEYS if k not in arrays]
        if missing:
            raise ValueError(f"optimizer state lacks arrays {missing}")
        xp = self.backend.xp_of(self.master.flat)
        for key in ARRAY_KEYS:
            target = getattr(self, key).flat
            if tuple(arrays[key].shape) != tuple(target.shape):
                raise ValueError(
                    f"optimizer state {key!r} has shape {tuple(arrays[key].shape)}, this model needs "
                    f"{tuple(target.shape)} (a checkpoint of another model?)"
                )
            target[...] = xp.asarray(arrays[key], dtype=np.float32)
        self.step_count = int(state["step"])
        if self.shares_master:
            return
        if self.rounding_seed is not None and self.step_count > 0:  # the very weights the last step wrote
            self.params.flat[...] = stochastic_round_bfloat16(self.master.flat, self.rounding_seed, self.step_count)
        else:
            self.params.flat[...] = self.master.flat.astype(self.params.flat.dtype)


def _host_buffer(xp, shape) -> np.ndarray:
    """Page-locked host memory for a CuPy array's copy (transfers at the link's full rate), else plain."""
    if xp is np:
        return np.empty(shape, np.float32)
    import cupyx

    return cupyx.empty_pinned(shape, np.float32)


def _release_cached_device_memory(xp) -> None:
    """CuPy's pool keeps freed blocks for reuse; give them back, so memory outside the pool (the engine's
    KV cache) can take their place."""
    if xp is not np:
        xp.get_default_memory_pool().free_all_blocks()
