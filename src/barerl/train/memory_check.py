"""The memory plan at the start of `barerl sft` and `barerl grpo`: printed, and checked against the device
before the model is loaded, so a run that cannot fit stops at once with the settings that would.

Design decisions:
- The device's room is what CUDA reports free plus what barerl's memory pool already holds (a model passed in
  lives there, and the plan counts it), less `HEADROOM_BYTES` for what no phase lists: kernel modules,
  cuBLASLt's workspace, the pool's rounding. On the CPU the plan is printed and not checked (the host's memory is
  shared with everything else, and some machines report less RAM at start than they give later).
- A refusal names the phase that does not fit and its largest parts, then the changes of one setting each
  that make the whole plan fit, tried in the order they cost least: offloading the optimizer (the smallest
  share that fits), recomputation, keeping fewer ops through it, smaller micro-batches, fewer completions per
  generation round, no checkpoints. Each suggestion was planned again, so it does fit. A full-parameter run is
  also told when LoRA (`--lora_r 16` on every linear layer: the base frozen, the adapters trained) would fit:
  a change of what is trained rather than of how, so it is offered beside the others, never instead of them.
- Host memory is printed, never checked, for the same reason as the CPU's.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterator

from barerl.config import ModelConfig
from barerl.model.lora import LoraConfig
from barerl.train.config import GRPOConfig, TrainConfig
from barerl.train.memory_plan import (
    DEFAULT_BLOCK_SIZE,
    DEFAULT_MAX_NUM_BATCHED_TOKENS,
    GIB,
    MemoryPlan,
    micro_batch_tokens,
    plan_training,
)

HEADROOM_BYTES = 1 * GIB
LORA_CHANGE = "--lora_r 16"  # what a full-parameter run that cannot fit is offered, when LoRA would
_RATIOS = [round(0.01 * i, 2) for i in range(1, 101)]


class MemoryPlanError(ValueError):
    """The run's plan does not fit the device (the message says why and what would)."""


def device_room() -> int | None:
    """Bytes a run may plan for on the current GPU (None without one)."""
    try:
        import cupy

        free, _ = cupy.cuda.runtime.memGetInfo()
        return int(free) + int(cupy.get_default_memory_pool().total_bytes()) - HEADROOM_BYTES
    except Exception:  # noqa: BLE001 -- no cupy, no driver or no GPU: nothing to check against
        return None


def plan_run(train: TrainConfig, model=None, engine_args: dict | None = None,
             show: bool = True) -> MemoryPlan | None:
    """The run's plan, printed when `show`, before its model is loaded (its config is read from `train.model`,
    or taken from `model` when one is given); MemoryPlanError when it does not fit the GPU. None when there is
    no model to plan for (the session says so)."""
    from barerl.device import resolve_auto_dtype, resolve_device
    from barerl.formats.paths import load_config, resolve_model_path
    from barerl.model.peft_format import adapter_base, is_adapter, read_adapter

    adapter = read_adapter(train.lora_adapter)[0] if train.lora_adapter else None
    if model is not None:
        cfg, dtype, device = model.cfg, model.dtype.name, model.device
        adapter = adapter or (model.lora.config if model.lora is not None else None)
    elif train.model:
        path = resolve_model_path(train.model)
        if is_adapter(path):  # a PEFT adapter folder as the model: its base, with its adapters
            adapter, path = read_adapter(path)[0], resolve_model_path(adapter_base(path))
        cfg = load_config(path)
        device = resolve_device(train.device)
        dtype = resolve_auto_dtype(train.dtype, device)
    else:
        return None
    engine_args = engine_args or {}
    engine = {"block_size": engine_args.get("block_size", DEFAULT_BLOCK_SIZE),
              "max_num_batched_tokens": engine_args.get("max_num_batched_tokens") or DEFAULT_MAX_NUM_BATCHED_TOKENS}
    room = device_room() if device == "cuda" else None
    plan = check_plan(cfg, dtype, train, room, adapter, **engine)
    if show:
        where = "not checked on the CPU" if room is None else f"{room / GIB:.1f} GiB free for it on this GPU"
        print(f"{plan.render()}\n(peak {plan.peak.nbytes / GIB:.1f} GiB in the {plan.peak.name} phase; {where})")
    return plan


def check_plan(cfg: ModelConfig, dtype: str, train: TrainConfig, room: int | None, adapter: LoraConfig | None = None,
               **engine) -> MemoryPlan:
    """The run's plan (`adapter`: plan_training's); MemoryPlanError when room (bytes) is given and a phase needs
    more."""
    plan = plan_training(cfg, dtype, train, adapter=adapter, **engine)
    if room is None or plan.peak.nbytes <= room:
        return plan
    raise MemoryPlanError(refusal(plan, room, cfg, dtype, train, {**engine, "adapter": adapter}))


