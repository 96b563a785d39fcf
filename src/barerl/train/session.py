"""What the SFT and GRPO loops share: device choice, model + tokenizer, optimizer, schedule, metrics,
checkpoints and resume.

A `TrainingSession` owns the mutable training state. The loops own only their data flow. Resuming restores
everything a step depends on (weights, optimizer moments, step count, data position; sampling seeds are
derived from (seed, step)), so a resumed run takes the same next steps as one never stopped.
"""

from __future__ import annotations

import dataclasses
from pathlib import Path

from barerl.model.model import Model
from barerl.tokenizer import load_tokenizer
from barerl.train.metrics import MetricsLogger
from barerl.train.optimizer import AdamW
from barerl.train.output_dir import prepare_output_dir
from barerl.train.schedule import make_schedule
from barerl.train.state import load_training_state, save_training_state


def resolve_device(device: str) -> str:
    if device != "auto":
        return device
    try:
        import cupy

        return "cuda" if cupy.cuda.runtime.getDeviceCount() > 0 else "cpu"
    except Exception:  # noqa: BLE001 -- no cupy, no driver or no GPU all mean: run on the CPU
        return "cpu"


def resolve_auto_dtype(dtype: str, device: str) -> str:
    if dtype != "auto":
        return dtype
    return "bfloat16" if device == "cuda" else "float32"


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

    def resume(self) -> dict:
        """Load the checkpoint named by resume_from_checkpoint (if any); returns its data state."""
        path = self.resume_from
        if path is None:
            return {}
        from barerl.model.checkpoint import load_checkpoint

        _, params = load_checkpoint(path, dtype=str(self.model.dtype.name), xp=self.model.xp)
        self.model.params.flat[...] = params.flat
        state = load_training_state(path, optimizer=self.optimizer)
        self.step, self.resumed_from = state.step, path
        return state.data

    def open_logger(self) -> MetricsLogger:
        self.logger = MetricsLogger(
            self.output_dir, self.total_steps, report_to=self.cfg.report_to, run_name=self.cfg.run_name,
            config=dataclasses.asdict(self.cfg), start_step=self.step, show_progress=self._show_progress,
        )
        return self.logger

    def optimizer_step(self) -> dict:
        """Apply the accumulated gradients with this step's learning rate; the caller zeroed them."""
        metrics = self.optimizer.step(self.schedule.lr(self.step))
        self.step += 1
        return {"grad_norm": metrics["grad_norm"], "learning_rate": metrics["lr"],
                "grad_clipped": metrics["clipped"], "step_skipped": metrics["skipped"]}

    def should_save(self) -> bool:
        every = self.cfg.save_steps
        return self.step == self.total_steps or (every > 0 and self.step % every == 0)

    def save(self, data_state: dict) -> Path:
        return save_training_state(
            self.output_dir, self.step, self.optimizer, self.schedule.state_dict(), {"seed": self.cfg.seed},
            data_state, dataclasses.asdict(self.cfg), params=self.model.params, tokenizer=self.tokenizer,
            save_total_limit=self.cfg.save_total_limit,
        )

    def finish(self) -> str:
        """Close the logger, draw the curves; returns the run's summary text."""
        if self.logger is None:
            return ""
        self.logger.close()
        self.logger.plot()
        return self.logger.summary()
