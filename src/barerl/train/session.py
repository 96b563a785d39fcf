"""What the SFT and GRPO loops share: device choice, model + tokenizer, optimizer, schedule, metrics,
checkpoints and resume.

A `TrainingSession` owns the mutable training state. The loops own only their data flow. Resuming restores
everything a step depends on (weights, optimizer moments, step count, data position; sampling seeds are
derived from (seed, step)), so a resumed run takes the same next steps as one never stopped. A SIGINT or
SIGTERM (train/interrupts.py) makes the next `should_save` true and `save` raise `TrainingInterrupted` once
the checkpoint is written; in an `abandonable` phase the session saves the last finished step at once.
Started as several processes (`mpirun`, `srun`), it holds the job's `DataParallel`: each process takes its
GPU, its optimizer shard and its share of every step; rank 0 alone writes logs and checkpoints, which every
rank resumes from, whatever their number.

With LoRA (`lora_r` > 0 or `lora_adapter`) the session gives the model adapters (the model object the caller
passed in, so what it generates with afterwards has them) and the optimizer trains them alone, sharded across
processes as the full parameters are; checkpoints hold the adapter (PEFT format, naming the base model's path)
and its optimizer state, and a resumed run takes its base from `model` again and its adapters from the
checkpoint.
"""

from __future__ import annotations

import dataclasses
import os
from contextlib import contextmanager
from pathlib import Path

from barerl.device import resolve_auto_dtype, resolve_device
from barerl.distributed import DataParallel, process_group
from barerl.model.lora import add_lora, lora_config_of
from barerl.model.model import Model
from barerl.model.peft_format import adapter_base, is_adapter, load_adapter, read_adapter, write_adapter
from barerl.tokenizer import load_tokenizer
from barerl.train import interrupts
from barerl.train.metrics import MetricsLogger, SilentLogger
from barerl.train.optimizer import AdamW
from barerl.train.output_dir import prepare_output_dir
from barerl.train.schedule import make_schedule
from barerl.train.state import load_training_state, save_training_state


