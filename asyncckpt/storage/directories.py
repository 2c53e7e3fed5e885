"""The directories a :class:`~asyncckpt.storage.FileStorage` makes for a missing path, and
removes again: private at every level, safe beside peers making the same path at once."""
from __future__ import annotations

import contextlib
from pathlib import Path

from ..errors import InvalidValueError

__all__ = ["make_private", "remove_made"]


def make_private(root: Path, attempts: int = 3) -> Path:
    """Make the missing directory ``root`` and the missing levels above it, each private
    (``parents=True`` would make the upper ones 0755); the top level that was missing, which
    :func:`remove_made` removes once empty. Levels another process makes
    meanwhile (the ranks of an MPI job sharing one path) are no error: each rank removes the
    levels it found missing once they are empty, so the last of them to close removes the
    path where every rank found it missing."""
    missing = root
    while not missing.parent.exists():
        missing = missing.parent
    levels = [missing]
    for part in root.relative_to(missing).parts:
        levels.append(levels[-1] / part)
    for attempt in range(attempts):
        made: list[Path] = []
        try:
            for level in levels:
                try:
                    level.mkdir(mode=0o700)
                    made.append(level)
                except FileExistsError:
                    if not level.is_dir():
                        raise
            return missing
        except OSError as exc:
            for level in reversed(made):
                with contextlib.suppress(OSError):
                    level.rmdir()
            # a level a peer made and removed again (being done with it) is made anew
            if not isinstance(exc, FileNotFoundError) or attempt == attempts - 1:
                raise InvalidValueError(f"FileStorage path {str(root)!r} does not exist and "
                                        f"cannot be created: {exc.strerror}") from exc
    raise AssertionError("unreachable")


def remove_made(path: Path, made_root: Path) -> None:
    """Remove ``path`` and the levels above it up to ``made_root`` (what :func:`make_private`
    found missing), each only while empty."""
    current = path
    while True:
        try:
            current.rmdir()
        except OSError:
            return
        if current == made_root:
            return
        current = current.parent
