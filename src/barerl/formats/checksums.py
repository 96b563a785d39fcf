"""Checksums of a checkpoint's files: recorded when barerl writes the checkpoint, verified when it reads it.

Design decisions:
- Every file gets its size and SHA-256 (`sha256sum FILE` shows the same digest, so a file can be checked by
  hand). The size is compared first: a truncated file fails without being read.
- They are recorded in the training state (`trainer_state/state.json`, key `checksums`: relative path ->
  {"bytes", "sha256"}), which is written last; state.json itself cannot hold its own digest and is checked
  by parsing it.
- They are verified before anything else is read: all of them when a run resumes, those of the model's
  files (everything outside trainer_state/) when a model is loaded from a folder barerl wrote. A file added
  to the folder later is not checked; one that is missing or differs is a `ChecksumError` naming it.
"""

from __future__ import annotations

import hashlib
import json
import os
from collections.abc import Callable
from pathlib import Path

STATE_DIR = "trainer_state"  # train/state.py's layout: where a training checkpoint records its checksums
STATE_RECORD = f"{STATE_DIR}/state.json"
_CHUNK = 16 * 2**20


class ChecksumError(ValueError):
    """A checkpoint file is missing or differs from what was written."""


def sha256_of(path: str | os.PathLike) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as f:
        while chunk := f.read(_CHUNK):
            digest.update(chunk)
    return digest.hexdigest()


def file_checksums(folder: str | os.PathLike) -> dict[str, dict]:
    """{relative path: {"bytes": size, "sha256": hex digest}} of every file under folder, sorted by path."""
    folder = Path(folder)
    files = sorted(p for p in folder.rglob("*") if p.is_file())
    return {p.relative_to(folder).as_posix(): {"bytes": p.stat().st_size, "sha256": sha256_of(p)} for p in files}


def verify_checksums(folder: str | os.PathLike, recorded: dict[str, dict] | None,
                     select: Callable[[str], bool] | None = None) -> None:
    """Check the files of `folder` against `recorded` (those for which `select(path)` is true); nothing to
    check when nothing was recorded (checkpoints of earlier versions)."""
    folder = Path(folder)
    for relative, expected in (recorded or {}).items():
        if select is not None and not select(relative):
            continue
        path = folder / relative
        if not path.is_file():
            raise ChecksumError(f"{path}: missing; {folder / STATE_RECORD} lists it, so the checkpoint is incomplete")
        size = path.stat().st_size
        if size != expected["bytes"]:
            raise ChecksumError(f"{path}: {size} bytes where {expected['bytes']} were written (truncated or "
                                "replaced): the checkpoint is damaged")
        actual = sha256_of(path)
        if actual != expected["sha256"]:
            raise ChecksumError(f"{path}: its contents changed since it was written (sha256 {actual[:16]}..., "
                                f"{expected['sha256'][:16]}... recorded in {STATE_RECORD}): the checkpoint is damaged")


def verify_model_files(folder: str | os.PathLike) -> None:
    """A model folder that barerl wrote as a training checkpoint: its model files (all but trainer_state/)
    checked against the state's record. Other folders have no record and pass unchecked."""
    record = Path(folder) / STATE_RECORD
    if not record.is_file():
        return
    try:
        recorded = json.loads(record.read_text(encoding="utf-8")).get("checksums")
    except (ValueError, AttributeError) as e:
        raise ChecksumError(f"{record}: unreadable ({e}); the checkpoint is damaged") from None
    verify_checksums(folder, recorded, select=lambda relative: not relative.startswith(STATE_DIR + "/"))
