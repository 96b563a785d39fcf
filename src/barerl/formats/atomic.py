"""One atomic folder writer: a folder appears whole or not at all, and an old one it replaces survives a crash.

`atomic_folder(final)` yields a fresh temporary sibling of `final` to write into. When the block ends without an
error, every file in it and the folder itself are fsynced, an existing `final` is renamed aside, the new folder
is renamed into place, the parent folder is fsynced (so the rename itself is on disk), and the old folder is
deleted last. A crash at any point leaves the old folder or the new one whole, plus at most a temporary sibling
(named with `temp_prefix`, so the caller can recognise and delete it). On an error the temporary folder is
deleted and the error goes on.
"""

from __future__ import annotations

import os
import secrets
import shutil
import tempfile
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path


@contextmanager
def atomic_folder(final: str | os.PathLike, temp_prefix: str | None = None) -> Iterator[Path]:
    """Write into the yielded folder; it becomes `final` when the block succeeds (see the module docstring).
    temp_prefix: the temporary folders' name prefix (default: `final`'s name + ".tmp-")."""
    final = Path(final).absolute()
    final.parent.mkdir(parents=True, exist_ok=True)
    prefix = temp_prefix if temp_prefix is not None else f"{final.name}.tmp-"
    tmp = Path(tempfile.mkdtemp(prefix=prefix, dir=final.parent))
    try:
        yield tmp
        fsync_tree(tmp)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    aside = final.with_name(f"{prefix}old-{secrets.token_hex(4)}") if final.exists() else None
    if aside is not None:
        os.rename(final, aside)
    os.rename(tmp, final)
    fsync_path(final.parent)
    if aside is not None:
        shutil.rmtree(aside)


def fsync_tree(folder: Path) -> None:
    """Flush every file below `folder`, and the folder itself, to disk."""
    for root, _, files in os.walk(folder):
        for name in files:
            fsync_path(Path(root) / name)
    fsync_path(folder)


def fsync_path(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)
