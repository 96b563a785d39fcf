"""AdamW over the flat parameter buffer: fp32 master weights, fp32 moments, one fused update per step.

Design:
- The optimizer owns four flat fp32 buffers over the buffer it trains (the model's `ParameterBuffer`, or under
  LoRA the adapters' `LoraWeights`: any flat layout with named views and `with_flat`): gradients (in that
  layout, `params.with_flat`), master weights and the two moments. Backward passes accumulate into `grads`;
  `step` turns them into an update of the master weights and writes the working weights (the model's own
  buffer, or the adapters', which the engine reads) in the same pass. When the working weights are already fp32 they *are* the master weights: no
  second copy is kept.
- Weight decay skips norms and biases, as Hugging Face's Trainer does (`is_norm_or_bias`); the selection is
  a per-element mask built once, so the update stays one elementwise pass.
- Clipping by global norm is folded into the update as a gradient scale (torch's `clip_grad_norm_`
  formula), so the gradient buffer is never rewritten. A step whose gradient norm is not finite is skipped
  (nothing changes, the step count does not advance) and reported in the metrics.
- bf16 working weights are rounded from the master stochastically (`rounding_seed`, see
  ops.ref.adamw): round-to-nearest would lose every update below half a bf16 step, which at RL's
  learning rates is nearly all of them (a SmolLM2 GRPO run stayed flat until this; fp32 learned).
- Arrays are NumPy or CuPy, whatever the model's buffer is; the math is `backend.grad_norm` and
  `backend.adamw_step`, so this file is the same on every device.
- `shard` (ZeRO-1, `barerl.distributed`): the optimizer updates elements [start, stop) of the buffer only and
  holds their master, moments and decay mask alone (flat arrays of the shard's length, as `state_dict`
  gives them); the gradient buffer stays whole, as backward passes fill it. Stochastic rounding draws the
  bits of the elements' indices in the whole buffer (`adamw_step`'s offset), so the shards of N ranks write
  the weights one optimizer over the whole buffer would. The caller brings the global gradient norm (the
  gradients outside the shard are not this optimizer's) and gathers the other shards' weights.
- `offload(share)` (GRPO's `offload_optimizer`, `offload_optimizer_ratio`) moves the last `share` of the
  fp32 state and of the decay mask to (pinned) host memory, keeps the rest on the device, and drops the
  gradient buffer, which is all zeros between a step and the next backward, so that the engine's KV cache
  can use that memory while it generates. The gradients come back as zeros when a backward first asks for
  them. The step then updates the device's part in place and streams the host's through the device instead
  of bringing it back: `STREAM_CHUNK` elements of master / moments / mask go up, the same `adamw_step`
  updates them (told the chunk's offset, so stochastic rounding draws the same bits) and they go back down,
  on two CUDA streams so that one chunk's download overlaps the next one's upload. The link carries the
  host's part twice per step (up and down), which is what a share below 1 saves, for the device memory its
  complement takes. The device holds the weights, the gradients, the kept part and two chunks' staging;
  results are bit-identical to a step on the device-resident state, and the state stays split (a later
  `offload()` just drops the gradients). state_dict and load_state_dict bring the state back (`restore()`).
- An offloaded master is held as its low 16 bits where the bf16 working weights hold the rest (stochastic
  rounding: ops.ref.adamw.master_from_low16), checked element by element at the offload: 10 bytes a
  parameter offloaded instead of 12, both ways. So while offloaded, the working weights are the master's
  high halves: only `step` may write them (load_state_dict restores first).
- `AdamW(..., offload=share)` starts offloaded: the state is made in its two places at once and never held
  whole on the device, which a model whose state alone nearly fills the GPU needs (Qwen3-8B: 98 GB of fp32
  master and moments, 8.2 B parameters; docs/MEMORY.md). Before the first step the master is the working
  weights widened (its low halves are zeros) and the moments are zeros, so this equals `offload(share)` of a
  resident optimizer. An offload releases each resident array as soon as it is copied, and a restore drops
  the gradient buffer first (zeros again when next asked for, as after every offload): the device then holds
  at most the weights, the whole state and one array's copy.
"""

from __future__ import annotations

import contextlib
import math
from types import ModuleType

import numpy as np

from barerl.model.lora import LoraWeights
from barerl.model.weights import ParameterBuffer, is_norm_or_bias
from barerl.ops.common import BFLOAT16
from barerl.ops.ref.adamw import master_from_low16, stochastic_round_bfloat16

