"""One run per output folder: a new run refuses a folder in use, a resume says what it loads and what changed.

Design decisions (what users of transformers' Trainer and TRL expect):
- A new run (no `resume_from_checkpoint`) needs a missing or empty `output_dir`. Otherwise it is refused,
  naming what the folder holds, unless `overwrite_output_dir`: then everything barerl writes into a run's
  folder (checkpoints, metrics.jsonl, samples.jsonl, curves.png, tensorboard/, wandb/) is deleted first, so
  nothing of the old run is left to be mixed with the new one (a later resume would load the old run's newer
  checkpoint). Files barerl did not write are left alone, and named.
- A resume says which checkpoint it loads and compares the config saved in it with the new one. A change
  that makes the resume meaningless is refused (`INCOMPATIBLE`: the weights and moments belong to another
  model, the saved data position indexes another sequence of examples, the groups of GRPO change size);
  every other change is listed, so that it is a decision and not an accident.
- Before anything is loaded, every file of the checkpoint is checked against the checksums its state
  recorded; a damaged one is named, with the earlier checkpoints that could be resumed instead.
- Resuming from a checkpoint older than the folder's newest is refused (unless `overwrite_output_dir`, which
  deletes the newer ones): the newer checkpoints belong to the run being abandoned, and a later
  `--resume` would load them.
"""

from __future__ import annotations

import os
import shutil
import sys
from pathlib import Path

from barerl.formats.checksums import ChecksumError, verify_checksums
from barerl.train.state import TEMP_PREFIX, list_checkpoints, load_training_state, resolve_checkpoint

# Changes that make a resume meaningless: the saved weights and moments belong to another model, the saved
# data position indexes another sequence of examples, or the rollouts' groups change size.
INCOMPATIBLE = ("model", "dataset", "dataset_text_field", "seed", "shuffle_dataset", "num_generations")
# Fields that say how to start, not what the run computes.
_NOT_COMPARED = ("resume_from_checkpoint", "overwrite_output_dir", "output_dir")
# What barerl writes into a run's folder (train/metrics.py, train/state.py).
_RUN_FILES = ("metrics.jsonl", "samples.jsonl", "curves.png", "tensorboard", "wandb")


def prepare_output_dir(cfg) -> Path | None:
    """Check cfg.output_dir for this run (see the module docstring); returns the checkpoint to resume from,
    or None for a fresh start. Raises ValueError naming the folder and what to do."""
    output_dir = Path(cfg.output_dir)
    checkpoint = resolve_checkpoint(output_dir, cfg.resume_from_checkpoint)
    if cfg.resume_from_checkpoint is None:
        _claim_for_new_run(output_dir, cfg.overwrite_output_dir)
        return None
    if checkpoint is None:
        _say(f"resume: {output_dir} holds no complete checkpoint yet; starting from step 0")
        return None
    state = load_training_state(checkpoint)
    state.require_resumable()
    _verify(checkpoint, state.checksums, output_dir)
    _check_newer_checkpoints(output_dir, checkpoint, state.step, cfg.overwrite_output_dir)
    _compare_configs(state.config, cfg.to_dict(), checkpoint)
    _say(f"resuming from {checkpoint} (step {state.step})")
    return checkpoint


def _say(message: str) -> None:
    print(f"barerl: {message}", file=sys.stderr, flush=True)


def _claim_for_new_run(output_dir: Path, overwrite: bool) -> None:
    entries = sorted(os.listdir(output_dir)) if output_dir.is_dir() else []
    if not entries:
        return
    if not overwrite:
        shown = ", ".join(entries[:5]) + (f" and {len(entries) - 5} more" if len(entries) > 5 else "")
        raise ValueError(f"output_dir: {output_dir} is not empty ({shown}). Continue that run with --resume, "
                         "replace it with --overwrite_output_dir true, or choose another output_dir")
    ours = [e for e in entries if _written_by_a_run(output_dir / e)]
    for entry in ours:
        path = output_dir / entry
        shutil.rmtree(path) if path.is_dir() else path.unlink()
    others = [e for e in entries if e not in ours]
    kept = f"; left alone: {', '.join(others)}" if others else ""
    _say(f"overwrite_output_dir: deleted the previous run in {output_dir} ({len(ours)} entries){kept}")


def _written_by_a_run(path: Path) -> bool:
    name = path.name
    return name in _RUN_FILES or name.startswith(TEMP_PREFIX) or (
        name.startswith("checkpoint-") and name[len("checkpoint-"):].isdigit())


def _verify(checkpoint: Path, checksums: dict, output_dir: Path) -> None:
    try:
        verify_checksums(checkpoint, checksums)
    except ChecksumError as e:
        earlier = [path for _, path in list_checkpoints(output_dir) if path != checkpoint]
        hint = (f"; an earlier one can be resumed instead: --resume_from_checkpoint {earlier[-1]} "
                "--overwrite_output_dir true (which deletes the newer ones)") if earlier else ""
        raise ChecksumError(f"{e}{hint}") from None


def _check_newer_checkpoints(output_dir: Path, checkpoint: Path, step: int, overwrite: bool) -> None:
    newer = [path for s, path in list_checkpoints(output_dir) if s > step]
    if not newer:
        return
    if overwrite:
        for path in newer:
            shutil.rmtree(path)
        _say(f"overwrite_output_dir: deleted {', '.join(p.name for p in newer)}, newer than {checkpoint.name}")
        return
    raise ValueError(f"resume_from_checkpoint: {output_dir} holds {', '.join(p.name for p in newer)}, newer than "
                     f"{checkpoint} (step {step}): a later --resume would load them. Resume from the newest, or "
                     "add --overwrite_output_dir true to delete them")


def _compare_configs(saved: dict, new: dict, checkpoint: Path) -> None:
    changed = {key: (saved[key], new[key]) for key in new
               if key in saved and key not in _NOT_COMPARED and not _same(key, saved[key], new[key])}
    refused = [key for key in INCOMPATIBLE if key in changed]
    if refused:
        listing = "; ".join(f"{key}: {changed[key][0]!r} -> {changed[key][1]!r}" for key in refused)
        raise ValueError(f"resume_from_checkpoint: {checkpoint} was trained with other settings ({listing}); "
                         "resuming it with these would be meaningless. Resume with the saved values, or start a new "
                         "run (another output_dir, or --overwrite_output_dir true)")
    if changed:
        listing = ", ".join(f"{key} {old!r} -> {value!r}" for key, (old, value) in changed.items())
        _say(f"resume: settings changed since {checkpoint.name}: {listing}")


def _same(key: str, saved, new) -> bool:
    if saved == new:
        return True
    if key in ("model", "dataset") and isinstance(saved, str) and isinstance(new, str):
        return os.path.realpath(saved) == os.path.realpath(new)  # one file, spelled two ways
    return False
