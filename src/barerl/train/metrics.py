"""Observability for the training loops: progress bar, metrics.jsonl, samples.jsonl, optional TensorBoard and
W&B, and at the end a PNG of the curves and a text summary.

Design decisions:
- `metrics.jsonl` is the record of a run: one JSON object per logged step (`step`, cumulative wall `time`,
  then the loop's metrics), flushed as it is written, so a crashed run keeps everything up to the crash.
  TensorBoard, W&B, the plot and the summary are views of the same numbers.
- Metric names follow TRL, so dashboards carry over: `loss`, `reward`, `reward_std`,
  `rewards/{name}/mean`, `completions/mean_length`, `kl`, `entropy`, `grad_norm`, `learning_rate`, ...
  The progress bar shows `reward`, `loss` and tokens/s (from `num_tokens`, the tokens processed by the
  step, or `tokens_per_second` when the loop measures it itself); tqdm shows the ETA.
- Resuming from step s (`start_step=s`) drops the lines of steps after s from both JSONL files: those
  steps are about to be run again, and their first attempt did not reach a checkpoint.
- Non-finite floats are written as null (strict JSON; NaN would break other readers).
- Optional pieces never break a run: tensorboardX, wandb and matplotlib are imported only when asked for;
  if one is missing, a one-line notice says so and that output is skipped. torch's TensorBoard writer is
  never used (the package does not import torch).
"""

from __future__ import annotations

import json
import math
import os
import sys
import time
from pathlib import Path
from typing import Any

from tqdm import tqdm

METRICS_FILE = "metrics.jsonl"
SAMPLES_FILE = "samples.jsonl"
PLOT_FILE = "curves.png"


def _notice(message: str) -> None:
    print(f"barerl: {message}", file=sys.stderr)


def _plain(value: Any) -> Any:
    """NumPy/CuPy scalars to Python numbers; non-finite floats to None."""
    if hasattr(value, "item") and getattr(value, "ndim", 0) == 0:
        value = value.item()
    if isinstance(value, float) and not math.isfinite(value):
        return None
    return value


