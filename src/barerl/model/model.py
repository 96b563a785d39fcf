"""The model: weights in one flat buffer, a forward pass for the engine and forward + backward for training.

Design:
- One definition for every family; `ModelConfig` carries the differences (q/k norm, qkv bias, rope
  scaling, tied head).
- The engine and the trainer share `self.params`: the optimizer writes the working weights in place and the
  next generation reads them. Nothing is copied or synced.
- Training runs over packed sequences (cu_seqlens, positions); the LM head is chunked inside the ops, so
  no (tokens, vocab) fp32 matrix exists. Gradient checkpointing keeps each layer's input and the outputs of
  the ops named in `keep` (default: attention, the costliest to redo per byte kept; see model/recompute.py)
  and recomputes the rest of the layer during backward, but for its last product (down), whose output is
  the next layer's input.
- LoRA (model/lora.py): with `self.lora` set, the layer code reads `self.lora.layers` (the base weights,
  the targeted projections carrying their adapters) through `AdaptedOps`, the stand-in for `self.ops`, and
  training gradients go into the adapters' buffer alone (its `embed`, `final_norm`, `lm_head` are None: the
  base gets no gradient). The engine's forward is the same code on the same buffers.
- Training losses are the caller's: `forward_backward` hands the per-token log-probs to a loss function
  that returns (loss, d loss / d log-probs, metrics), and backpropagates from there. A token-local loss
  (its gradient at a token needs only that token's log-prob) may also give `token_grad`, the gradient of a
  chunk of tokens; the LM head then runs each chunk's backward on the logits of its forward, one
  vocabulary GEMM per chunk instead of two.
"""

from __future__ import annotations

import os
from collections.abc import Callable
from dataclasses import dataclass

import numpy as np

from barerl.config import ModelConfig, parameter_shapes
from barerl.formats.safetensors import resolve_dtype
from barerl.model.backward import layer_backward
from barerl.model.batch import PackedBatch
from barerl.model.checkpoint import load_checkpoint
from barerl.model.forward import RopeContext, layer_activations, layer_forward, layer_output
from barerl.model.lora import LoraWeights
from barerl.model.loss_rows import LossRows
from barerl.model.recompute import DEFAULT_KEEP, RecordingOps, ReplayingOps
from barerl.model.rope import rope_tables
from barerl.model.sampling_filter import SamplingFilter
from barerl.model.weights import ParameterBuffer
from barerl.ops import ModelOps, get_backend


@dataclass
class ForwardState:
    """What backward needs from `hidden_states`."""

    x_final: object  # (T, C) residual stream after the last layer
    rstd_final: object  # (T,) of the final norm
    layer_inputs: list  # each layer's input (T, C): checkpointing keeps these
    kept: list  # each layer's outputs of the ops kept through recomputation (RecordingOps.outputs)
    saved: list  # each layer's LayerActivations, or None where recomputed in backward
    rope: RopeContext
    cu_seqlens: object


UNFILTERED = SamplingFilter()  # temperature 1, nothing truncated
LossFn = Callable[[object, object], tuple[float, object, dict]]
# A token-local loss's gradient over a chunk of tokens: (logp[start:stop], start, stop) -> dlogp[start:stop]
TokenGrad = Callable[[object, int, int], object]


