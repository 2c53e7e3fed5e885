"""The files of a run directory besides its states: the manifest, replaced atomically, and the
snapshots (a run's outputs, its adjoint) it names, each with its checksum.

A file counts once it is written, flushed to the device and named by a manifest that was
itself flushed and put in place by a rename (whose directory entry is flushed too): a process
killed at any point leaves the last manifest put in place, and every file it names, whole.

The directory holds only names its run wrote: every file is opened without following a
symbolic link (:func:`open_own`: a link, a hard link or a file of another kind there is
refused, naming it), a new one is made only where no file has its name, and a file is removed
only where a manifest named it (or it is the run's own temporary). The directory's lock is
closed in a child the process forks: a child never holds it.
"""
from __future__ import annotations

import errno
import fcntl
import json
import logging
import os
import re
import stat
import threading
import weakref
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np
import xxhash

from ..errors import CorruptionError, StorageError, UsageError
from .snapshot_io import check_file, read_into, write_from

__all__ = ["FORMAT", "MANIFEST", "REMOVING", "TEMPORARY", "DirectoryLock", "digest_of",
           "check_snapshot", "cut_short", "digest_of", "flush_snapshot", "fsync_directory", "lock_directory",
           "named_files", "open_own", "read_manifest", "read_snapshot", "stage_snapshot",
           "write_manifest", "write_snapshot"]

#: What a manifest says it is, and the version of its layout
FORMAT = "asyncckpt-run/2"
#: The manifest's name in a run directory
MANIFEST = "manifest.json"
#: The name the manifest is written under before its rename: the run's own temporary
TEMPORARY = f".{MANIFEST}.tmp"
#: The manifest of a finished run, put aside while the files it names are removed: a process
#: killed then leaves the record of what to remove for the next run in the directory
REMOVING = f".{MANIFEST}.removing"
#: The name of a snapshot a manifest may name: its kind and the commit that wrote it
_SNAPSHOT_NAME = re.compile(r"[a-z_]+\.[0-9]+\.bin")
#: What flock raises on a file system that has none
_NO_LOCKS = {errno.ENOLCK, errno.EOPNOTSUPP, errno.ENOSYS, errno.EINVAL}

log = logging.getLogger(__name__)


def _digest(data: bytes | memoryview) -> int:
    return xxhash.xxh3_64_intdigest(data)


def fsync_directory(directory: Path) -> None:
    """Flush ``directory``'s entries (a rename or a new file in it) to the device."""
    fd = os.open(directory, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


class DirectoryLock:
    """An exclusive lock (``flock``) on a run directory, held until :meth:`release` (or the
    process's end, a kill included). A child the process forks closes its copy of the
    descriptor at once (``os.register_at_fork``): an flock belongs to the open file, so a
    child keeping it (a pool's worker) would hold the directory after the parent let go."""

    def __init__(self, directory: Path, fd: int) -> None:
        self.directory = directory
        self._fd = fd
        self._guard = threading.Lock()
        _LOCKS.add(self)

    @property
    def held(self) -> bool:
        """Whether this process holds the lock (not yet released, not a forked child's)."""
        return self._fd >= 0

    def release(self) -> None:
        """Let go of the directory; safe to call twice, from any thread."""
        with self._guard:
            fd, self._fd = self._fd, -1
        if fd >= 0:
            os.close(fd)

    def _forget_in_child(self) -> None:
        # the child is single-threaded: the guard may be held by a thread that is gone
        self._guard = threading.Lock()
        fd, self._fd = self._fd, -1
        if fd >= 0:
            os.close(fd)


#: The locks this process holds, closed in a forked child
_LOCKS: weakref.WeakSet[DirectoryLock] = weakref.WeakSet()


def _forget_locks_in_child() -> None:
    for lock in list(_LOCKS):
        lock._forget_in_child()


if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_forget_locks_in_child)