class MetricsLogger:
    def __init__(
        self,
        output_dir: str | os.PathLike,
        total_steps: int,
        report_to: tuple[str, ...] | list[str] = ("jsonl",),
        run_name: str | None = None,
        config: dict | None = None,
        start_step: int = 0,
        show_progress: bool = True,
    ):
        self.output_dir = Path(output_dir)
        self.output_dir.mkdir(parents=True, exist_ok=True)
        self.metrics_path = self.output_dir / METRICS_FILE
        self.samples_path = self.output_dir / SAMPLES_FILE
        for path in (self.metrics_path, self.samples_path):
            _drop_steps_after(path, start_step)
        self._metrics = open(self.metrics_path, "a", encoding="utf-8")  # noqa: SIM115 (closed in close())
        self._samples = None
        self._elapsed_before = _last_time(self.metrics_path)  # wall time of the run before a resume
        self._start = self._last = time.monotonic()
        run_name = run_name or self.output_dir.resolve().name
        self._tensorboard = _open_tensorboard(self.output_dir) if "tensorboard" in report_to else None
        self._wandb = _open_wandb(self.output_dir, run_name, config) if "wandb" in report_to else None
        self.bar = tqdm(total=total_steps, initial=start_step, unit="step", dynamic_ncols=True,
                        disable=not show_progress)

    def log(self, step: int, metrics: dict[str, Any]) -> dict:
        """Record one step's metrics everywhere; returns the JSON record written."""
        now = time.monotonic()
        step_seconds, self._last = now - self._last, now
        record = {"step": step, "time": round(self._elapsed_before + now - self._start, 3)}
        record.update({key: _plain(value) for key, value in metrics.items()})
        if "tokens_per_second" not in record and record.get("num_tokens") and step_seconds > 0:
            record["tokens_per_second"] = record["num_tokens"] / step_seconds
        self._metrics.write(json.dumps(record) + "\n")
        self._metrics.flush()
        numbers = {k: v for k, v in record.items() if isinstance(v, (int, float)) and not isinstance(v, bool)}
        if self._tensorboard is not None:
            for key, value in numbers.items():
                if key != "step":
                    self._tensorboard.add_scalar(key, value, step)
        if self._wandb is not None:
            self._wandb.log(numbers, step=step)
        self._update_bar(step, record)
        return record

    def _update_bar(self, step: int, record: dict) -> None:
        postfix = {}
        for key, label in (("reward", "reward"), ("loss", "loss"), ("tokens_per_second", "tok/s")):
            if isinstance(record.get(key), (int, float)):
                value = record[key]
                postfix[label] = f"{value:.0f}" if key == "tokens_per_second" else f"{value:.4g}"
        self.bar.set_postfix(postfix, refresh=False)
        self.bar.update(max(0, step - self.bar.n))

    def log_samples(self, step: int, prompts: list, completions: list, rewards: list,
                    **columns: list) -> None:
        """One line per completion in samples.jsonl: step, prompt, completion, reward, and any `columns`
        (e.g. one list per reward function), all lists of the same length."""
        lengths = {len(prompts), len(completions), len(rewards), *(len(v) for v in columns.values())}
        if len(lengths) != 1:
            raise ValueError(f"log_samples: lists of different lengths {sorted(lengths)}")
        if self._samples is None:
            self._samples = open(self.samples_path, "a", encoding="utf-8")  # noqa: SIM115 (closed in close())
        for i, (prompt, completion, reward) in enumerate(zip(prompts, completions, rewards)):
            line = {"step": step, "prompt": prompt, "completion": completion, "reward": _plain(reward)}
            line.update({key: _plain(values[i]) for key, values in columns.items()})
            self._samples.write(json.dumps(line, ensure_ascii=False) + "\n")
        self._samples.flush()

    def close(self) -> None:
        self.bar.close()
        self._metrics.close()
        if self._samples is not None:
            self._samples.close()
        if self._tensorboard is not None:
            self._tensorboard.close()
        if self._wandb is not None:
            self._wandb.finish()

    def __enter__(self):
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def plot(self, path: str | os.PathLike | None = None) -> Path | None:
        return plot_metrics(self.metrics_path, path or self.output_dir / PLOT_FILE)

    def summary(self) -> str:
        return summarize_metrics(self.metrics_path)


class SilentLogger:
    """The logger of a rank other than 0 in a job of several processes: rank 0 records the job's metrics."""

    def log(self, step: int, metrics: dict[str, Any]) -> dict:
        return metrics

    def log_samples(self, step: int, prompts: list, completions: list, rewards: list, **columns: list) -> None:
        pass

    def close(self) -> None:
        pass

    def plot(self, path: str | os.PathLike | None = None) -> Path | None:
        return None

    def summary(self) -> str:
        return ""


# ---------------------------------------------------------------------------------------------------------
# Files


def read_metrics(path: str | os.PathLike) -> list[dict]:
    """The records of a metrics.jsonl (a torn last line, from a crash, is skipped)."""
    path = Path(path)
    if not path.is_file():
        return []
    records = []
    for line in path.read_text(encoding="utf-8").splitlines():
        try:
            records.append(json.loads(line))
        except json.JSONDecodeError:
            continue
    return records


def _drop_steps_after(path: Path, step: int) -> None:
    if not path.is_file():
        return
    kept = [r for r in read_metrics(path) if isinstance(r.get("step"), int) and r["step"] <= step]
    tmp = path.with_suffix(".jsonl.tmp")
    tmp.write_text("".join(json.dumps(r, ensure_ascii=False) + "\n" for r in kept), encoding="utf-8")
    os.replace(tmp, path)


def _last_time(path: Path) -> float:
    records = read_metrics(path)
    return float(records[-1].get("time") or 0.0) if records else 0.0


def _open_tensorboard(output_dir: Path):
    try:
        from tensorboardX import SummaryWriter
    except ImportError:
        _notice("report_to tensorboard: tensorboardX is not installed, skipping (pip install tensorboardX)")
        return None
    return SummaryWriter(logdir=str(output_dir / "tensorboard"))


