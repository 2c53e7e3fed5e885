"""The files of a run directory as a whole: whether a directory may take up a run, whether its
manifest names this checkpointer's run, and the removal of a finished run's files."""
from __future__ import annotations

import logging
import os
import re
from pathlib import Path
from typing import Any

from ..errors import StorageError, UsageError
from ..storage.directories import make_private
from ..storage.durable import STATES_FILE
from ..storage.rundir import MANIFEST, fsync_directory, lock_directory

__all__ = ["check_same_run", "check_unused", "is_ours", "remove_run", "take_directory"]

log = logging.getLogger(__name__)


def take_directory(path: Path) -> int:
    """Make ``path`` (private) where it is missing, and lock it for this checkpointer alone;
    the lock's file descriptor (closing it lets go)."""
    if not path.exists():
        make_private(path)
    elif not path.is_dir():
        raise UsageError(f"run_dir {str(path)!r} is not a directory")
    return lock_directory(path)


def check_unused(path: Path) -> None:
    """Raise unless ``path`` holds nothing but what a run that never committed, or one killed
    while its directory was being removed, left; make it private (0700)."""
    others = sorted(p.name for p in path.iterdir() if not is_ours(p.name))
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
    """Remove a finished run's files from ``path``, then ``path`` where nothing else is in it."""
    # the manifest first: a kill from here on leaves no run, and files a new one ignores
    (path / MANIFEST).unlink(missing_ok=True)
    fsync_directory(path)
    for file in path.iterdir():
        if is_ours(file.name):
            file.unlink(missing_ok=True)
    try:
        path.rmdir()
    except OSError:
        log.info("run_dir %s holds other files: left in place", path)


def is_ours(name: str) -> bool:
    """Whether ``name`` is that of a file a run directory's run writes, besides its manifest."""
    return (name in (STATES_FILE, f".{MANIFEST}.tmp")
            or re.fullmatch(r"(outputs|adjoint)\.\d+\.bin", name) is not None)
