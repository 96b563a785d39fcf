"""What the SFT and GRPO loops share: device choice, model + tokenizer, optimizer, schedule, metrics,
checkpoints and resume.

A `TrainingSession` owns the mutable training state. The loops own only their data flow. Resuming restores
everything a step depends on (weights, optimizer moments, step count, data position; sampling seeds are
derived from (seed, step)), so a resumed run takes the same next steps as one never stopped. A SIGINT or
SIGTERM (train/interrupts.py) makes the next `should_save` true and `save` raise `TrainingInterrupted` once
the checkpoint is written; in an `abandonable` phase the session saves the last finished step at once.
"""

from __future__ import annotations

import dataclasses
from contextlib import contextmanager
from pathlib import Path

from barerl.device import resolve_auto_dtype, resolve_device
from barerl.model.model import Model
from barerl.tokenizer import load_tokenizer
from barerl.train import interrupts
from barerl.train.metrics import MetricsLogger
from barerl.train.optimizer import AdamW
from barerl.train.output_dir import prepare_output_dir
from barerl.train.schedule import make_schedule
from barerl.train.state import load_training_state, save_training_state


class TrainingSession:
    def __init__(self, cfg, total_steps: int, model: Model | None = None, tokenizer=None, show_progress=True):
        self.cfg = cfg
        self.resume_from = prepare_output_dir(cfg)  # before the model loads: a refused folder fails fast
        self.device = resolve_device(cfg.device) if model is None else model.device
        if model is None:
            if not cfg.model:
                raise ValueError("model: no model given (set --model PATH to a Hugging Face folder or .gguf)")
            model = Model.from_pretrained(cfg.model, device=self.device, dtype=resolve_auto_dtype(cfg.dtype, self.device))
        self.model = model
        self.tokenizer = tokenizer if tokenizer is not None else load_tokenizer(cfg.model)
        if self.tokenizer is None:
            raise ValueError(f"model: {cfg.model} has no tokenizer (a folder needs tokenizer.json)")
        self.optimizer = AdamW.from_config(model.params, model.backend, cfg)
        self.total_steps = total_steps
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
        path = self.resume_from  # its files' checksums were verified by prepare_output_dir
        if path is None:
            return {}
        from barerl.model.checkpoint import load_checkpoint

        _, params = load_checkpoint(path, dtype=str(self.model.dtype.name), xp=self.model.xp, verify=False)
        self.model.params.flat[...] = params.flat
        state = load_training_state(path, optimizer=self.optimizer)
        self.step, self.resumed_from = state.step, path
        self._resumable = (state.step, path)
        return state.data

    def open_logger(self) -> MetricsLogger:
        self.logger = MetricsLogger(
            self.output_dir, self.total_steps, report_to=self.cfg.report_to, run_name=self.cfg.run_name,
            config=dataclasses.asdict(self.cfg), start_step=self.step, show_progress=self._show_progress,
        )
        if self.stop is not None:  # from here on a signal saves a checkpoint
            self.stop.training = True
        return self.logger

    def optimizer_step(self) -> dict:
        """Apply the accumulated gradients with this step's learning rate; the caller zeroed them."""
        metrics = self.optimizer.step(self.schedule.lr(self.step))
        self.step += 1
        return {"grad_norm": metrics["grad_norm"], "learning_rate": metrics["lr"],
                "grad_clipped": metrics["clipped"], "step_skipped": metrics["skipped"]}

    @property
    def stop_requested(self) -> bool:
        return self.stop is not None and self.stop.received is not None

    def should_save(self) -> bool:
        every = self.cfg.save_steps
        return self.stop_requested or self.step == self.total_steps or (every > 0 and self.step % every == 0)

    def save(self, data_state: dict) -> Path:
        """Write checkpoint-{step}; after a stop signal (also one during this save), then raise
        TrainingInterrupted with a resumable checkpoint (see interrupts.py)."""
        resumable = self.stop_requested or not self.cfg.save_only_model
        path = self._write(data_state, resumable)
        if self.stop_requested:
            raise self._interrupted(path if resumable else self._write(data_state, resumable=True))
        return path

    def _write(self, data_state: dict, resumable: bool) -> Path:
        path = save_training_state(
            self.output_dir, self.step, self.optimizer if resumable else None, self.schedule.state_dict(),
            {"seed": self.cfg.seed}, data_state, dataclasses.asdict(self.cfg), params=self.model.params,
            tokenizer=self.tokenizer, save_total_limit=self.cfg.save_total_limit,
        )
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

    def finish(self) -> str:
        """Close the logger, draw the curves; returns the run's summary text."""
        if self.logger is None:
            return ""
        self.logger.close()
        self.logger.plot()
        return self.logger.summary()
