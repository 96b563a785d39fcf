"""GRPO: the whole RL loop in one process, on one copy of the weights.

Per generation batch:
  1. the engine samples `num_generations` completions for each prompt from the model's own working weights
     (each prompt is prefilled once; its samples share its KV blocks);
  2. reward functions score them; advantages are group-relative (TRL's `scale_rewards`);
  3. the completions are packed into micro-batches; the policy loss (TRL's loss types, clip-higher, GSPO,
     TIS/MIS against the engine's sampling log-probs) gives d loss / d log-prob per token, and the model's
     hand-written backward takes it from there (chunk by chunk inside the LM head's forward where that
     gradient is token-local: no GSPO, no sequence-level correction, no top-k/top-p/min-p);
  4. AdamW updates the working weights in place; the engine's next generation reads them directly (each
     generate call starts with an empty prefix cache, since cached KV would predate the update).
Log-probs on both sides come from the same ops at the same temperature, so the logged engine/trainer
mismatch is ~0. The number of optimizer steps per generation batch is
`steps_per_generation / gradient_accumulation_steps`, times `num_iterations`; old log-probs are computed
once per generation batch when the policy moves before the batch is used up (TRL's rule).
With an environment or tools configured (`environment_factory`, `tools`), step 1 plays multi-turn episodes
instead (train/multi_turn.py): the loss and advantages cover the model's tokens only, and the mismatch is
also logged per turn.
With `dynamic_sampling` (DAPO), groups whose rewards are all equal are dropped and more prompts are
sampled, up to `dynamic_sampling_max_rounds` extra rounds, until the batch is full of informative groups;
the logged rollout metrics are those of the first round (what the policy does before filtering).
Before the model and the optimizer state are made, the run's memory plan (train/memory_plan.py) is printed and
checked against the GPU (train/memory_check.py): a run that cannot fit stops there, naming settings that fit.
Device memory is logged per phase (`DeviceMemory`): `memory/generate_gib` at the end of generating,
`memory/train_gib` the training phase's high-water mark, `memory/gpu_gib` the larger, and `memory/gpu_used_gib`
the arrays in use (zeros on the CPU).
On N processes (`barerl.distributed`) each generates and scores its share of the prompts, whole groups; the
rollouts are gathered, so every process holds the batch one process would have and trains on its block of
its micro-batches; normalisers and metrics are the whole batch's.
With LoRA (`lora_r`, `lora_adapter`; model/lora.py) the engine generates with the adapters the optimizer
rewrites in place, the trainer's passes draw their dropout masks from (seed, step, micro-batch), and the KL
reference is the frozen base itself (peft's disabled adapters): no copy of the weights.
"""

from __future__ import annotations

import math
import time
from dataclasses import dataclass

import numpy as np

from barerl.cpu_threads import on_cpu_blas_threads
from barerl.distributed import process_group
from barerl.distributed.rollouts import gather_rollouts, generation_plan
from barerl.model.lora import training_dropout_seed
from barerl.model.model import Model
from barerl.model.weights import ParameterBuffer
from barerl.tokenizer import load_tokenizer
from barerl.train.config import GRPOConfig
from barerl.train.data import EpochSampler, load_dataset
from barerl.train.episode_metrics import turn_mismatch
from barerl.train.interrupts import stops_on_signals
from barerl.train.losses import PolicyLoss, logprob_mismatch
from barerl.train.memory_check import plan_run
from barerl.train.memory_plan import rollout_kv_blocks
from barerl.train.multi_turn import rollout_generator
from barerl.train.preflight import check_positions, require_inputs
from barerl.train.reward_errors import check_reward_columns
from barerl.train.rewards import RewardRunner, load_rewards
from barerl.train.rollouts import Rollouts, TrainBatch, train_batches
from barerl.train.schedule import resolve_total_steps
from barerl.train.session import TrainingSession


@dataclass
class GRPOResult:
    steps: int
    rewards: list[float]  # mean reward of each step's rollouts
    output_dir: str
    checkpoint: str | None
    summary: str = ""