ARRAY_KEYS = ("master", "exp_avg", "exp_avg_sq")
STREAM_CHUNK = 1 << 24  # elements per chunk of a streamed step: 64 MiB per fp32 array, 0.4 GiB of staging
CHECK_CHUNK = 1 << 22  # elements per pass of the master's split into halves (bounds its temporaries)


class AdamW:
    def __init__(
        self,
        params: ParameterBuffer | LoraWeights,
        backend: ModuleType,
        betas: tuple[float, float] = (0.9, 0.999),
        eps: float = 1e-8,
        weight_decay: float = 0.0,
        max_grad_norm: float | None = 1.0,
        rounding_seed: int | None = None,
        shard: slice | None = None,
        offload: float | None = None,
    ):
        self.params = params  # working weights: the model's buffer (or the adapters'), rewritten by every step
        self.shard = shard if shard is not None else slice(0, params.flat.shape[0])  # the elements it updates
        self.working = params.flat[self.shard]  # their working weights
        self.backend = backend
        self.beta1, self.beta2 = betas
        self.eps = eps
        self.weight_decay = weight_decay
        self.max_grad_norm = max_grad_norm
        self.step_count = 0
        # Stochastic rounding applies to bf16 working weights only (fp16 and fp32 round to nearest).
        self.rounding_seed = rounding_seed if params.flat.dtype == BFLOAT16 else None
        self.xp = backend.xp_of(params.flat)
        self.shares_master = params.flat.dtype == np.float32
        self.offloaded = False
        self.kept = 0  # while offloaded: elements 0 .. kept - 1 of the state stay on the device (in _device)
        self._device: dict[str, object] = {}  # while offloaded: the state's kept part
        self._host: dict[str, np.ndarray] = {}  # offload's host buffers (the rest), kept for the next offload
        self._grads: ParameterBuffer | LoraWeights | None = None
        self.master = self.working if self.shares_master else None  # flat (shard,), like the moments
        if offload is None:
            self._start_resident()
        else:
            self._start_offloaded(offload)

    def _start_resident(self) -> None:
        xp, n = self.xp, self.working.shape[0]
        if not self.shares_master:
            self.master = self.working.astype(np.float32)
        self.exp_avg = xp.zeros(n, np.float32)
        self.exp_avg_sq = xp.zeros(n, np.float32)
        self._grads = self._zero_grads()
        self.decay_mask = self._build_decay_mask(xp) if self.weight_decay else None

    @classmethod
    def from_config(cls, params: ParameterBuffer | LoraWeights, backend: ModuleType, cfg,
                    shard: slice | None = None) -> AdamW:
        """From a `barerl.train.config.TrainConfig` (adam_beta1/2, adam_epsilon, weight_decay, max_grad_norm,
        stochastic_rounding with the run's seed; GRPO's offload_optimizer and its ratio: born offloaded)."""
        offload = cfg.offload_optimizer_ratio if getattr(cfg, "offload_optimizer", False) else None
        return cls(params, backend, betas=(cfg.adam_beta1, cfg.adam_beta2), eps=cfg.adam_epsilon,
                   weight_decay=cfg.weight_decay, max_grad_norm=cfg.max_grad_norm,
                   rounding_seed=cfg.seed if cfg.stochastic_rounding else None, shard=shard, offload=offload)

    @property
    def sharded(self) -> bool:
        return self.working.shape[0] != self.params.flat.shape[0]

    def _build_decay_mask(self, xp):
        mask = np.ones(self.params.flat.shape[0], dtype=np.uint8)
        for name, (offset, shape) in self.params.offsets.items():
            if is_norm_or_bias(name):
                mask[offset : offset + math.prod(shape)] = 0
        return xp.asarray(mask[self.shard])

    def _zero_grads(self) -> ParameterBuffer | LoraWeights:
        """A zero fp32 gradient buffer in the trained buffer's layout."""
        return self.params.with_flat(self.xp.zeros(self.params.flat.shape[0], np.float32))

    @property
    def grads(self) -> ParameterBuffer | LoraWeights:
        """The fp32 gradient buffer backward passes accumulate into (zeros again after an offload)."""
        if self._grads is None:
            self._grads = self._zero_grads()
        return self._grads

    def zero_grad(self) -> None:
        if self._grads is not None:
            self._grads.flat.fill(0)

    def _offloadable(self) -> tuple[str, ...]:
        return ARRAY_KEYS[1:] if self.shares_master else ARRAY_KEYS  # a shared master is the model itself

    def _state(self) -> dict[str, object]:
        """The flat arrays an offload splits: the master (unless shared; as its low halves where the working
        weights hold the rest), the moments, the decay mask (if any)."""
        state = {key: getattr(self, key) for key in self._offloadable()}
        low = self._master_low_halves()
        if low is not None:
            state = {"master_low16": low} | {key: a for key, a in state.items() if key != "master"}
        return state | ({"decay_mask": self.decay_mask} if self.decay_mask is not None else {})

    def _master_low_halves(self):
        """The master's low 16 bits (uint16, where the master is), if the bf16 working weights are its
        stochastic rounding at the last step, so that they rebuild it exactly (checked element by element);
        else None."""
        if self.shares_master or self.rounding_seed is None:
            return None
        master, xp = self.master, self.xp
        low = xp.empty(master.shape[0], np.uint16)
        for start in range(0, master.shape[0], CHECK_CHUNK):
            rows = slice(start, start + CHECK_CHUNK)
            bits = master[rows].view(np.uint32)
            low[rows] = bits.astype(np.uint16)
            rebuilt = master_from_low16(self.working[rows], low[rows], self.rounding_seed, self.step_count,
                                        self.shard.start + start)
            if not bool((rebuilt.view(np.uint32) == bits).all()):
                return None
        return low

    def _master_from_low_halves(self, low):
        xp, n = self.xp, low.shape[0]
        master = xp.empty(n, np.float32)
        for start in range(0, n, CHECK_CHUNK):
            rows = slice(start, start + CHECK_CHUNK)
            master[rows] = master_from_low16(self.working[rows], low[rows], self.rounding_seed, self.step_count,
                                             self.shard.start + start)
        return master

    def offload(self, share: float = 1.0) -> None:
        """The last `share` (0 < share <= 1) of the state to host memory, the rest kept on the device, the
        gradient buffer dropped. Once offloaded (a streamed step leaves the state so) only the gradients are
        dropped, whatever the share."""
        _check_share(share)
        self._grads = None
        if not self.offloaded:
            n = self.working.shape[0]
            self.kept = n - round(share * n)
            state = self._state()
            # an earlier offload's buffer of the other master form (fp32 / low halves) would be streamed too
            self._host = {key: buffer for key, buffer in self._host.items() if key in state}
            for key in self._offloadable():  # the arrays live on in `state` until each is copied
                setattr(self, key, None)
            self.decay_mask = None
            for key in list(state):
                flat = state.pop(key)
                self._device[key] = flat[: self.kept].copy()
                self._to_host(key, flat[self.kept :])
                del flat  # gone before the next array's copy
            self.offloaded = True
        _release_cached_device_memory(self.xp)

    def _start_offloaded(self, share: float) -> None:
        """The state made where `offload(share)` of a fresh optimizer would leave it, never whole on the device:
        the master as the working weights widened (as its zero low halves when they rebuild it), zero moments,
        the decay mask."""
        _check_share(share)
        xp, flat = self.xp, self.working
        n = flat.shape[0]
        self.kept = kept = n - round(share * n)
        low_halves = not self.shares_master and self.rounding_seed is not None
        parts = {"master_low16": np.uint16} if low_halves else {} if self.shares_master else {"master": None}
        parts |= {"exp_avg": np.float32, "exp_avg_sq": np.float32}
        mask = self._build_decay_mask(np) if self.weight_decay else None
        if mask is not None:
            parts["decay_mask"] = np.uint8
        for key, dtype in parts.items():
            if key == "master":
                self._device[key] = flat[:kept].astype(np.float32)
            elif key == "decay_mask":
                self._device[key] = xp.asarray(mask[:kept])
            else:
                self._device[key] = xp.zeros(kept, dtype)
            self._host[key] = host = _host_buffer(xp, (n - kept,), np.float32 if dtype is None else dtype)
            if key == "decay_mask":
                host[...] = mask[kept:]
            elif key != "master":
                host.fill(0)
            else:  # widened chunk by chunk: no second whole copy of the weights on the device
                for start in range(kept, n, CHECK_CHUNK):
                    rows = slice(start, min(start + CHECK_CHUNK, n))
                    self._to_host_slice(host[rows.start - kept : rows.stop - kept], flat[rows].astype(np.float32))
        self.exp_avg = self.exp_avg_sq = self.decay_mask = None
        self.offloaded = True

    def restore(self) -> None:
        """The offloaded state back on the device, whole (state_dict and load_state_dict call this)."""
        if not self.offloaded:
            return
        self._grads = None  # zeros when next asked for, as after an offload: room for the whole state
        _release_cached_device_memory(self.xp)  # freed activations first: the state takes their place
        xp, kept = self.xp, self.kept
        for key, host in self._host.items():
            whole = xp.empty(kept + host.shape[0], host.dtype)
            whole[:kept] = self._device[key]
            whole[kept:] = host if xp is np else xp.asarray(host)
            if key == "master_low16":
                self.master = self._master_from_low_halves(whole)
            else:
                setattr(self, key, whole)
        self._device, self.kept, self.offloaded = {}, 0, False

    def _to_host(self, key: str, device) -> None:
        """device's values into this key's host buffer (allocated on first use, kept for the next offload)."""
        if key not in self._host or self._host[key].shape != device.shape or self._host[key].dtype != device.dtype:
            self._host[key] = _host_buffer(self.xp, device.shape, device.dtype)
        self._to_host_slice(self._host[key], device)

    def _to_host_slice(self, host: np.ndarray, device) -> None:
        if self.xp is np:
            host[...] = device
        else:
            device.get(out=host)

    def step(self, lr: float, grad_scale: float = 1.0, grad_norm: float | None = None) -> dict:
        """Apply the accumulated gradients (times grad_scale), clipped to max_grad_norm.

        `grad_norm`: the gradients' L2 norm, if the caller has it (a sharded optimizer needs it: the
        gradients outside its shard are not its own); None: computed here over the whole buffer.
        Returns metrics: grad_norm (of grad * grad_scale, before clipping), clipped (1.0 if clipping
        scaled the update down), skipped (1.0 if the norm was not finite and nothing was updated), lr.
        """
        if grad_norm is None:
            if self.sharded:
                raise ValueError("AdamW.step: a sharded optimizer needs grad_norm (of the whole gradient)")
            grad_norm = self.backend.grad_norm(self.grads.flat)
        norm = grad_norm * abs(grad_scale)
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
        update = {"lr": lr, "beta1": self.beta1, "beta2": self.beta2, "eps": self.eps,
                  "weight_decay": self.weight_decay, "step": self.step_count, "grad_scale": scale,
                  "rounding_seed": self.rounding_seed}
        if self.offloaded:
            self._streamed_step(update)
        else:
            self.backend.adamw_step(self.master, self.grads.flat[self.shard], self.exp_avg, self.exp_avg_sq,
                                    self.decay_mask, working_out=None if self.shares_master else self.working,
                                    offset=self.shard.start, **update)
        return metrics

    def _streamed_step(self, update: dict) -> None:
        """`adamw_step` over the offloaded state: the device's part in place, the host's STREAM_CHUNK elements
        at a time (module docstring)."""
        xp, n, kept = self.xp, self.working.shape[0], self.kept
        host, device = self._host, self._device
        state_keys = [key for key in host if key != "decay_mask"]  # what the update writes, back to the host
        copies = _PlainCopies() if xp is np else _CudaCopies(xp)
        if kept:  # on the current stream, while the copies stream starts the uploads
            self._update_slice(slice(0, kept), device, update)
        size = max(1, min(STREAM_CHUNK, n - kept))
        staging = [{key: xp.empty(size, array.dtype) for key, array in host.items()} for _ in range(2)]
        for index, start in enumerate(range(kept, n, size)):
            rows, slot = slice(start, min(start + size, n)), index % 2
            local = slice(start - kept, rows.stop - kept)  # the same elements in the host buffers
            chunk = {key: buffer[: rows.stop - start] for key, buffer in staging[slot].items()}
            copies.upload(slot, [(chunk[key], host[key][local]) for key in host])
            with copies.update_stream():
                self._update_slice(rows, chunk, update)
            copies.download(slot, [(host[key][local], chunk[key]) for key in state_keys])
        copies.finish()  # before the staging goes back to the pool and the host state is read

    def _update_slice(self, rows: slice, state: dict, update: dict) -> None:
        """adamw_step on elements `rows` of the shard, their master / moments / mask given in `state`."""
        working, offset = self.working[rows], self.shard.start + rows.start
        grads = self.grads.flat[offset : offset + working.shape[0]]
        self.backend.adamw_step(
            working if self.shares_master else state.get("master"), grads, state["exp_avg"], state["exp_avg_sq"],
            state.get("decay_mask"),
            working_out=None if self.shares_master else working, offset=offset,
            master_low16=state.get("master_low16"), **update,
        )

    def hyperparameters(self) -> dict:
        return {"betas": [self.beta1, self.beta2], "eps": self.eps, "weight_decay": self.weight_decay,
                "max_grad_norm": self.max_grad_norm, "rounding_seed": self.rounding_seed}

    def state_dict(self) -> dict:
        """{"step": int, "hyperparameters": dict, "arrays": {name: flat fp32 array (NumPy or CuPy)}}: the
        shard's elements (all of them, unsharded)."""
        self.restore()
        arrays = {"master": self.master, "exp_avg": self.exp_avg, "exp_avg_sq": self.exp_avg_sq}
        return {"step": self.step_count, "hyperparameters": self.hyperparameters(), "arrays": arrays}

    def load_state_dict(self, state: dict) -> None:
        """Copy a state_dict's arrays (NumPy or CuPy, over the whole buffer; a sharded optimizer takes its
        shard) into this optimizer, then refresh the working weights of its shard.

        Hyperparameters are not taken from the state: the run's config decides them (a resumed run may
        change e.g. weight decay on purpose).
        """
        self.restore()
        arrays = state["arrays"]
        missing = [k for k in ARRAY_KEYS if k not in arrays]
        if missing:
            raise ValueError(f"optimizer state lacks arrays {missing}")
        xp, whole = self.xp, tuple(self.params.flat.shape)
        for key in ARRAY_KEYS:
            if tuple(arrays[key].shape) != whole:
                raise ValueError(
                    f"optimizer state {key!r} has shape {tuple(arrays[key].shape)}, this model needs "
                    f"{whole} (a checkpoint of another model?)"
                )
            getattr(self, key)[...] = xp.asarray(arrays[key][self.shard], dtype=np.float32)
        self.step_count = int(state["step"])
        if self.shares_master:
            return
        if self.rounding_seed is not None and self.step_count > 0:  # the very weights the last step wrote
            self.working[...] = stochastic_round_bfloat16(self.master, self.rounding_seed, self.step_count,
                                                          self.shard.start)
        else:
            self.working[...] = self.master.astype(self.working.dtype)


