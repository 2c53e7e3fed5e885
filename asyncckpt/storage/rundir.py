"""The files of a run directory besides its states: the manifest, replaced atomically, and the
snapshots (a run's outputs, its adjoint) it names, each with its checksum.

A file counts once it is written, flushed to the device and named by a manifest that was
itself flushed and put in place by a rename (whose directory entry is flushed too): a process
killed at any point leaves the last manifest put in place, and every file it names, whole.
"""
from __future__ import annotations

import errno
import fcntl
import json
import logging
import os
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np
import xxhash

from ..errors import CorruptionError, InvalidValueError, StorageError, UsageError

__all__ = ["FORMAT", "MANIFEST", "fsync_directory", "lock_directory", "read_manifest",
           "read_snapshot", "write_manifest", "write_snapshot"]

#: What a manifest says it is, and the version of its layout
FORMAT = "asyncckpt-run/1"
#: The manifest's name in a run directory
MANIFEST = "manifest.json"
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


def lock_directory(directory: Path) -> int:
    """Take ``directory`` for this checkpointer alone: an exclusive lock (``flock``) on it,
    held until the returned descriptor is closed (or the process ends, a kill included).

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
    return fd


def _write_flushed(path: Path, chunks: Sequence[memoryview | bytes]) -> None:
    """Write ``chunks`` to a new ``path`` (0600) and flush it to the device."""
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_CLOEXEC, 0o600)
    try:
        for chunk in chunks:
            view = memoryview(chunk).cast("B")
            while view.nbytes:
                view = view[os.write(fd, view):]
        os.fsync(fd)
    finally:
        os.close(fd)


def write_manifest(directory: Path, record: dict[str, Any]) -> None:
    """Put ``record`` in place as the manifest of ``directory``, with its checksum, atomically:
    written to a temporary name and flushed, renamed over the last one, the rename flushed."""
    body = json.dumps(record, sort_keys=True)
    text = json.dumps({"checksum": _digest(body.encode()), "manifest": record},
                      sort_keys=True, indent=1)
    temporary = directory / f".{MANIFEST}.tmp"
    _write_flushed(temporary, [text.encode()])
    os.replace(temporary, directory / MANIFEST)
    fsync_directory(directory)


def read_manifest(directory: Path) -> dict[str, Any] | None:
    """The manifest of ``directory`` (None where it has none).

    Raises
    ------
    CorruptionError
        If it is not a manifest, or its checksum does not match what it says.
    """
    path = directory / MANIFEST
    try:
        text = path.read_bytes()
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
    return dict(record)


def _bytes_of(arrays: Sequence[np.ndarray]) -> list[np.ndarray]:
    """Each array's bytes, as a flat uint8 view sharing its memory."""
    for i, array in enumerate(arrays):
        if not isinstance(array, np.ndarray) or not array.flags.c_contiguous:
            raise InvalidValueError(f"array {i} of a snapshot is not a C-contiguous numpy "
                                    f"array (got {type(array).__name__}): it cannot be "
                                    "restored in place")
    return [a.reshape(-1).view(np.uint8) for a in arrays]


def write_snapshot(directory: Path, name: str, arrays: Sequence[np.ndarray]
                   ) -> dict[str, Any]:
    """Write the bytes of ``arrays`` to ``directory/name``, flushed; return the manifest's entry
    for it (its name, size and checksum)."""
    views = _bytes_of(arrays)
    hasher = xxhash.xxh3_64()
    for view in views:
        hasher.update(view.data)
    _write_flushed(directory / name, [v.data for v in views])
    return {"file": name, "nbytes": sum(v.nbytes for v in views),
            "digest": hasher.intdigest()}


def read_snapshot(directory: Path, entry: dict[str, Any], arrays: Sequence[np.ndarray]) -> None:
    """Copy the snapshot a manifest's ``entry`` names into ``arrays``, after checking it.

    Raises
    ------
    StorageError
        If its file is missing, or ``arrays`` hold another number of bytes.
    CorruptionError
        If its bytes do not match its checksum.
    """
    path = directory / entry["file"]
    try:
        data = path.read_bytes()
    except FileNotFoundError:
        raise StorageError(f"{path}, named by the manifest, is missing") from None
    views = _bytes_of(arrays)
    if len(data) != entry["nbytes"] or _digest(data) != entry["digest"]:
        raise CorruptionError(f"{path} is damaged: {len(data)} bytes that do not match the "
                              f"checksum of the {entry['nbytes']} the manifest recorded")
    if sum(v.nbytes for v in views) != len(data):
        raise StorageError(f"{path} holds {len(data)} bytes, the arrays to restore it into "
                           f"{sum(v.nbytes for v in views)}")
    offset = 0
    for view in views:
        view[...] = np.frombuffer(data, np.uint8, view.nbytes, offset)
        offset += view.nbytes