class TrainingSession:
    def __init__(self, cfg, total_steps: int, steps_per_epoch: int, model: Model | None = None, tokenizer=None,
                 show_progress=True):
        self.cfg = cfg
        group = process_group()
        # before the model loads, so that a refused folder fails fast; rank 0 looks, every rank learns the answer
        self.resume_from = group.on_main(lambda: prepare_output_dir(cfg), "output_dir")
        self.device = resolve_device(cfg.device) if model is None else model.device
        batch_invariant = getattr(cfg, "batch_invariant", None)  # GRPO's: set once, here, for the whole run
        if model is None:
            if not cfg.model:
                raise ValueError("model: no model given (set --model PATH to a Hugging Face folder or .gguf)")
            if self.device == "cuda" and group.size > 1:
                group.select_gpu()
            model = Model.from_pretrained(cfg.model, device=self.device, dtype=resolve_auto_dtype(cfg.dtype, self.device),
                                          batch_invariant=bool(batch_invariant))
        attach_lora(cfg, model)  # before the model for this run's arithmetic is made: it shares the adapters
        self.model = model if batch_invariant is None else model.with_batch_invariant(batch_invariant)
        self.tokenizer = tokenizer if tokenizer is not None else load_tokenizer(cfg.model)
        if self.tokenizer is None:
            raise ValueError(f"model: {cfg.model} has no tokenizer (a folder needs tokenizer.json)")
        trained = model.params if model.lora is None else model.lora.weights
        self.data_parallel = DataParallel.from_config(group, trained, self.device, cfg)
        self.optimizer = AdamW.from_config(trained, model.backend, cfg, shard=self.data_parallel.optimizer_shard)
        self.total_steps, self.steps_per_epoch = total_steps, steps_per_epoch
        self.schedule = make_schedule(cfg.lr_scheduler_type, cfg.learning_rate, total_steps, cfg.warmup_steps,
                                      cfg.warmup_ratio)
        self.output_dir = Path(cfg.output_dir)
        self.step = 0
        self.resumed_from: Path | None = None
        self._show_progress = show_progress
        self.logger: MetricsLogger | None = None
        self.stop = interrupts.active()  # None when the loop runs without signal handling
        self._resumable: tuple[int, Path] | None = None  # (step, path) of the newest resumable checkpoint

    def resume(self) -> dict:
        """Load the checkpoint named by resume_from_checkpoint (if any); returns its data state."""
        path = self.resume_from  # one checkpoint for every rank; its files' checksums were verified
        if path is None:
            return {}
        from barerl.model.checkpoint import load_checkpoint

        if self.model.lora is None:
            _, params = load_checkpoint(path, dtype=str(self.model.dtype.name), xp=self.model.xp, verify=False)
            self.model.params.flat[...] = params.flat
        else:  # the whole adapter buffer (a sharded optimizer restores its own shard alone); the base is `model`
            load_adapter(self.model, path, self.model.lora.config.lora_dropout)
        state = load_training_state(path, optimizer=self.optimizer)
        self.step, self.resumed_from = state.step, path
        self._resumable = (state.step, path)
        return state.data

    def open_logger(self) -> MetricsLogger | SilentLogger:
        if not self.data_parallel.is_main:
            self.logger = SilentLogger()
            return self.logger
        self.logger = MetricsLogger(
            self.output_dir, self.total_steps, report_to=self.cfg.report_to, run_name=self.cfg.run_name,
            config=dataclasses.asdict(self.cfg), start_step=self.step, show_progress=self._show_progress,
        )
        if self.stop is not None:  # from here on a signal saves a checkpoint
            self.stop.training = True
        return self.logger

    def optimizer_step(self) -> dict:
        """Apply the accumulated gradients with this step's learning rate; the caller zeroed them."""
        metrics = self.data_parallel.step(self.optimizer, self.schedule.lr(self.step))
        self.step += 1
        return {"grad_norm": metrics["grad_norm"], "learning_rate": metrics["lr"],
                "grad_clipped": metrics["clipped"], "step_skipped": metrics["skipped"]}

    @property
    def stop_requested(self) -> bool:
        return self.stop is not None and self.stop.received is not None

    def should_save(self) -> bool:
        if self.stop_requested:
            return True
        if self.cfg.save_strategy == "no":
            return False
        every = self.steps_per_epoch if self.cfg.save_strategy == "epoch" else self.cfg.save_steps
        return self.step == self.total_steps or (every > 0 and self.step % every == 0)

    def save(self, data_state: dict) -> Path:
        """Write checkpoint-{step}; after a stop signal (also one during this save), then raise
        TrainingInterrupted with a resumable checkpoint (see interrupts.py)."""
        resumable = self.stop_requested or not self.cfg.save_only_model
        path = self._write(data_state, resumable)
        if self.stop_requested:
            raise self._interrupted(path if resumable else self._write(data_state, resumable=True))
        return path

    def _write(self, data_state: dict, resumable: bool) -> Path:
        """Rank 0 writes the checkpoint (with the whole optimizer state unless not `resumable`); every rank
        gets its path."""
        optimizer = self.data_parallel.whole_optimizer_state(self.optimizer) if resumable else None
        path = self.data_parallel.on_main(lambda: save_training_state(
            self.output_dir, self.step, optimizer, self.schedule.state_dict(), {"seed": self.cfg.seed},
            data_state, dataclasses.asdict(self.cfg), params=self.model.params, tokenizer=self.tokenizer,
            save_total_limit=self.cfg.save_total_limit,
            write_model=None if self.model.lora is None else self._write_adapter,
        ), "checkpoint")
        if resumable:
            self._resumable = (self.step, path)
        return path

    @contextmanager
    def abandonable(self, data_state: dict, release=None):
        """A phase that a stop signal abandons at once (GRPO's rollouts): the last finished step is saved with
        `data_state` (the data position after it), once `release()` (e.g. of the engine's KV cache) ran."""
        if self.stop is None:
            yield
            return
        try:
            with self.stop.abandonable():
                yield
        except interrupts.StepAbandoned:
            self.stop.training = False  # a second signal stops at once from here
            if release is not None:
                release()
            step, path = self._resumable or (0, None)
            if step != self.step and self.step > 0:
                path = self._write(data_state, resumable=True)
            raise self._interrupted(path) from None

    def _interrupted(self, checkpoint: Path | None) -> interrupts.TrainingInterrupted:
        self.finish()
        name, signum = self.stop.signal_name, self.stop.received
        if checkpoint is None:
            return interrupts.TrainingInterrupted(f"{name}: stopped before the first step ended; nothing to save",
                                                  signum, None)
        return interrupts.TrainingInterrupted(
            f"{name}: stopped after step {self.step} of {self.total_steps}; saved {checkpoint}\n"
            f"resume with: {interrupts.resume_hint(checkpoint)}", signum, checkpoint)

    def _write_adapter(self, folder) -> None:
        base = self.cfg.model
        if base and is_adapter(base):  # started from an adapter given as the model: its base is the base
            base = adapter_base(base)
        write_adapter(folder, self.model.lora, os.path.abspath(base) if base and os.path.exists(base) else base)
        self.tokenizer.save_pretrained(folder)

    def finish(self) -> str:
        """Close the logger, draw the curves; returns the run's summary text."""
        if self.logger is None:
            return ""
        self.logger.close()
        self.logger.plot()
        return self.logger.summary()


def attach_lora(cfg, model: Model) -> None:
    """The adapters the config asks for: fresh ones (lora_r > 0, seeded by the run's seed) or a PEFT adapter's
    (lora_adapter); nothing without either (a model given with adapters keeps them; one loaded from an adapter
    folder as `model` takes the run's lora_dropout)."""
    if not (cfg.lora_r or cfg.lora_adapter):
        if model.lora is not None and cfg.model and is_adapter(cfg.model):
            model.lora.config = dataclasses.replace(model.lora.config, lora_dropout=cfg.lora_dropout)
        return
    if model.lora is not None:
        raise ValueError("lora_r / lora_adapter: the model has LoRA adapters already (leave both unset to train "
                         "those)")
    if cfg.lora_adapter:
        r = read_adapter(cfg.lora_adapter)[0].r
        if cfg.lora_r not in (0, r):
            raise ValueError(f"lora_r={cfg.lora_r}, but the adapter {cfg.lora_adapter} has r={r} (leave lora_r at 0 "
                             "to take the adapter's)")
        load_adapter(model, cfg.lora_adapter, cfg.lora_dropout)
        return
    add_lora(model, lora_config_of(cfg), seed=cfg.seed)