def refusal(plan: MemoryPlan, room: int, cfg: ModelConfig, dtype: str, train: TrainConfig, options: dict) -> str:
    """Why the plan does not fit, and what would; `options`: plan_training's keywords (engine sizes, adapter)."""
    phase = plan.peak
    largest = sorted(phase.parts, key=lambda p: -p.nbytes)[:4]
    parts = ", ".join(f"{p.name} {p.nbytes / GIB:.1f}" for p in largest)
    text = (f"memory plan: the {phase.name} phase needs {phase.nbytes / GIB:.1f} GiB, more than the "
            f"{room / GIB:.1f} GiB this GPU has for the run ({parts} GiB). ")
    fits = list(fitting_changes(cfg, dtype, train, room, options))
    shown = fits[:4] + [fit for fit in fits[4:] if fit[0] == LORA_CHANGE]  # LoRA is said whatever its rank
    fixes = [f"{flags} ({_phases(p)})" for flags, p in shown]
    if fixes:
        return text + "Settings that fit, one change each: " + "; ".join(fixes) + "."
    return text + ("No single setting makes it fit: combine a smaller micro-batch, recomputation and (GRPO) "
                   "offload_optimizer, or use a GPU with more memory.")


def _phases(plan: MemoryPlan) -> str:
    return ", ".join(f"{p.name} {p.nbytes / GIB:.1f} GiB" for p in plan.phases)


def fitting_changes(cfg: ModelConfig, dtype: str, train: TrainConfig, room: int,
                    options: dict | None = None) -> Iterator[tuple[str, MemoryPlan]]:
    """(the flags of one change of settings, its plan) for each change whose plan fits `room`, cheapest first;
    `options`: plan_training's keywords."""
    options, offload_found = options or {}, False
    lora = bool(options.get("adapter") or train.lora_r or train.lora_adapter)
    for flags, changes in _changes(train, lora):
        if offload_found and "offload_optimizer_ratio" in changes:
            continue  # the smallest share that fits was said: no larger one
        plan = plan_training(cfg, dtype, dataclasses.replace(train, **changes), **options)
        if plan.peak.nbytes <= room:
            offload_found = offload_found or "offload_optimizer_ratio" in changes
            yield flags, plan


def _changes(train: TrainConfig, lora: bool) -> Iterator[tuple[str, dict]]:
    """Candidate changes of one setting each, cheapest first (offload shares from the smallest up, in order);
    LoRA last, for a run that trains every parameter (`lora` False)."""
    grpo = isinstance(train, GRPOConfig)
    if grpo:
        current = train.offload_optimizer_ratio if train.offload_optimizer else 0.0
        for r in (r for r in _RATIOS if r > current):
            yield (f"--offload_optimizer true --offload_optimizer_ratio {r:g}",
                   {"offload_optimizer": True, "offload_optimizer_ratio": r})
    if not train.gradient_checkpointing:
        yield "--gradient_checkpointing true", {"gradient_checkpointing": True}
    elif tuple(train.gradient_checkpointing_keep) not in (("attention",), ()):
        yield "--gradient_checkpointing_keep attention", {"gradient_checkpointing_keep": ("attention",)}
    if grpo or getattr(train, "packing", False):
        tokens = micro_batch_tokens(train)
        for fewer in (tokens // 2, tokens // 4):  # whole sequences still: a batch never splits one
            yield f"--max_tokens_per_microbatch {fewer}", {"max_tokens_per_microbatch": max(1, fewer)}
    elif train.per_device_train_batch_size > 1:
        per, accumulate = train.per_device_train_batch_size // 2, train.gradient_accumulation_steps * 2
        yield (f"--per_device_train_batch_size {per} --gradient_accumulation_steps {accumulate}",
               {"per_device_train_batch_size": per, "gradient_accumulation_steps": accumulate})
    if grpo and train.effective_generation_batch_size > train.num_generations:
        half = max(1, train.effective_generation_batch_size // 2 // train.num_generations) * train.num_generations
        yield f"--generation_batch_size {half}", {"generation_batch_size": half, "steps_per_generation": None}
    if train.save_strategy != "no":
        yield "--save_strategy no", {"save_strategy": "no"}
    if not lora:
        yield LORA_CHANGE, {"lora_r": int(LORA_CHANGE.split()[-1])}
