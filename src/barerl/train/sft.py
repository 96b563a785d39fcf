"""Supervised fine-tuning.

One optimizer step = `gradient_accumulation_steps` micro-batches. With packing (the default) a micro-batch is
as many whole sequences as fit in `max_tokens_per_microbatch` (attention never crosses sequences, so packing
does not change the loss); without it, `per_device_train_batch_size` sequences. The loss is the mean
negative log-likelihood over every loss token of the optimizer step (the normaliser spans all its
micro-batches), so accumulation and packing give the same gradient as one big batch. Its gradient is
token-local (-mask / normaliser), so the LM head runs each chunk's backward inside its forward
(`sft_token_grad`). On N processes a step is N * gradient_accumulation_steps micro-batches, drawn by every
process from the same sampler; each trains on its block of them (`barerl.distributed`).
"""

from __future__ import annotations

import math
import time
import warnings
from dataclasses import dataclass

from barerl.cpu_threads import on_cpu_blas_threads
from barerl.distributed import process_group
from barerl.formats.paths import is_hub_id
from barerl.model.lora import training_dropout_seed
from barerl.tokenizer import load_tokenizer
from barerl.train.config import SFTConfig
from barerl.train.data import (
    EpochSampler,
    Example,
    PackedBatch,
    load_dataset,
    next_packed_batch,
    pack,
    tokenize_dataset,
    train_eval_split,
)
from barerl.train.interrupts import stops_on_signals
from barerl.train.losses import sft_loss, sft_token_grad
from barerl.train.memory_check import plan_run
from barerl.train.preflight import require_inputs
from barerl.train.schedule import resolve_total_steps
from barerl.train.session import TrainingSession


@dataclass
class SFTResult:
    steps: int
    final_loss: float
    eval_loss: float | None
    output_dir: str
    checkpoint: str | None
    summary: str = ""


def _micro_batch(cfg: SFTConfig, examples: list[Example], sampler: EpochSampler) -> PackedBatch:
    budget = cfg.max_tokens_per_microbatch or max(len(e) for e in examples) * cfg.per_device_train_batch_size
    if cfg.packing:
        return next_packed_batch(examples, sampler, budget)
    chosen = [examples[i] for i in sampler.take(cfg.per_device_train_batch_size)]
    return PackedBatch.from_examples(chosen)


def _mean_loss(model, batches: list[PackedBatch], dp=None) -> float:
    """Mean NLL per loss token; with a DataParallel `dp`, each rank takes its block of the batches."""
    parts = []
    for batch in batches if dp is None else dp.local(batches):
        logp, _ = model.logprobs(batch)
        mask = model.xp.asarray(batch.loss_mask)
        parts.append(float(-(logp * mask).sum()))
    total = 0.0
    for part in parts if dp is None else dp.gather_in_order(parts, "evaluation loss"):
        total += part
    return total / max(sum(b.num_loss_tokens for b in batches), 1)


def evaluation_loss(model, examples: list[Example], max_tokens: int, dp=None) -> float | None:
    return _mean_loss(model, pack(examples, max_tokens), dp) if examples else None


