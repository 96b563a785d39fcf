"""Training checkpoints: a Hugging Face model folder plus everything needed to resume, written atomically.

Layout of `output_dir/checkpoint-{step}/`:

    config.json, model.safetensors, tokenizer files ...   the model, loadable by transformers as is
                                                           (written by `barerl.model.checkpoint`)
    trainer_state/optimizer.safetensors                    flat fp32 arrays: master, exp_avg, exp_avg_sq
                                                           (absent with save_only_model: not resumable)
    trainer_state/state.json                               step, optimizer scalars, scheduler, RNG and data
                                                           position, the run's config, extra, and the size
                                                           and SHA-256 of every other file (checked on
                                                           resume and on load: formats/checksums.py);
                                                           written last

A LoRA run writes its adapter in PEFT's format instead of the model (adapter_config.json, naming the base
model's path, + adapter_model.safetensors, with the tokenizer files), and its optimizer arrays are the
adapters' alone.

Design decisions:
- Atomic (formats/atomic.py): everything is written into `output_dir/.tmp-checkpoint-{step}-XXXX/`, fsynced,
  then renamed to `checkpoint-{step}`. A crash mid-save leaves only a temp folder, which `latest_checkpoint`
  ignores and the next save deletes; the previous checkpoints are untouched. Rotation (`save_total_limit`) deletes
  the oldest checkpoints only after the new one is in place.
- Non-array state is JSON (readable, diffable); the RNG state is whatever JSON-able value the loop gives
  (e.g. `np.random.Generator.bit_generator.state`); NumPy scalars and arrays in it become numbers/lists.
- The optimizer arrays are stored flat, in the `ParameterBuffer` layout, which the model config fixes (under
  LoRA in the adapters' `LoraWeights` layout, which the model config and the adapter's fix).
"""

from __future__ import annotations

import json
import os
import re
import shutil
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from barerl.formats.atomic import atomic_folder
from barerl.formats.checksums import file_checksums
from barerl.formats.safetensors import read_safetensors, write_safetensors
from barerl.model.checkpoint import write_checkpoint

FORMAT_VERSION = 1
STATE_DIR = "trainer_state"
STATE_FILE = "state.json"
OPTIMIZER_FILE = "optimizer.safetensors"
TEMP_PREFIX = ".tmp-checkpoint-"
_CHECKPOINT_RE = re.compile(r"^checkpoint-(\d+)$")


@dataclass
class TrainingState:
    """What `load_training_state` gives back (the optimizer's arrays go straight into the optimizer)."""

    path: Path
    step: int
    scheduler: dict = field(default_factory=dict)
    rng: Any = None
    data: dict = field(default_factory=dict)
    config: dict = field(default_factory=dict)
    extra: dict = field(default_factory=dict)
    optimizer_step: int = 0
    model_only: bool = False  # saved with save_only_model: no optimizer state
    checksums: dict = field(default_factory=dict)  # relative path -> {"bytes", "sha256"} of every other file

    def require_resumable(self) -> None:
        if self.model_only:
            raise ValueError(f"{self.path}: saved with save_only_model, it holds no optimizer state and cannot be "
                             f"resumed; start a new run from its weights with --model {self.path}")


def save_training_state(
    output_dir: str | os.PathLike,
    step: int,
    optimizer,
    scheduler_state: dict,
    rng_state: Any,
    data_state: dict,
    config: dict,
    extra: dict | None = None,
    *,
    params=None,
    tokenizer=None,
    save_total_limit: int | None = None,
    write_model=None,
) -> Path:
    """Write `output_dir/checkpoint-{step}` atomically and return its path.

    `optimizer` is a `barerl.train.optimizer.AdamW` (or anything with the same `state_dict`; None: the
    checkpoint holds no optimizer state and cannot be resumed, `save_only_model`); `params` is
    the model's working-weight `ParameterBuffer` (its `.cfg` is the model config), written in Hugging Face
    format with `tokenizer` beside it; `write_model(folder)` instead writes the model's files its own way (a
    LoRA adapter); with neither only the trainer state is written.
    """
    output_dir = Path(output_dir)
    output_dir.mkdir(parents=True, exist_ok=True)
    _remove_stale_temps(output_dir)
    final = output_dir / f"checkpoint-{step}"
    with atomic_folder(final, temp_prefix=f"{TEMP_PREFIX}{step}-") as tmp:
        if write_model is not None:
            write_model(tmp)
        elif params is not None:
            write_checkpoint(tmp, params.cfg, params, tokenizer=tokenizer)
        _write_trainer_state(tmp / STATE_DIR, step, optimizer, scheduler_state, rng_state, data_state,
                             config, extra or {})
    if save_total_limit is not None:
        rotate_checkpoints(output_dir, save_total_limit, keep=final)
    return final