def _open_wandb(output_dir: Path, run_name: str, config: dict | None):
    try:
        import wandb
    except ImportError:
        _notice("report_to wandb: wandb is not installed, skipping (pip install wandb)")
        return None
    project = os.environ.get("WANDB_PROJECT", "barerl")
    return wandb.init(project=project, name=run_name, dir=str(output_dir), config=config or {})


# ---------------------------------------------------------------------------------------------------------
# Plot and summary


def _series(records: list[dict], key: str) -> tuple[list[int], list[float]]:
    pairs = [(r["step"], r[key]) for r in records if isinstance(r.get(key), (int, float))]
    return [s for s, _ in pairs], [v for _, v in pairs]


def plot_metrics(metrics_path: str | os.PathLike, out_path: str | os.PathLike) -> Path | None:
    """curves.png: reward mean with its std band, loss (and eval_loss), and each reward function's mean.

    Returns the PNG's path, or None (with a notice) without matplotlib or without anything to plot.
    """
    try:
        from matplotlib.figure import Figure  # no pyplot: no global state, no GUI backend
    except ImportError:
        _notice("plot: matplotlib is not installed, skipping curves.png (pip install matplotlib)")
        return None
    records = read_metrics(metrics_path)
    per_reward = sorted({k for r in records for k in r if k.startswith("rewards/") and k.endswith("/mean")})
    panels = [p for p, keys in (("reward", ["reward"]), ("loss", ["loss", "eval_loss"]), ("rewards", per_reward))
              if any(_series(records, k)[0] for k in keys)]
    if not panels:
        _notice(f"plot: no reward or loss values in {metrics_path}, nothing to plot")
        return None
    fig = Figure(figsize=(5 * len(panels), 3.6), layout="constrained")
    for ax, panel in zip(fig.subplots(1, len(panels), squeeze=False)[0], panels):
        if panel == "reward":
            steps, mean = _series(records, "reward")
            ax.plot(steps, mean, label="reward")
            std = {r["step"]: r.get("reward_std") for r in records}
            band = [(s, m, std[s]) for s, m in zip(steps, mean) if isinstance(std.get(s), (int, float))]
            if band:
                ax.fill_between([s for s, _, _ in band], [m - d for _, m, d in band], [m + d for _, m, d in band],
                                alpha=0.25, label="± std")
        else:
            for key in ["loss", "eval_loss"] if panel == "loss" else per_reward:
                steps, values = _series(records, key)
                if steps:
                    ax.plot(steps, values, label=key.removeprefix("rewards/").removesuffix("/mean"))
        ax.set_title({"reward": "reward", "loss": "loss", "rewards": "reward functions (mean)"}[panel])
        ax.set_xlabel("step")
        ax.grid(alpha=0.3)
        ax.legend(fontsize="small")
    out_path = Path(out_path)
    fig.savefig(out_path, dpi=110)
    return out_path


def _window_mean(values: list[float], first: bool) -> float:
    width = max(1, len(values) // 10)
    part = values[:width] if first else values[-width:]
    return sum(part) / len(part)


def summarize_metrics(metrics_path: str | os.PathLike) -> str:
    """A few lines: steps and time; reward and loss at the start and the end (mean of the first / last
    10% of steps) and the best reward; mean throughput."""
    records = read_metrics(metrics_path)
    if not records:
        return "no steps logged"
    seconds = float(records[-1].get("time") or 0.0)
    lines = [f"steps: {records[-1]['step']} ({len(records)} logged) in {seconds / 60:.1f} min"]
    for key in ("reward", "loss", "eval_loss"):
        steps, values = _series(records, key)
        if values:
            line = f"{key}: {_window_mean(values, True):.4g} -> {_window_mean(values, False):.4g}"
            if key == "reward":
                best = max(range(len(values)), key=values.__getitem__)
                line += f" (best {values[best]:.4g} at step {steps[best]})"
            lines.append(line)
    _, rates = _series(records, "tokens_per_second")
    if rates:
        lines.append(f"throughput: {sum(rates) / len(rates):.0f} tokens/s")
    return "\n".join(lines)