@stops_on_signals
@on_cpu_blas_threads
def train_sft(cfg: SFTConfig, model=None, tokenizer=None, rows: list[dict] | None = None,
              show_progress: bool = True) -> SFTResult:
    """Run SFT as `cfg` says; `model`, `tokenizer` and `rows` override cfg.model / cfg.dataset."""
    require_inputs(cfg, model=model, tokenizer=tokenizer, rows=rows)
    tokenizer = tokenizer if tokenizer is not None else load_tokenizer(cfg.model)
    dataset = load_dataset(cfg.dataset, task="sft", text_field=cfg.dataset_text_field, split=cfg.dataset_train_split,
                           config=cfg.dataset_config) if rows is None else None
    fmt = dataset.format if dataset is not None else _format_of(rows)
    all_rows = dataset.rows if dataset is not None else rows
    train_rows, eval_rows = train_eval_split(all_rows, cfg.eval_split, cfg.seed)
    eval_source = cfg.eval_dataset or _hub_test_split(cfg)
    if eval_source:
        eval_rows = load_dataset(eval_source, task="sft", text_field=cfg.dataset_text_field,
                                 split=cfg.dataset_test_split, config=cfg.dataset_config).rows
    if cfg.eval_steps is not None and not eval_rows:
        warnings.warn(f"eval_steps={cfg.eval_steps}, but there is no evaluation data (eval_dataset, or eval_split "
                      "of dataset): the run evaluates nothing", stacklevel=2)
    options = {"max_length": cfg.max_length, "completion_only_loss": cfg.completion_only_loss,
               "assistant_only_loss": cfg.assistant_only_loss, "text_field": cfg.dataset_text_field}
    examples = tokenize_dataset(_as_dataset(train_rows, fmt, cfg.dataset), tokenizer, **options)
    eval_examples = tokenize_dataset(_as_dataset(eval_rows, fmt, cfg.eval_dataset), tokenizer, **options) \
        if eval_rows else []

    sampler = EpochSampler(len(examples), seed=cfg.seed, shuffle=cfg.shuffle_dataset)
    micro_per_step = cfg.gradient_accumulation_steps * process_group().size
    steps_per_epoch = _steps_per_epoch(cfg, examples, micro_per_step)
    total = resolve_total_steps(cfg.max_steps, cfg.num_train_epochs, steps_per_epoch)
    plan_run(cfg, model, show=show_progress)  # before the model and the optimizer state exist
    run = TrainingSession(cfg, total, steps_per_epoch, model=model, tokenizer=tokenizer, show_progress=show_progress)
    dp = run.data_parallel
    data_state = run.resume()
    if data_state:
        sampler.load_state_dict(data_state["sampler"])
    logger = run.open_logger()
    model, loss, eval_loss, checkpoint = run.model, math.nan, None, None
    eval_budget = cfg.max_tokens_per_microbatch or 8192
    while run.step < total:
        start = time.perf_counter()
        batches = [_micro_batch(cfg, examples, sampler) for _ in range(micro_per_step)]
        normaliser = max(sum(b.num_loss_tokens for b in batches), 1)
        run.optimizer.zero_grad()
        parts = []
        numbered = dp.local(list(enumerate(batches)))  # the step's index of each: the dropout seed's, on any rank
        for (index, batch), grads in dp.micro_batch_gradients(numbered, run.optimizer.grads):
            mask = model.xp.asarray(batch.loss_mask)
            part, _ = model.forward_backward(
                batch, lambda logp, entropy, mask=mask, n=normaliser: (*sft_loss(logp, mask, n), {}),
                grads, checkpoint=cfg.gradient_checkpointing,
                keep_ops=cfg.gradient_checkpointing_keep, token_grad=sft_token_grad(mask, normaliser),
                dropout_seed=training_dropout_seed(cfg.seed, run.step, index),
            )
            parts.append(part)
        loss = 0.0
        for part in dp.gather_in_order(parts, "loss"):
            loss += part
        metrics = run.optimizer_step()
        num_tokens = sum(b.num_tokens for b in batches)
        metrics.update(loss=loss, num_tokens=num_tokens, epoch=sampler.epoch + sampler.position / sampler.num_items,
                       tokens_per_second=num_tokens / (time.perf_counter() - start))
        if cfg.eval_steps and run.step % cfg.eval_steps == 0 and eval_examples:
            metrics["eval_loss"] = eval_loss = evaluation_loss(model, eval_examples, eval_budget, dp)
        if run.step % cfg.logging_steps == 0 or run.step == total:
            logger.log(run.step, metrics)
        if run.should_save():
            checkpoint = str(run.save({"sampler": sampler.state_dict()}))
    if eval_examples and eval_loss is None:
        eval_loss = evaluation_loss(model, eval_examples, eval_budget, dp)
        logger.log(run.step, {"eval_loss": eval_loss})
    summary = run.finish()
    return SFTResult(run.step, loss, eval_loss, str(run.output_dir), checkpoint, summary)


def _hub_test_split(cfg: SFTConfig) -> str | None:
    """As TRL's `trl sft` script does: with evaluation asked for (eval_steps) and no evaluation data given
    (eval_dataset, eval_split), a Hub dataset's own dataset_test_split."""
    asked = cfg.eval_steps is not None and not cfg.eval_split
    return cfg.dataset if asked and cfg.dataset and is_hub_id(cfg.dataset) else None


def _steps_per_epoch(cfg: SFTConfig, examples: list[Example], micro_per_step: int) -> int:
    if cfg.packing and cfg.max_tokens_per_microbatch:
        micro = len(pack(examples, cfg.max_tokens_per_microbatch))
    else:
        micro = math.ceil(len(examples) / cfg.per_device_train_batch_size)
    return max(1, micro // micro_per_step)


def _format_of(rows: list[dict]) -> str:
    from barerl.train.data import detect_format

    return detect_format(rows, task="sft")


def _as_dataset(rows, fmt, source):
    from barerl.train.data import Dataset

    return Dataset(list(rows), fmt, str(source or "rows"))

