"""The files of a run directory as a whole: whether a directory may take up a run, whether its
manifest names this checkpointer's run, and the removal of a finished run's files (only those
its manifest names, its states and its temporary: nothing else in the directory is touched)."""
from __future__ import annotations

import logging
import os
from pathlib import Path
from typing import Any

from ..errors import StorageError, UsageError
from ..storage.directories import make_private
from ..storage.durable import STATES_FILE
from ..storage.rundir import (MANIFEST, REMOVING, TEMPORARY, DirectoryLock, fsync_directory,
                              lock_directory, named_files, read_manifest)

__all__ = ["check_same_run", "check_unused", "finish_removal", "remove_run", "take_directory"]

log = logging.getLogger(__name__)

#: What a directory that holds no manifest may hold: what a run killed before its first
#: commit, or while its files were being removed, left
_LEFT_BY_A_KILL = (STATES_FILE, TEMPORARY, REMOVING)


def take_directory(path: Path) -> DirectoryLock:
    """Make ``path`` (private) where it is missing, and lock it for this checkpointer alone."""
    if not path.exists():
        make_private(path)
    elif not path.is_dir():
        raise UsageError(f"run_dir {str(path)!r} is not a directory")
    return lock_directory(path)


def check_unused(path: Path) -> None:
    """Raise unless ``path`` holds nothing but what a run that never committed, or one killed
    while its directory was being removed, left (that removal is finished here); make it
    private (0700)."""
    if os.path.lexists(path / REMOVING):
        finish_removal(path, remove_directory=False)
    others = sorted(p.name for p in path.iterdir() if p.name not in _LEFT_BY_A_KILL)
    if others:
        raise UsageError(f"run_dir {str(path)!r} holds no run's manifest but other "
                         f"files ({', '.join(others[:5])}): give an empty or new directory")
    try:
        os.chmod(path, 0o700)  # private, as a directory made here is
    except OSError as exc:
        raise StorageError(f"run_dir {str(path)!r} cannot be made private (0700): "
                           f"{exc.strerror}; give a directory this process may write") from exc


def check_same_run(path: Path, identity: dict[str, Any], theirs: dict[str, Any]) -> None:
    """Raise, naming what differs, unless ``theirs`` (a manifest's run) is ``identity``."""
    differ = [f"{name} {theirs.get(name)!r} there, {mine!r} here"
              for name, mine in identity.items() if theirs.get(name) != mine]
    if differ:
        raise UsageError(f"run_dir {str(path)!r} holds another run: "
                         f"{'; '.join(differ)} (give another run_dir, or remove it)")


def remove_run(path: Path) -> None:
    """Remove a finished run's files from ``path``, then ``path`` where nothing else is in it.

    The manifest is put aside first (renamed :data:`~asyncckpt.storage.rundir.REMOVING`): a
    kill from there on leaves no run, and the record of the files to remove, which the next
    run in the directory removes (:func:`check_unused`)."""
    try:
        os.replace(path / MANIFEST, path / REMOVING)
    except FileNotFoundError:
        pass  # nothing committed: the states' file alone, if that
    else:
        fsync_directory(path)
    finish_removal(path)


def finish_removal(path: Path, remove_directory: bool = True) -> None:
    """Remove the files the manifest put aside names or says it replaced, the states' file
    and the run's temporaries (the manifest's, and the snapshots of the commit after it, cut
    short by a kill), then the manifest put aside, then (where ``remove_directory``) ``path``
    where nothing else is in it."""
    record = read_manifest(path, REMOVING) or {}
    cut_short = {f"{kind}.{record.get('commit', 0) + 1}.bin"
                 for kind in record.get("snapshots", ())}
    left = cut_short | set(record.get("replaced", ()))
    for name in sorted({STATES_FILE, TEMPORARY} | named_files(record) | left):
        (path / name).unlink(missing_ok=True)  # a link itself, never what it names
    (path / REMOVING).unlink(missing_ok=True)
    if remove_directory:
        try:
            path.rmdir()
        except OSError:
            log.info("run_dir %s holds other files: left in place", path)