def _write_trainer_state(folder: Path, step, optimizer, scheduler_state, rng_state, data_state, config,
                         extra) -> None:
    folder.mkdir()
    opt_state = optimizer.state_dict() if optimizer is not None else None
    if opt_state is not None:
        write_safetensors(str(folder / OPTIMIZER_FILE), sorted(opt_state["arrays"].items()))
    state = {
        "format_version": FORMAT_VERSION,
        "step": step,
        "optimizer": None if opt_state is None else {k: v for k, v in opt_state.items() if k != "arrays"},
        "scheduler": scheduler_state,
        "rng": rng_state,
        "data": data_state,
        "config": config,
        "extra": extra,
        "checksums": file_checksums(folder.parent),  # everything but this file is written by now
    }
    with open(folder / STATE_FILE, "w", encoding="utf-8") as f:  # last: its presence marks completeness
        json.dump(state, f, indent=2, default=_json_default)
        f.write("\n")


def _json_default(obj):
    if isinstance(obj, np.generic):
        return obj.item()
    if isinstance(obj, np.ndarray):
        return obj.tolist()
    if isinstance(obj, Path):
        return str(obj)
    raise TypeError(f"training state: cannot store {type(obj).__name__} {obj!r} as JSON")


def _remove_stale_temps(output_dir: Path) -> None:
    """Leftovers of saves that crashed (ours, and the model writer's siblings of ours)."""
    for entry in output_dir.iterdir():
        if entry.name.startswith(TEMP_PREFIX):
            shutil.rmtree(entry, ignore_errors=True)


def list_checkpoints(output_dir: str | os.PathLike) -> list[tuple[int, Path]]:
    """Complete checkpoints (trainer state present) as (step, path), oldest first."""
    output_dir = Path(output_dir)
    if not output_dir.is_dir():
        return []
    found = []
    for entry in output_dir.iterdir():
        match = _CHECKPOINT_RE.match(entry.name)
        if match and (entry / STATE_DIR / STATE_FILE).is_file():
            found.append((int(match.group(1)), entry))
    return sorted(found)


def latest_checkpoint(output_dir: str | os.PathLike) -> Path | None:
    """The newest complete checkpoint in output_dir, or None; temp folders of crashed saves are ignored."""
    checkpoints = list_checkpoints(output_dir)
    return checkpoints[-1][1] if checkpoints else None


def rotate_checkpoints(output_dir: str | os.PathLike, save_total_limit: int, keep: Path | None = None) -> None:
    """Delete the oldest checkpoints beyond save_total_limit (never `keep`)."""
    checkpoints = [path for _, path in list_checkpoints(output_dir) if path != keep]
    excess = len(checkpoints) + (keep is not None) - save_total_limit
    for path in checkpoints[: max(0, excess)]:
        shutil.rmtree(path)


def resolve_checkpoint(output_dir: str | os.PathLike, resume_from_checkpoint: str | None) -> Path | None:
    """The checkpoint to resume from: a path, 'latest' (None if output_dir has none yet), or None."""
    if resume_from_checkpoint is None:
        return None
    if resume_from_checkpoint == "latest":
        return latest_checkpoint(output_dir)
    path = Path(resume_from_checkpoint)
    if not (path / STATE_DIR / STATE_FILE).is_file():
        raise FileNotFoundError(f"resume_from_checkpoint: {path} is not a complete training checkpoint "
                                f"(no {STATE_DIR}/{STATE_FILE})")
    return path


def load_training_state(checkpoint_dir: str | os.PathLike, optimizer=None) -> TrainingState:
    """Read a checkpoint's trainer state; with `optimizer`, load its arrays and step into it."""
    checkpoint_dir = Path(checkpoint_dir)
    state_path = checkpoint_dir / STATE_DIR / STATE_FILE
    if not state_path.is_file():
        raise FileNotFoundError(f"{checkpoint_dir}: not a training checkpoint (no {STATE_DIR}/{STATE_FILE})")
    try:
        state = json.loads(state_path.read_text(encoding="utf-8"))
    except json.JSONDecodeError as e:
        raise ValueError(f"{state_path}: corrupt JSON ({e})") from None
    if state.get("format_version") != FORMAT_VERSION:
        raise ValueError(f"{state_path}: format_version {state.get('format_version')!r}, "
                         f"this barerl reads {FORMAT_VERSION}")
    opt = state["optimizer"]
    loaded = TrainingState(path=checkpoint_dir, step=state["step"], scheduler=state["scheduler"], rng=state["rng"],
                           data=state["data"], config=state["config"], extra=state["extra"],
                           optimizer_step=(opt or {}).get("step", 0), model_only=opt is None,
                           checksums=state.get("checksums") or {})
    if optimizer is not None:
        loaded.require_resumable()
        arrays = read_safetensors(str(checkpoint_dir / STATE_DIR / OPTIMIZER_FILE))
        optimizer.load_state_dict({**opt, "arrays": arrays})
    return loaded