@stops_on_signals
@on_cpu_blas_threads
def train_grpo(cfg: GRPOConfig, model: Model | None = None, tokenizer=None, rows: list[dict] | None = None,
               reward_funcs=None, show_progress: bool = True, engine_args: dict | None = None) -> GRPOResult:
    """Run GRPO as `cfg` says; `model`, `tokenizer`, `rows` and `reward_funcs` override their config keys."""
    from barerl.engine.config import EngineConfig, kv_blocks_in_budget
    from barerl.engine.llm import LLM

    require_inputs(cfg, model=model, tokenizer=tokenizer, rows=rows)
    tokenizer = tokenizer if tokenizer is not None else load_tokenizer(cfg.model)
    rows = rows if rows is not None else load_dataset(cfg.dataset, task="grpo", split=cfg.dataset_train_split,
                                                      config=cfg.dataset_config).rows
    rewards = load_rewards(reward_funcs if reward_funcs is not None else list(cfg.reward_funcs),
                           cfg.reward_weights)
    if not rewards and not cfg.environment_factory:
        raise ValueError("reward_funcs: GRPO needs at least one reward function (or an environment_factory whose "
                         "steps give rewards)")
    check_reward_columns(rewards, rows)
    plan = generation_plan(cfg, process_group().size)
    num_prompts = plan.num_prompts
    micro_per_generation = plan.steps_per_generation
    updates_per_generation = max(1, micro_per_generation // cfg.gradient_accumulation_steps) * cfg.num_iterations
    generations_per_epoch = max(1, len(rows) // num_prompts)
    steps_per_epoch = generations_per_epoch * updates_per_generation
    total = resolve_total_steps(cfg.max_steps, cfg.num_train_epochs, steps_per_epoch)
    plan_run(cfg, model, engine_args, show=show_progress)  # before the model and the optimizer state exist
    run = TrainingSession(cfg, total, steps_per_epoch, model=model, tokenizer=tokenizer, show_progress=show_progress)
    sampler = EpochSampler(len(rows), seed=cfg.seed, shuffle=cfg.shuffle_dataset)
    data_state = run.resume()
    if data_state:
        sampler.load_state_dict(data_state["sampler"])
    model, dp = run.model, run.data_parallel
    positions = model.cfg.max_position_embeddings
    check_positions(cfg, positions)
    ref_model = _frozen_copy(model) if cfg.beta > 0 else None
    # The engine never runs more sequences at once than one generation round has completions: a KV cache
    # sized for those (not for the engine's default 256) leaves the rest of the memory to training.
    engine = {"max_num_seqs": plan.local_completions,
              "max_model_len": min((cfg.max_prompt_length or positions) + cfg.max_completion_length, positions),
              "device": model.device, "dtype": model.dtype.name,
              "seed": cfg.seed, **(engine_args or {})}
    if cfg.offload_optimizer:  # out of the way before the KV cache is allocated; back for each step
        run.optimizer.offload(cfg.offload_optimizer_ratio)
    if "num_kv_blocks" not in engine and cfg.max_prompt_length is not None:
        engine_cfg = EngineConfig(**engine)
        engine["num_kv_blocks"] = min(rollout_kv_blocks(cfg, engine_cfg.block_size, plan.local_completions),
                                      kv_blocks_in_budget(model, engine_cfg))
    llm = LLM(model, tokenizer, **engine)
    logger = run.open_logger()
    step_rewards, checkpoint = [], None
    with RewardRunner(rewards, num_workers=cfg.reward_num_workers, timeout=cfg.reward_timeout) as runner, \
            rollout_generator(cfg, tokenizer, plan.local_completions) as generate:
        while run.step < total:
            resume_point = {"sampler": sampler.state_dict()}  # where a stop during these rollouts resumes

            def sample(round_index: int, resume_point=resume_point) -> Rollouts:
                indices = sampler.take(num_prompts)
                mine = plan.prompt_share(dp.rank, dp.size)
                with run.abandonable(resume_point, release=llm.sleep):
                    local = generate(llm, tokenizer, [rows[i] for i in indices[mine]], cfg, run.step, runner,
                                     round_index, first_index=mine.start, row_ids=list(indices[mine]))
                return gather_rollouts(dp, local, cfg.num_generations, cfg.scale_rewards)

            rollouts = sample(0)
            rollout_metrics = _rollout_metrics(rollouts, cfg)
            if cfg.dynamic_sampling:
                rollouts, rollout_metrics["dynamic_sampling/rounds"] = _informative_batch(rollouts, sample, cfg,
                                                                                          num_prompts)
            generate_memory, train_memory = DeviceMemory(llm), DeviceMemory(llm)
            generate_memory.sample()
            if model.device == "cuda":
                llm.sleep()  # the KV cache's memory goes to training activations
            for metrics in _train_on(run, model, ref_model, rollouts, rollout_metrics, cfg, updates_per_generation,
                                     total, train_memory):
                metrics.update(_memory_metrics(generate_memory, train_memory))
                step_rewards.append(metrics["reward"])
                if run.step % cfg.logging_steps == 0 or run.step == total:
                    logger.log(run.step, metrics)
                if cfg.log_completions_steps and run.step % cfg.log_completions_steps == 0:
                    _log_samples(logger, run.step, rollouts)
                if run.should_save():
                    checkpoint = str(run.save({"sampler": sampler.state_dict()}))
            if cfg.offload_optimizer:  # before the KV cache is mapped again
                run.optimizer.offload(cfg.offload_optimizer_ratio)
            if model.device == "cuda":
                llm.wake()
    summary = run.finish()
    return GRPOResult(run.step, step_rewards, str(run.output_dir), checkpoint, summary)


class DeviceMemory:
    """High-water marks, in bytes, of what the device holds during one phase (generating, training).

    `reserved`: CuPy's pool (arrays in use + the free blocks it caches) plus what the engine holds outside it
    (KV cache, graph pool). `used`: the pool's arrays in use plus the same outside bytes, the nearer kin of
    torch's max_memory_allocated. The pool only grows until something calls free_all_blocks (the
    optimizer's offload / restore, the engine's sleep), so a sample taken before such a call sees the phase's
    peak of `reserved`; `used` is only as high as the samples caught it (a lower bound). Zeros on the CPU.
    """

    def __init__(self, llm):
        pool = getattr(llm.model.xp, "get_default_memory_pool", None)
        self._pool = pool() if pool is not None else None
        self._outside = llm.engine.runner.bytes_outside_default_pool
        self.reserved = self.used = 0

    def sample(self) -> None:
        if self._pool is None:
            return
        outside = self._outside()
        self.reserved = max(self.reserved, self._pool.total_bytes() + outside)
        self.used = max(self.used, self._pool.used_bytes() + outside)


def _memory_metrics(generate: DeviceMemory, train: DeviceMemory) -> dict:
    gib = 2**30
    return {"memory/generate_gib": generate.reserved / gib, "memory/train_gib": train.reserved / gib,
            "memory/gpu_gib": max(generate.reserved, train.reserved) / gib,
            "memory/gpu_used_gib": max(generate.used, train.used) / gib}


def _frozen_copy(model: Model) -> Model:
    """The KL reference: its own weights, sharing nothing mutable with the policy. Under LoRA it is the base
    model without the adapters (as peft's disabled adapters), the frozen weights shared, not copied."""
    if model.lora is not None:
        return Model(model.cfg, model.params, model.device)
    return Model(model.cfg, ParameterBuffer(model.cfg, model.params.flat.copy()), model.device)


def _informative_batch(first: Rollouts, sample, cfg: GRPOConfig, num_groups: int) -> tuple[Rollouts, int]:
    """DAPO's dynamic sampling: keep informative groups, sampling more rounds until num_groups of them."""
    G = cfg.num_generations
    parts, rounds = [first.informative(G)], 0
    count = len(parts[0]) // G
    while count < num_groups and rounds < cfg.dynamic_sampling_max_rounds:
        rounds += 1
        parts.append(sample(rounds).informative(G))
        count += len(parts[-1]) // G
    excess = max(0, count - num_groups) * G  # the last round may overfill the batch
    parts[-1] = parts[-1].select(np.arange(len(parts[-1])) < len(parts[-1]) - excess)
    return Rollouts.concatenate(parts, G, cfg.scale_rewards), rounds


def _train_on(run: TrainingSession, model: Model, ref_model, rollouts: Rollouts, rollout_metrics: dict,
              cfg: GRPOConfig, updates: int, total: int, memory: DeviceMemory):
    """Optimizer steps on one generation batch; yields each step's metrics after it is applied."""
    n = len(rollouts)
    per_update = math.ceil(n / max(1, updates // cfg.num_iterations)) if n else 0
    chunks = [list(range(i, min(i + per_update, n))) for i in range(0, n, per_update)] if n else [[]]
    needs_old = updates > 1
    prepared = [_prepare(run, model, ref_model, rollouts, chunk, cfg, needs_old) for chunk in chunks]
    for iteration in range(cfg.num_iterations):
        for k, batches in enumerate(prepared):
            if run.step >= total:
                return
            start = time.perf_counter()
            first = iteration == 0 and k == 0
            metrics = _update(run, model, batches, cfg, measure_mismatch=first, memory=memory)
            metrics.update(rollout_metrics)
            metrics["time/train"] = time.perf_counter() - start
            yield metrics


def _prepare(run, model, ref_model, rollouts, indices, cfg, needs_old) -> list[TrainBatch]:
    """The update's micro-batches (all ranks'), with old / reference log-probs on this rank's block."""
    batches = train_batches(rollouts, indices, cfg.per_device_train_batch_size, cfg.max_tokens_per_microbatch,
                            cfg.mask_truncated_completions)
    for tb in run.data_parallel.local(batches):
        if needs_old:
            tb.old_logp, _ = model.logprobs(tb.batch, cfg.sampling_filter)
        if ref_model is not None:
            tb.ref_logp, _ = ref_model.logprobs(tb.batch, cfg.sampling_filter)
    return batches


def _update(run: TrainingSession, model: Model, batches: list[TrainBatch], cfg: GRPOConfig,
            measure_mismatch: bool, memory: DeviceMemory) -> dict:
    xp, dp = model.xp, run.data_parallel
    run.optimizer.zero_grad()
    num_items = max(sum(tb.batch.num_loss_tokens for tb in batches), 1)
    num_sequences = sum(tb.batch.num_sequences for tb in batches)
    sums: dict[str, float] = {}
    # log-probs of the whole step, for the mismatch stats
    seen = {"engine": [], "trainer": [], "mask": [], "turn": []} if measure_mismatch else None
    results = []  # this rank's micro-batches: (loss, entropy sum, metrics, loss tokens, tokens)
    numbered = dp.local(list(enumerate(batches)))  # the step's index of each: the dropout seed's, on any rank
    for (index, tb), grads in dp.micro_batch_gradients(numbered, run.optimizer.grads):
        if tb.batch.num_loss_tokens == 0:
            continue
        part, entropy, metrics = _micro_batch(run, model, tb, grads, cfg, num_items, num_sequences, len(batches),
                                              seen, memory, training_dropout_seed(cfg.seed, run.step, index))
        results.append((part, entropy, metrics, tb.batch.num_loss_tokens, tb.batch.num_tokens))
    loss, entropy_sum, tokens = 0.0, 0.0, 0
    for part, entropy, metrics, loss_tokens, num_tokens in dp.gather_in_order(results, "step metrics"):
        loss += part
        entropy_sum += entropy
        share = loss_tokens / num_items
        for key, value in metrics.items():
            sums[key] = sums.get(key, 0.0) + float(value) * share
        tokens += num_tokens
    if seen is not None:
        seen = {key: dp.gather_arrays_in_order(arrays, xp) for key, arrays in seen.items()}
    if seen and seen["mask"]:  # over every completion token of the step (not averaged per micro-batch)
        step_mismatch = logprob_mismatch(*(xp.concatenate(seen[key]) for key in ("engine", "trainer", "mask")))
        sums.update({f"mismatch/{key}": value for key, value in step_mismatch.items()})
        if seen["turn"]:
            sums.update(turn_mismatch(*(xp.concatenate(seen[key]) for key in ("engine", "trainer", "mask", "turn")),
                                      xp))
    out = {"loss": loss, "entropy": entropy_sum / num_items, "num_tokens": tokens, **sums}
    out.update(run.optimizer_step())
    memory.sample()  # before a checkpoint's restore() frees the pool's cached blocks
    return out


def _micro_batch(run: TrainingSession, model: Model, tb: TrainBatch, grads, cfg: GRPOConfig, num_items: int,
                 num_sequences: int, num_micro_batches: int, seen: dict | None, memory: DeviceMemory,
                 dropout_seed: int) -> tuple[float, float, dict]:
    """One micro-batch's forward and backward into `grads`: (loss, entropy sum, metrics).

    A function of its own so that what it allocates (the loss's per-token arrays and the closure holding them;
    the model frees its activations itself) is gone before the optimizer steps; `seen` keeps the log-probs
    the mismatch stats need."""
    xp = model.xp
    mask = xp.asarray(tb.batch.loss_mask)
    engine_logp = xp.asarray(tb.engine_logp)
    policy = _policy_loss(xp, tb, mask, engine_logp, cfg, num_items, num_sequences, num_micro_batches)
    entropy_sum = 0.0

    def loss_fn(logp, entropy):
        nonlocal entropy_sum
        memory.sample()  # the whole forward's checkpoints are alive here: near the micro-batch's peak
        entropy_sum += float((entropy * mask).sum())
        if seen is not None:
            for key, array in (("engine", engine_logp), ("trainer", logp), ("mask", mask)):
                seen[key].append(array)
            if tb.turns is not None:
                seen["turn"].append(xp.asarray(tb.turns))
        return policy(logp, entropy)

    loss, metrics = model.forward_backward(tb.batch, loss_fn, grads, cfg.sampling_filter,
                                           checkpoint=cfg.gradient_checkpointing,
                                           keep_ops=cfg.gradient_checkpointing_keep, token_grad=policy.token_grad,
                                           dropout_seed=dropout_seed)
    return loss, entropy_sum, metrics


def _policy_loss(xp, tb: TrainBatch, mask, engine_logp, cfg: GRPOConfig, num_items: int, num_sequences: int,
                 num_micro_batches: int) -> PolicyLoss:
    """The policy loss of one micro-batch, prepared before its forward pass."""
    return PolicyLoss(
        _dev(xp, tb.old_logp), xp.asarray(tb.advantages), mask, xp.asarray(tb.batch.cu_seqlens),
        loss_type=cfg.loss_type, epsilon=cfg.epsilon, epsilon_high=cfg.epsilon_high, beta=cfg.beta,
        ref_logp=_dev(xp, tb.ref_logp), importance_sampling_level=cfg.importance_sampling_level,
        max_completion_length=cfg.max_completion_length, behaviour_logp=engine_logp,
        importance_sampling_mode=cfg.importance_sampling_mode if cfg.importance_sampling_correction else None,
        importance_sampling_cap=cfg.importance_sampling_cap, num_items_in_batch=num_items,
        num_sequences_in_batch=num_sequences, num_micro_batches=num_micro_batches, delta=cfg.delta,
        top_entropy_quantile=cfg.top_entropy_quantile,
    )


def _dev(xp, array):
    return None if array is None else xp.asarray(array)


def _rollout_metrics(rollouts: Rollouts, cfg: GRPOConfig) -> dict:
    lengths = np.array([len(c) for c in rollouts.completion_ids])
    total = rollouts.scores.total
    metrics = rollouts.scores.metrics()
    metrics.update({
        "reward_std": float(total.reshape(-1, cfg.num_generations).std(axis=1, ddof=1).mean()),
        "frac_reward_zero_std": float(rollouts.zero_std.mean()),
        "completions/mean_length": float(lengths.mean()),
        "completions/min_length": int(lengths.min()),
        "completions/max_length": int(lengths.max()),
        "completions/clipped_ratio": float(rollouts.truncated.mean()),
        "time/generate": rollouts.generate_seconds,
        "time/score": rollouts.score_seconds,
        "generated_tokens_per_second": float(lengths.sum()) / max(rollouts.generate_seconds, 1e-9),
    })
    if rollouts.episodes is not None:
        metrics.update(rollouts.episodes.metrics())
    return metrics


def _log_samples(logger, step: int, rollouts: Rollouts) -> None:
    texts = lambda xs: [x if isinstance(x, str) else x[-1]["content"] for x in xs]
    logger.log_samples(step, texts(rollouts.prompts), [_completion_text(c) for c in rollouts.completions],
                       rollouts.scores.total.tolist(), advantage=rollouts.advantages.tolist())


def _completion_text(completion) -> str:
    """A completion as samples.jsonl shows it; a multi-turn one with all its messages, each headed by its role."""
    if isinstance(completion, str):
        return completion
    if len(completion) == 1:
        return completion[0]["content"]
    return "\n\n".join(f"[{m['role']}] {m['content']}" for m in completion)
