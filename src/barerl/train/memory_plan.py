"""What a training run holds where, worked out on paper from the model's config and the run's (docs/MEMORY.md).

Design decisions:
- Every figure follows the code's own rules, so that the plan is the code's memory written down: the flat
  parameter buffer in the working dtype; fp32 gradients; the fp32 master (none when the working weights are
  fp32: they are the master) and two fp32 moments, plus a byte per parameter of decay mask with weight decay;
  an offloaded optimizer keeps the state's first `1 - offload_optimizer_ratio` on the device and streams the
  rest through `STREAM_CHUNK`-element staging (the master as its low 16 bits where bf16 weights with stochastic
  rounding hold the rest: train/optimizer.py).
- Activations under recomputation (model/model.py, model/recompute.py): each layer keeps its input and the
  outputs of the ops in `gradient_checkpointing_keep`; backward recomputes one layer at a time, and while a
  layer's backward runs it also holds that layer's recomputed outputs, every gradient `layer_backward`
  computes (they live until it returns), attention's fp32 dq accumulator and the residual stream's gradient
  with the head's h, dh and the final x. The LM head walks `DEFAULT_LM_HEAD_CHUNK`-row chunks of fp32 logits and
  their gradient in the working dtype. Measured on the H200 this reads within 1-4% of the pool's high-water mark
  (tests/train/test_memory_plan.py holds the comparisons).
- GRPO's engine holds, while it generates, the KV cache of one generation round (`rollout_kv_blocks`), the
  decode graphs' pool (each row's fp32 logits and its sampler keys) and a prefill step's layer temporaries;
  with `offload_optimizer` the gradient buffer is freed then too. While training, the KV cache is released.
- A checkpoint of an offloaded optimizer brings the whole state back to the device first (with the gradients
  dropped): its own phase, which the check covers when checkpoints are written.
- Sizes are upper bounds where the run's data decides (the longest micro-batch: whole sequences of the longest
  prompt and completion; the head on every token of it).
- LoRA (model/lora.py): the base weights stay in the working dtype, frozen, with no gradient and no optimizer
  state; the adapters' flat buffer (the block-diagonal B's zeros included) has the working dtype too, and the
  gradients, master, moments, offload and staging are the adapters' alone. The KL reference is the base
  itself (no copy). A layer's backward holds, per adapted product, the adapters' input (a copy, with dropout),
  their rank-wide products u and du, and the input gradient of the adapter path.
- Fixed costs outside the pool (the CUDA context, kernel modules, cuBLASLt's workspace) are not phases'
  parts: the check leaves `HEADROOM_BYTES` for them (train/memory_check.py).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from barerl.config import ModelConfig
from barerl.model.lora import (
    ALL_LINEAR,
    TARGET_MODULES,
    LoraConfig,
    lora_buffer_size,
    lora_config_of,
    lora_offsets,
)
from barerl.ops.common import DEFAULT_LM_HEAD_CHUNK
from barerl.train.config import GRPOConfig, SFTConfig, TrainConfig
from barerl.train.optimizer import STREAM_CHUNK

GIB = 2**30
DEFAULT_BLOCK_SIZE = 16  # the engine's (EngineConfig.block_size)
DEFAULT_MAX_NUM_BATCHED_TOKENS = 8192  # the engine's prefill step budget (engine/llm.py)
# Host <-> GPU copy rate each way with both directions busy, for the offloaded optimizer's estimate: R1's train
# phase fully offloaded and at ratio 0.55 differ by 2.4-2.7 GB each way and 0.07 s (2026-12-01 at 1ae8b82 and
# 5065b97, bench/RESULTS.md as of d5f8196), 34-39 GB/s. bench/grpo_barerl.py measures the link in its run.
LINK_BYTES_PER_SECOND = 36e9


@dataclass(frozen=True)
class Part:
    name: str
    nbytes: int


@dataclass(frozen=True)
class Phase:
    """What the device holds at the high-water mark of one phase of a run."""

    name: str
    parts: tuple[Part, ...]

    @property
    def nbytes(self) -> int:
        return sum(p.nbytes for p in self.parts)

    def get(self, name: str) -> int:
        return sum(p.nbytes for p in self.parts if p.name == name)


@dataclass(frozen=True)
class MemoryPlan:
    title: str
    phases: tuple[Phase, ...]  # on the device
    host: tuple[Part, ...]  # pinned host memory (the offloaded optimizer state)
    link_bytes: int  # carried up per optimizer step (the offloaded state; all but the decay mask comes back)

    @property
    def peak(self) -> Phase:
        return max(self.phases, key=lambda p: p.nbytes)

    def phase(self, name: str) -> Phase:
        return next(p for p in self.phases if p.name == name)

    def render(self) -> str:
        """A table in GiB, one column per phase, then the host's share and the link's load."""
        names = list(dict.fromkeys(part.name for phase in self.phases for part in phase.parts))
        width = max(len(n) for n in [*names, "total"]) + 2
        lines = [self.title, " " * width + "".join(f"{p.name:>12}" for p in self.phases)]
        for name in [*names, "total"]:
            cells = [phase.nbytes if name == "total" else phase.get(name) for phase in self.phases]
            has = [name == "total" or any(part.name == name for part in p.parts) for p in self.phases]
            lines.append(f"{name:<{width}}" + "".join(f"{c / GIB:>12.2f}" if h else f"{'-':>12}"
                                                       for c, h in zip(cells, has)))
        if self.host:
            host = ", ".join(f"{p.name} {p.nbytes / GIB:.2f}" for p in self.host)
            lines.append(f"host (pinned): {sum(p.nbytes for p in self.host) / GIB:.2f} GiB ({host})")
            lines.append(f"host link: {self.link_bytes / GIB:.2f} GiB up and back per optimizer step, "
                         f"~{self.link_bytes / LINK_BYTES_PER_SECOND:.2f} s at {LINK_BYTES_PER_SECOND / 1e9:.0f} GB/s")
        return "\n".join(lines)


# ------------------------------------------------------------------------------------------------- sizes


def op_output_bytes(cfg: ModelConfig, itemsize: int) -> dict[str, int]:
    """Bytes per token of each recomputable op's outputs in one layer (model/forward.py's LayerActivations but
    the layer input): rmsnorm twice (h, rstd), linear three times (qkv, x_mid, gate_up; down's output is the next
    layer's input), q/k norm + rope (rotated qkv, q and k rstd), attention (o, lse), swiglu."""
    C, I, H, K, D = (cfg.hidden_size, cfg.intermediate_size, cfg.num_attention_heads, cfg.num_key_value_heads,
                     cfg.head_dim)
    qkv = (H + 2 * K) * D
    return {"rmsnorm": 2 * (C * itemsize + 4), "linear": (qkv + C + 2 * I) * itemsize,
            "qk_norm_rope": qkv * itemsize + ((H + K) * 4 if cfg.qk_norm else 0),
            "attention": H * D * itemsize + H * 4, "swiglu": I * itemsize}


def kv_bytes_per_token(cfg: ModelConfig, itemsize: int) -> int:
    return 2 * cfg.num_hidden_layers * cfg.num_key_value_heads * cfg.head_dim * itemsize


def rollout_kv_blocks(cfg: GRPOConfig, block_size: int, num_samples: int | None = None) -> int:
    """The most KV blocks a generation round of `num_samples` completions (default: one process's round)
    holds at once. A prompt's full blocks are stored once (its num_generations samples share them); each sample
    owns the rest, from its prompt's last partial block (at most block_size - 1 tokens) to the end of its
    completion. Prompts are at most max_prompt_length tokens. Multi-turn: each continued turn recomputes its
    last partial block into a fresh one (the old one is freed, uncached), so an episode takes up to max_turns
    blocks more."""
    num_samples = num_samples or cfg.effective_generation_batch_size
    shared = num_samples // cfg.num_generations * (cfg.max_prompt_length // block_size)
    continued = num_samples * cfg.max_turns if cfg.multi_turn else 0
    return shared + num_samples * -(-(cfg.max_completion_length + block_size - 1) // block_size) + continued


def micro_batch_tokens(cfg: TrainConfig) -> int:
    """The most tokens one packed forward/backward pass takes (whole sequences, as the loops pack them)."""
    budget = cfg.max_tokens_per_microbatch
    if isinstance(cfg, GRPOConfig):
        longest = (cfg.max_prompt_length or 512) + cfg.max_completion_length
        whole = cfg.per_device_train_batch_size * longest
        return whole if budget is None else min(whole, max(budget, longest))
    longest = cfg.max_length or budget or 0
    if isinstance(cfg, SFTConfig) and cfg.packing and budget:
        return max(budget, longest)
    return cfg.per_device_train_batch_size * longest


@dataclass(frozen=True)
class _Sizes:
    """The per-parameter and per-token sizes of one model in one working dtype."""

    cfg: ModelConfig
    itemsize: int  # working weights and activations
    parameters: int

    @classmethod
    def of(cls, cfg: ModelConfig, dtype: str) -> _Sizes:
        import ml_dtypes

        item = np.dtype(ml_dtypes.bfloat16 if dtype == "bfloat16" else dtype).itemsize
        return cls(cfg, item, cfg.num_parameters())

    @property
    def fp32_weights(self) -> bool:
        return self.itemsize == 4

    def state_bytes(self, train: TrainConfig, offloaded: bool) -> int:
        """Optimizer bytes per parameter: master (none when the weights are fp32; its low halves where
        offloaded bf16 weights with stochastic rounding rebuild it), two moments, the decay mask."""
        low_halves = offloaded and self.itemsize == 2 and train.stochastic_rounding
        master = 0 if self.fp32_weights else 2 if low_halves else 4
        return master + 8 + (1 if train.weight_decay else 0)

    def activations(self, tokens: int, checkpoint: bool, keep: tuple[str, ...],
                    lora: LoraConfig | None = None) -> tuple[Part, Part]:
        """(what the forward leaves for backward, the largest transient work on top of it) for `tokens`."""
        c, a = self.cfg, self.itemsize
        ops = op_output_bytes(c, a)
        full = sum(ops.values())
        kept = sum(ops[op] for op in keep) if checkpoint else full
        saved = c.num_hidden_layers * (c.hidden_size * a + kept) * tokens
        C, I, H, D = c.hidden_size, c.intermediate_size, c.num_attention_heads, c.head_dim
        qkv = (H + 2 * c.num_key_value_heads) * D
        layer_gradients = (3 * I + 4 * C + H * D + 2 * qkv) * a  # every array layer_backward makes
        attention_scratch = H * D * 4 + H * 4  # fp32 dq accumulator, delta
        stream = 4 * C * a  # dx passed down, the head's h and dh, the final layer's output
        adapter_work = 0
        if lora is not None:  # an adapted product's backward: its input (dropped out), u, du, the adapter's dx
            widest_in, widest_rank, _ = lora_widths(c, lora)
            adapter_work = (2 * widest_in + 2 * widest_rank) * a
        backward = (full - kept + layer_gradients + attention_scratch + stream + adapter_work) * tokens
        chunk = min(DEFAULT_LM_HEAD_CHUNK, tokens)
        head = chunk * c.vocab_size * (4 + a) + (5 * C * a + 24) * tokens  # logits, dlogits; h, rows, dh, stats
        return Part("activations kept for backward", saved), Part("one layer's backward or the LM head",
                                                                  max(backward, head))


def lora_widths(cfg: ModelConfig, lora: LoraConfig) -> tuple[int, int, int]:
    """The widest adapted product's input features, adapter rank (n r of a fused site) and output features."""
    shapes = [shape for name, (_, shape) in lora_offsets(cfg, lora).items() if name.startswith("model.layers.0.")]
    a_shapes, b_shapes = shapes[0::2], shapes[1::2]  # each site's A (n r, in), then its B (out, n r)
    return max(s[1] for s in a_shapes), max(s[0] for s in a_shapes), max(s[0] for s in b_shapes)


# ------------------------------------------------------------------------------------------------- plans


def plan_training(cfg: ModelConfig, dtype: str, train: TrainConfig, block_size: int = DEFAULT_BLOCK_SIZE,
                  max_num_batched_tokens: int = DEFAULT_MAX_NUM_BATCHED_TOKENS,
                  adapter: LoraConfig | None = None) -> MemoryPlan:
    """The plan of an SFT or GRPO run of `cfg` with `dtype` working weights ("bfloat16", "float16", "float32").
    `adapter`: the LoRA adapters the run starts from (a PEFT folder's, or the given model's); None: those
    `train.lora_r` asks for, if any."""
    sizes = _Sizes.of(cfg, dtype)
    lora = adapter if adapter is not None else lora_config_of(train)
    P, grpo = sizes.parameters, isinstance(train, GRPOConfig)
    N = P if lora is None else lora_buffer_size(cfg, lora)  # what the optimizer trains
    trained = "" if lora is None else "adapter "
    offloaded = grpo and train.offload_optimizer
    share = train.offload_optimizer_ratio if offloaded else 0.0
    host_elements = round(share * N)
    state = sizes.state_bytes(train, offloaded)
    weights = Part(f"weights ({dtype})", P * sizes.itemsize)
    adapters = [Part(f"LoRA adapters ({dtype})", N * sizes.itemsize)] if lora is not None else []
    gradients = Part(f"{trained}gradients (fp32)", N * 4)
    kept_name = f"{trained}optimizer state" + ("" if not offloaded else f" kept ({1 - share:.0%})")
    kept = Part(kept_name, (N - host_elements) * state)
    copied_reference = grpo and train.beta > 0 and lora is None  # under LoRA the reference is the base itself
    reference = [Part("reference model (beta > 0)", P * sizes.itemsize)] if copied_reference else []
    tokens = micro_batch_tokens(train)
    saved, work = sizes.activations(tokens, train.gradient_checkpointing, train.gradient_checkpointing_keep, lora)
    staging = [Part("streamed optimizer staging", 2 * min(STREAM_CHUNK, host_elements) * state)] if offloaded else []
    train_parts = (weights, *adapters, gradients, kept, *reference, saved, work, *staging)
    phases = [Phase("train", tuple(p for p in train_parts if p.nbytes))]
    if grpo:
        engine = _engine_parts(sizes, train, block_size, max_num_batched_tokens, lora)
        generate = (weights, *adapters, *([] if offloaded else [gradients]), kept, *reference, *engine)
        phases.insert(0, Phase("generate", tuple(p for p in generate if p.nbytes)))
    if offloaded and train.save_strategy != "no":
        whole = Part(f"{trained}optimizer state, restored whole", N * sizes.state_bytes(train, offloaded=False))
        rebuild = Part("master's low halves (offload)", N * 2 if state != sizes.state_bytes(train, False) else 0)
        checkpoint = (weights, *adapters, whole, *reference, rebuild)
        phases.append(Phase("checkpoint", tuple(p for p in checkpoint if p.nbytes)))
    host = (Part(f"{trained}optimizer state offloaded ({share:.0%})", host_elements * state),) if offloaded else ()
    recompute = (f"recomputation keeping {','.join(train.gradient_checkpointing_keep) or 'nothing'}"
                 if train.gradient_checkpointing else "no recomputation")
    title = (f"memory plan (GiB): {cfg.architecture}, {_count(P)} parameters, {dtype} weights, "
             f"{_lora_title(lora, N)}micro-batches of up to {tokens:,} tokens, {recompute}")
    return MemoryPlan(title, tuple(phases), host, host_elements * state)  # up; the mask does not come back


def _count(n: int) -> str:
    return f"{n / 1e9:.2f} B" if n >= 1e8 else f"{n / 1e6:.2f} M"


def _lora_title(lora: LoraConfig | None, trained: int) -> str:
    if lora is None:
        return ""
    modules = ALL_LINEAR if lora.target_modules == TARGET_MODULES else ",".join(lora.target_modules)
    return f"LoRA r={lora.r} on {modules} ({_count(trained)} adapter parameters, base frozen), "


def _engine_parts(sizes: _Sizes, train: GRPOConfig, block_size: int, max_num_batched_tokens: int,
                  lora: LoraConfig | None = None) -> list[Part]:
    c, a = sizes.cfg, sizes.itemsize
    sequences = train.effective_generation_batch_size
    prompt = train.max_prompt_length or 512
    if train.max_prompt_length is not None:
        blocks = rollout_kv_blocks(train, block_size)
    else:
        blocks = sequences * -(-(prompt + train.max_completion_length) // block_size)
    kv = Part(f"KV cache ({blocks:,} blocks of {block_size})", blocks * block_size * kv_bytes_per_token(c, a))
    graphs = sequences * c.vocab_size * 8  # each row's fp32 logits and its sampler's keys
    prefill_tokens = min(max_num_batched_tokens, sequences // train.num_generations * prompt)
    adapter = 0
    if lora is not None:  # an adapted product's u and its delta, before the base product reads it
        _, widest_rank, widest_out = lora_widths(c, lora)
        adapter = (widest_rank + widest_out) * a
    prefill = prefill_tokens * (sum(op_output_bytes(c, a).values()) + 2 * c.hidden_size * a + adapter)
    return [kv, Part("engine graphs and prefill scratch", graphs + prefill)]