def _check_share(share: float) -> None:
    if not 0 < share <= 1:
        raise ValueError(f"offload: share must be in (0, 1], got {share!r}")


def _host_buffer(xp, shape, dtype) -> np.ndarray:
    """Page-locked host memory for a CuPy array's copy (transfers at the link's full rate), else plain."""
    if xp is np:
        return np.empty(shape, dtype)
    import cupyx

    return cupyx.empty_pinned(shape, dtype)


class _PlainCopies:
    """A streamed step's copies on NumPy: plain assignments, (destination, source) pairs."""

    def upload(self, slot: int, pairs) -> None:
        for dst, src in pairs:
            dst[...] = src

    download = upload

    def update_stream(self):
        return contextlib.nullcontext()

    def finish(self) -> None:
        pass


class _CudaCopies:
    """A streamed step's copies on CuPy: uploads and the update on one stream, downloads on another, so that
    chunk i's download overlaps chunk i + 1's upload (the link carries both directions at once). A chunk's
    upload waits for the download of the chunk that last used its staging slot. Host buffers are pinned, so
    every copy is asynchronous; `finish` waits for all of them."""

    def __init__(self, cupy):
        self.runtime = cupy.cuda.runtime
        self.up = cupy.cuda.Stream(non_blocking=True)  # uploads, then the update kernel
        self.down = cupy.cuda.Stream(non_blocking=True)
        self.up.wait_event(cupy.cuda.get_current_stream().record())  # the backward's gradients first
        self.slot_free = [None, None]  # per staging slot: the end of its last download

    def upload(self, slot: int, pairs) -> None:
        """(device, host) pairs."""
        if self.slot_free[slot] is not None:
            self.up.wait_event(self.slot_free[slot])
        for device, host in pairs:
            self.runtime.memcpyAsync(device.data.ptr, host.ctypes.data, device.nbytes,
                                     self.runtime.memcpyHostToDevice, self.up.ptr)

    def update_stream(self):
        return self.up

    def download(self, slot: int, pairs) -> None:
        """(host, device) pairs, copied once the update is done."""
        self.down.wait_event(self.up.record())
        for host, device in pairs:
            self.runtime.memcpyAsync(host.ctypes.data, device.data.ptr, device.nbytes,
                                     self.runtime.memcpyDeviceToHost, self.down.ptr)
        self.slot_free[slot] = self.down.record()

    def finish(self) -> None:
        self.up.synchronize()
        self.down.synchronize()


def _release_cached_device_memory(xp) -> None:
    """CuPy's pool keeps freed blocks for reuse; give them back, so memory outside the pool (the engine's
    KV cache) can take their place."""
    if xp is not np:
        xp.get_default_memory_pool().free_all_blocks()