class Model:
    def __init__(self, cfg: ModelConfig, params: ParameterBuffer, device: str = "cpu", batch_invariant: bool = False):
        """batch_invariant (GPU, bf16/fp16): a token's numbers do not depend on what else is in its batch, so
        the engine's decode steps and the trainer's packed forward compute the same log-probs bit for bit (no
        train/inference mismatch). Products take split-K-free algorithms, and decode attention runs the
        training attention's arithmetic, one warp per token and kv head: suited to many sequences, slower for
        a few long ones. Fixed for the model's life: CUDA graphs capture the kernels it chose."""
        self.cfg = cfg
        self.params = params
        self.device = device
        self.backend = get_backend(device)
        self.ops = ModelOps(self.backend, batch_invariant)  # every op this model runs goes through here
        self.xp = self.backend.xp_of(params.flat)
        self.dtype = params.flat.dtype
        self.attention_scale = cfg.head_dim**-0.5
        self.lora = None  # LoraAdapters (barerl.model.lora.add_lora): frozen base, trained adapters
        self._rope_positions = 0
        self._ensure_rope(min(cfg.max_position_embeddings, 4096))

    # -- construction ---------------------------------------------------------------------------------
    @classmethod
    def from_pretrained(cls, path: str | os.PathLike, device: str = "cpu", dtype: str = "float32",
                        batch_invariant: bool = False) -> Model:
        """A Hugging Face folder or .gguf file; a PEFT adapter folder (a LoRA run's checkpoint) gives its base
        model (base_model_name_or_path) with the adapter attached."""
        from barerl.formats.paths import resolve_model_path
        from barerl.model.peft_format import adapter_base, is_adapter, load_adapter

        path = resolve_model_path(path)
        if is_adapter(path):
            model = cls.from_pretrained(adapter_base(path), device, dtype, batch_invariant)
            load_adapter(model, path)
            return model
        cfg, params = load_checkpoint(path, dtype=dtype, xp=_xp_for(device))
        return cls(cfg, params, device, batch_invariant)

    @classmethod
    def random(cls, cfg: ModelConfig, device: str = "cpu", dtype: str = "float32", seed: int = 0,
               batch_invariant: bool = False) -> Model:
        """Hugging Face-style init: normal(0, 0.02) matrices, unit norms, zero biases. On the GPU the draws are
        CuPy's, made there (other values than the CPU's for a seed): the host's take minutes for 4 B weights."""
        on_gpu = device == "cuda"
        xp = _xp_for(device)
        rng = xp.random.default_rng(seed)
        params = ParameterBuffer.zeros(cfg, xp, resolve_dtype(dtype))
        for name, shape in parameter_shapes(cfg):
            if name.endswith("norm.weight"):
                params[name][...] = 1.0
            elif on_gpu and not name.endswith(".bias"):
                params[name][...] = (rng.standard_normal(shape, dtype=np.float32) * np.float32(0.02)).astype(
                    params.flat.dtype)
            elif not name.endswith(".bias"):
                params[name][...] = rng.normal(0.0, 0.02, size=shape).astype(np.float32)
        return cls(cfg, params, device, batch_invariant)

    def _ensure_rope(self, num_positions: int) -> None:
        if num_positions <= self._rope_positions:
            return
        cos, sin = rope_tables(self.cfg, num_positions)
        self._cos, self._sin = self.xp.asarray(cos), self.xp.asarray(sin)
        self._rope_positions = num_positions

    def _rope(self, positions, max_position: int | None = None) -> RopeContext:
        if max_position is None:  # a look at the positions: a host sync when they live on the device
            max_position = int(positions.max()) if positions.size else 0
        self._ensure_rope(max_position + 1)
        return RopeContext(self.xp.asarray(positions), self._cos, self._sin)

    def _layers(self) -> list:
        """The LayerViews the layer code reads: the base weights, with their adapters under LoRA."""
        return self.params.layers if self.lora is None else self.lora.layers

    def _layer_ops(self, dropout_seed: int | None = None):
        """The ops of the layer code: the model's, or under LoRA their stand-in that adds the adapters (and
        drops their inputs out, given a training pass's seed)."""
        return self.ops if self.lora is None else self.lora.ops(self.ops, dropout_seed)

    @property
    def batch_invariant(self) -> bool:
        return self.ops.batch_invariant

    def with_batch_invariant(self, on: bool) -> Model:
        """This model, or when its choice differs, a model over the very same weights (no copy; its LoRA
        adapters too) with `on`: an engine and a trainer sharing weights each keep their own arithmetic."""
        if bool(on) == self.batch_invariant:
            return self
        model = Model(self.cfg, self.params, self.device, on)
        model.lora = self.lora
        return model

    # -- inference (engine) -----------------------------------------------------------------------------
    def kv_cache_bytes_per_token(self) -> int:
        c = self.cfg
        return 2 * c.num_hidden_layers * c.num_key_value_heads * c.head_dim * self.dtype.itemsize

    def kv_cache_shape(self, num_blocks: int, block_size: int) -> tuple[int, ...]:
        """(2, L, num_blocks, block_size, K, D): keys and values of every layer, in the model dtype."""
        c = self.cfg
        return (2, c.num_hidden_layers, num_blocks, block_size, c.num_key_value_heads, c.head_dim)

    def allocate_kv_cache(self, num_blocks: int, block_size: int):
        return self.xp.zeros(self.kv_cache_shape(num_blocks, block_size), dtype=self.dtype)

    def forward_paged(self, input_ids, positions, cu_seqlens_q, context_lens, block_tables, slot_mapping, kv_cache,
                      max_position: int | None = None, fresh_from: int | None = None):
        """New tokens of S sequences against their paged KV cache -> (S, V) fp32 logits of each last token.
        `max_position` (a bound on the positions) spares a host sync: CUDA-graph capture needs none.
        `fresh_from` (with cu_seqlens_q on the host): sequences fresh_from.. have no cached tokens, so their
        attention runs among their own new tokens as in training (the tiled flash kernel reads each key once
        per query tile; the paged kernel reads a prompt's keys once per query token)."""
        ops, xp, p = self.ops, self.xp, self.params
        rope = self._rope(positions, max_position)
        fresh = None
        if fresh_from is not None and fresh_from < len(cu_seqlens_q) - 1:
            fresh = fresh_from, int(cu_seqlens_q[fresh_from])  # first fresh sequence and its first new token
        cu = xp.asarray(cu_seqlens_q)
        fresh_cu = None if fresh is None else cu[fresh[0]:] - fresh[1]  # the fresh sequences' own boundaries
        lens, tables, slots = xp.asarray(context_lens), xp.asarray(block_tables), xp.asarray(slot_mapping)
        layer_ops = self._layer_ops()
        x = ops.embedding(xp.asarray(input_ids), p.embed)
        for i, w in enumerate(self._layers()):
            k_cache, v_cache = kv_cache[0, i], kv_cache[1, i]

            def rotate_and_store(*args, k_cache=k_cache, v_cache=v_cache):  # k and v go to the cache here
                return ops.qk_norm_rope_store(*args, k_cache, v_cache, slots)

            def attend(q, k, v, k_cache=k_cache, v_cache=v_cache):
                if fresh is None:
                    return ops.paged_attention(q, k_cache, v_cache, tables, lens, cu, self.attention_scale), None
                s0, t0 = fresh
                o_fresh, _ = ops.attention(q[t0:], k[t0:], v[t0:], fresh_cu, self.attention_scale)
                if not s0:
                    return o_fresh, None
                o_cached = ops.paged_attention(q[:t0], k_cache, v_cache, tables[:s0], lens[:s0], cu[: s0 + 1],
                                               self.attention_scale)
                return xp.concatenate([o_cached, o_fresh]), None

            x = layer_forward(layer_ops, self.cfg, w, x, rope, attend, rotate=rotate_and_store)
        decode = x.shape[0] == cu.shape[0] - 1  # one new token per sequence: every row is a last token
        last = x if decode else x[cu[1:] - 1]
        h, _ = ops.rmsnorm(last, p.final_norm, self.cfg.rms_norm_eps)
        return ops.lm_head_logits(h, p.lm_head)

    # -- training -----------------------------------------------------------------------------------------
    def _packed_inputs(self, batch: PackedBatch):
        xp = self.xp
        return xp.asarray(batch.input_ids), xp.asarray(batch.targets), xp.asarray(batch.cu_seqlens)

    def _attend_packed(self, ops, cu_seqlens):
        return lambda q, k, v: ops.attention(q, k, v, cu_seqlens, self.attention_scale)

    def hidden_states(self, batch: PackedBatch, keep: bool = False, checkpoint: bool = True,
                      keep_ops=DEFAULT_KEEP, dropout_seed: int | None = None):
        """Final-normed hidden states (T, C) and what backward needs (keep=True): everything, or under
        checkpointing each layer's input and the outputs of the ops in `keep_ops`. `dropout_seed`: LoRA
        dropout's seed (a training pass), None for none."""
        ops, p, cfg = self.ops, self.params, self.cfg
        adapted = self._layer_ops(dropout_seed)
        ids, _, cu = self._packed_inputs(batch)
        rope = self._rope(batch.positions)
        x = ops.embedding(ids, p.embed)
        layer_inputs, kept, saved = [], [], []
        for w in self._layers():
            if keep:  # recomputation starts from these; a forward with no backward needs none
                layer_inputs.append(x)
            layer_ops = RecordingOps(adapted, keep_ops) if keep and checkpoint else adapted
            x, acts = self._training_layer(layer_ops, adapted, w, x, rope, cu, save=keep and not checkpoint)
            saved.append(acts)
            kept.append(layer_ops.outputs if layer_ops is not adapted else None)
        h, rstd = ops.rmsnorm(x, p.final_norm, cfg.rms_norm_eps)
        return h, ForwardState(x, rstd, layer_inputs, kept, saved, rope, cu)

    def _training_layer(self, layer_ops, ops, w, x, rope, cu, save: bool):
        """One layer of a training forward -> (x_out, its LayerActivations if `save`, else None, so that they
        die here). The last op runs on `ops`, not the recording stand-in: its output is the next layer's input,
        which recomputation never needs again, so a RecordingOps does not keep it."""
        acts = layer_activations(layer_ops, self.cfg, w, x, rope, self._attend_packed(layer_ops, cu))
        return layer_output(ops, w, acts), acts if save else None

    def logprobs(self, batch: PackedBatch, sampling: SamplingFilter = UNFILTERED):
        """Per-token log-probs of batch.targets under the `sampling` distribution and entropies, (T,) fp32 each,
        with no gradient."""
        h, _ = self.hidden_states(batch)
        logp, _, entropy = self._head_logprobs(h, self.xp.asarray(batch.targets), _trainable(sampling))
        return logp, entropy

    def _head_logprobs(self, h, targets, f: SamplingFilter):
        ops, w = self.ops, self.params.lm_head
        if f.truncates:
            return ops.lm_head_logprobs_filtered(h, w, targets, 1.0 / f.temperature, f.top_k, f.top_p, f.min_p)
        return ops.lm_head_logprobs(h, w, targets, 1.0 / f.temperature)

    def _head_backward(self, dlogp, h, targets, lse, dw, f: SamplingFilter):
        ops, w = self.ops, self.params.lm_head
        if f.truncates:
            return ops.lm_head_backward_filtered(dlogp, h, w, targets, lse, dw, 1.0 / f.temperature, f.top_k,
                                                 f.top_p, f.min_p)
        return ops.lm_head_backward(dlogp, h, w, targets, lse, dw, 1.0 / f.temperature)

    def _head_and_loss(self, h, targets, loss_fn: LossFn, token_grad: TokenGrad | None, dw,
                       f: SamplingFilter):
        """The LM head's forward, the loss and the head's backward: (loss, metrics, dh); dw += ..."""
        if token_grad is None or f.truncates:  # the filtered head has no fused twin
            logp, lse, entropy = self._head_logprobs(h, targets, f)
            loss, dlogp, metrics = loss_fn(logp, entropy)
            dh = self._head_backward(self.xp.asarray(dlogp, dtype=np.float32), h, targets, lse, dw, f)
            return loss, metrics, dh
        ops, w = self.ops, self.params.lm_head
        logp, _, entropy, dh = ops.lm_head_forward_backward(h, w, targets, token_grad, dw, 1.0 / f.temperature)
        loss, _, metrics = loss_fn(logp, entropy)  # token_grad gave the gradient already
        return loss, metrics, dh

    def forward_backward(
        self, batch: PackedBatch, loss_fn: LossFn, grads: ParameterBuffer | LoraWeights,
        sampling: SamplingFilter = UNFILTERED, checkpoint: bool = True, keep_ops=DEFAULT_KEEP,
        token_grad: TokenGrad | None = None, dropout_seed: int | None = None,
    ) -> tuple[float, dict]:
        """Forward, loss_fn(logprobs, entropy) -> (loss, dloss/dlogprobs, metrics), backward into grads.

        Gradients accumulate into `grads` (zero it once per optimizer step), so micro-batches add up.
        `checkpoint`: recompute each layer in backward, but for the outputs of the ops in `keep_ops`.
        `token_grad`: for a token-local loss, the same gradient as loss_fn's, one chunk of tokens at a time
        (see TokenGrad); unless the sampling filter truncates, the head's backward then runs chunk by chunk
        inside its forward, and loss_fn gives only the loss and the metrics.
        With LoRA adapters, `grads` is a buffer in their layout (`model.lora.weights.with_flat(...)`), and
        `dropout_seed` draws their dropout masks (None: no dropout).
        """
        ops, p, cfg = self.ops, self.params, self.cfg
        self._check_grads(grads)
        f = _trainable(sampling)
        h, fwd = self.hidden_states(batch, keep=True, checkpoint=checkpoint, keep_ops=keep_ops,
                                    dropout_seed=dropout_seed)
        targets = self.xp.asarray(batch.targets)
        rows = LossRows(self.xp, batch.loss_mask)
        if rows.needed:  # the head on the rows that carry a loss only
            loss, metrics, dh = self._head_and_loss(
                rows.gather(h), rows.gather(targets), rows.loss_fn(loss_fn),
                None if token_grad is None else rows.token_grad(token_grad), grads.lm_head, f)
            dh = rows.scatter(dh)
        else:
            loss, metrics, dh = self._head_and_loss(h, targets, loss_fn, token_grad, grads.lm_head, f)
        dx = ops.rmsnorm_backward(dh, fwd.x_final, p.final_norm, fwd.rstd_final, grads.final_norm)
        rope, cu = fwd.rope, fwd.cu_seqlens
        adapted, layers = self._layer_ops(dropout_seed), self._layers()
        for i in reversed(range(cfg.num_hidden_layers)):
            acts = fwd.saved[i]
            if acts is None:  # checkpointed: recompute this layer from its input and its kept outputs
                replay = ReplayingOps(adapted, keep_ops, fwd.kept[i])
                acts = layer_activations(replay, cfg, layers[i], fwd.layer_inputs[i], rope,
                                         self._attend_packed(replay, cu))
            dx = layer_backward(adapted, cfg, layers[i], grads.layers[i], acts, dx, rope, cu, self.attention_scale)
            fwd.saved[i] = fwd.layer_inputs[i] = fwd.kept[i] = None  # free as we go
        if grads.embed is not None:  # None: a frozen base (LoRA)
            ops.embedding_backward(dx, self.xp.asarray(batch.input_ids), grads.embed)
        return loss, metrics

    def _check_grads(self, grads) -> None:
        """Gradients go to what is trained: the adapters under LoRA, else every parameter."""
        if self.lora is not None and not isinstance(grads, LoraWeights):
            raise ValueError("forward_backward: this model has LoRA adapters; grads must be a buffer in the "
                             "adapters' layout (model.lora.weights.with_flat)")
        if self.lora is None and isinstance(grads, LoraWeights):
            raise ValueError("forward_backward: grads are in a LoRA layout, but this model has no adapters")

    def zeros_like_params(self, dtype="float32") -> ParameterBuffer:
        return ParameterBuffer.zeros(self.cfg, self.xp, resolve_dtype(dtype))


def _trainable(sampling: SamplingFilter) -> SamplingFilter:
    """The filter itself, when log-probs exist under it (greedy decoding has none)."""
    if not isinstance(sampling, SamplingFilter):
        raise TypeError(f"sampling must be a SamplingFilter, got {type(sampling).__name__}")
    if sampling.greedy:
        raise ValueError("log-probs under greedy decoding (temperature 0) are not defined: use temperature > 0")
    return sampling


def _xp_for(device: str):
    if device == "cpu":
        return np
    if device == "cuda":
        from barerl.device import import_cupy

        return import_cupy()
    raise ValueError(f"device must be 'cpu' or 'cuda', got {device!r}")