def lock_directory(directory: Path) -> DirectoryLock:
    """Take ``directory`` for this checkpointer alone: an exclusive lock (``flock``) on it,
    held until the returned lock's :meth:`~DirectoryLock.release` (or the process ends, a kill
    included), never by a child the process forks.

    Raises
    ------
    UsageError
        If another checkpointer, in this process or another, holds it.
    """
    fd = os.open(directory, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        os.close(fd)
        raise UsageError(f"run_dir {str(directory)!r} is in use by another checkpointer (its "
                         "manifest's writer): one run directory serves one run at a time; "
                         "close() the other first") from None
    except OSError as exc:
        if exc.errno not in _NO_LOCKS:
            os.close(fd)
            raise
        # a file system without flock (Lustre mounted noflock): the run goes on, unguarded
        log.warning("run_dir %s cannot be locked (%s): a second checkpointer on it is not "
                    "refused", directory, exc)
    except BaseException:
        os.close(fd)
        raise
    return DirectoryLock(directory, fd)


def open_own(path: Path, flags: int, mode: int = 0o600) -> int:
    """Open ``path``, a file of a run directory, without following a symbolic link
    (``O_NOFOLLOW``); the descriptor.

    Raises
    ------
    UsageError
        If ``path`` is a symbolic link, not a regular file, or has other names (a hard link
        to a file elsewhere would be written through): a run directory's files are its run's.
    FileNotFoundError
        If it is missing and ``flags`` has no ``O_CREAT``.
    """
    try:
        fd = os.open(path, flags | os.O_NOFOLLOW | os.O_CLOEXEC, mode)
    except OSError as exc:
        if exc.errno == errno.ELOOP:
            raise UsageError(f"{path} is a symbolic link: a run directory holds only files its "
                             "run wrote, opened without following links; remove it") from None
        if exc.errno == errno.EEXIST:
            raise UsageError(f"{path} exists, and this run did not write it: a run directory "
                             "holds only files its run wrote; remove it") from None
        raise
    try:
        info = os.fstat(fd)
        if not stat.S_ISREG(info.st_mode) or info.st_nlink != 1:
            what = ("not a regular file" if not stat.S_ISREG(info.st_mode)
                    else f"a file of {info.st_nlink} names (hard links)")
            raise UsageError(f"{path} is {what}: a run directory holds only files its run "
                             "wrote; remove it")
    except BaseException:
        os.close(fd)
        raise
    return fd


def _write_new(path: Path, chunks: Sequence[memoryview | bytes]) -> None:
    """Write ``chunks`` to ``path``, a file made anew (0600: refused where a file has the
    name), and flush it to the device."""
    fd = open_own(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL)
    try:
        for chunk in chunks:
            view = memoryview(chunk).cast("B")
            while view.nbytes:
                view = view[os.write(fd, view):]
        os.fsync(fd)
    finally:
        os.close(fd)


def _read_own(path: Path) -> bytes:
    """The bytes of ``path``, a file of a run directory, read without following a link."""
    fd = open_own(path, os.O_RDONLY)
    try:
        size = os.fstat(fd).st_size
        chunks: list[bytes] = []
        got = 0
        while True:
            chunk = os.read(fd, max(size - got, 1 << 16))
            if not chunk:
                return b"".join(chunks)
            chunks.append(chunk)
            got += len(chunk)
    finally:
        os.close(fd)


def write_manifest(directory: Path, record: dict[str, Any]) -> None:
    """Put ``record`` in place as the manifest of ``directory``, with its checksum, atomically:
    written to the run's temporary name (made anew) and flushed, renamed over the last one,
    the rename flushed."""
    body = json.dumps(record, sort_keys=True)
    text = json.dumps({"checksum": _digest(body.encode()), "manifest": record},
                      sort_keys=True, indent=1)
    temporary = directory / TEMPORARY
    temporary.unlink(missing_ok=True)  # a kill's leftover, or a link planted there: not followed
    _write_new(temporary, [text.encode()])
    os.replace(temporary, directory / MANIFEST)
    fsync_directory(directory)


def read_manifest(directory: Path, name: str = MANIFEST) -> dict[str, Any] | None:
    """The manifest of ``directory`` (None where it has none); ``name``: the one put aside
    (:data:`REMOVING`).

    Raises
    ------
    CorruptionError
        If it is not a manifest, or its checksum does not match what it says.
    UsageError
        If it is a symbolic link (see :func:`open_own`).
    """
    path = directory / name
    try:
        text = _read_own(path)
    except FileNotFoundError:
        return None
    try:
        outer = json.loads(text)
        record, checksum = outer["manifest"], outer["checksum"]
        body = json.dumps(record, sort_keys=True)
    except (ValueError, KeyError, TypeError) as exc:
        raise CorruptionError(f"{path} is damaged: not a manifest ({exc})") from exc
    if _digest(body.encode()) != checksum:
        raise CorruptionError(f"{path} is damaged: its checksum does not match its content")
    if record.get("format") != FORMAT:
        raise CorruptionError(f"{path} is of format {record.get('format')!r}, this version "
                              f"reads {FORMAT!r}")
    for value in record.values():
        if isinstance(value, dict) and "file" in value:
            _check_name(path, value["file"])
    for name in record.get("replaced", ()):  # removed by a later commit, or the removal
        _check_name(path, name)
    for kind in record.get("snapshots", ()):
        _check_name(path, f"{kind}.0.bin")
    return dict(record)


def _check_name(manifest: Path, name: object) -> None:
    """Raise unless ``name`` (a file ``manifest`` names) is one a run writes in its directory."""
    if not isinstance(name, str) or _SNAPSHOT_NAME.fullmatch(name) is None:
        raise CorruptionError(f"{manifest} is damaged: it names the file {name!r}, not one a "
                              "run writes in its directory")


#: Commits after a manifest whose snapshots a kill may leave: the one under way, and the one
#: whose snapshot the sweep writes meanwhile
AHEAD = 2


def cut_short(record: dict[str, Any]) -> set[str]:
    """The snapshots a process killed after the manifest ``record`` was put in place may have
    left unnamed: those of the :data:`AHEAD` commits after it (the run's own)."""
    commit = int(record.get("commit", 0))
    return {f"{kind}.{commit + ahead}.bin" for kind in record.get("snapshots", ())
            for ahead in range(1, AHEAD + 1)}


def named_files(record: dict[str, Any]) -> set[str]:
    """The files (besides the states) the manifest ``record`` names: its snapshots'."""
    return {value["file"] for value in record.values()
            if isinstance(value, dict) and isinstance(value.get("file"), str)}


def stage_snapshot(path: Path, arrays: Sequence[np.ndarray]) -> dict[str, Any]:
    """Write the bytes of ``arrays`` (the program's own, in any layout) to ``path``, a file
    made anew, in chunks, with no copy of them made and no flush (a commit flushes it,
    :func:`flush_snapshot`); return the manifest's entry for it (its name, size and
    checksum)."""
    fd = open_own(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL)
    try:
        size, digest = write_from(fd, arrays)
    finally:
        os.close(fd)
    return {"file": path.name, "nbytes": size, "digest": digest}


def write_snapshot(directory: Path, name: str, arrays: Sequence[np.ndarray]
                   ) -> dict[str, Any]:
    """:func:`stage_snapshot` to ``directory/name``, flushed to the device."""
    entry = stage_snapshot(directory / name, arrays)
    flush_snapshot(directory, entry)
    return entry


def digest_of(arrays: Sequence[np.ndarray]) -> int:
    """The checksum of the bytes of ``arrays``, one after another (what a snapshot of them
    records), taken in chunks."""
    return write_from(None, arrays)[1]


def flush_snapshot(directory: Path, entry: dict[str, Any]) -> None:
    """Flush the snapshot a manifest's ``entry`` names to the device."""
    fd = open_own(directory / entry["file"], os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def _open_snapshot(path: Path) -> int:
    try:
        return open_own(path, os.O_RDONLY)
    except FileNotFoundError:
        raise StorageError(f"{path}, named by the manifest, is missing") from None


def check_snapshot(directory: Path, entry: dict[str, Any]) -> None:
    """Raise unless the snapshot a manifest's ``entry`` names matches its checksum (read in
    chunks: nothing is delivered, nothing copied whole).

    Raises
    ------
    StorageError
        If its file is missing.
    CorruptionError
        If its bytes do not match its checksum.
    """
    path = directory / entry["file"]
    fd = _open_snapshot(path)
    try:
        size, digest = check_file(fd)
    finally:
        os.close(fd)
    if size != entry["nbytes"] or digest != entry["digest"]:
        raise CorruptionError(f"{path} is damaged: {size} bytes that do not match the "
                              f"checksum of the {entry['nbytes']} the manifest recorded")


def read_snapshot(directory: Path, entry: dict[str, Any], arrays: Sequence[np.ndarray]) -> None:
    """Read the snapshot a manifest's ``entry`` names into ``arrays`` (the program's own),
    after checking it, in chunks (:func:`check_snapshot`; the bytes read in are checked again).

    Raises
    ------
    StorageError
        If its file is missing, or ``arrays`` hold another number of bytes.
    CorruptionError
        If its bytes do not match its checksum.
    """
    path = directory / entry["file"]
    expected = sum(int(np.asarray(a).nbytes) for a in arrays)
    if expected != entry["nbytes"]:
        raise StorageError(f"{path} holds {entry['nbytes']} bytes, the arrays to restore it "
                           f"into {expected}")
    check_snapshot(directory, entry)
    fd = _open_snapshot(path)
    try:
        size, digest = read_into(fd, arrays)
    finally:
        os.close(fd)
    if size != entry["nbytes"] or digest != entry["digest"]:
        raise CorruptionError(f"{path} changed while it was read: {size} bytes that do not "
                              f"match the checksum of the {entry['nbytes']} it had")
