"""The files of closed :class:`~asyncckpt.storage.FileStorage` backends, kept for the next
backend under the same directory (one cache per process, emptied in a forked child)."""
from __future__ import annotations

import os
import threading
from dataclasses import dataclass

import psutil

from .._memory.pool import POOL

__all__ = ["KEPT_FILES", "KeptFile", "KeptFiles", "RAM_FILESYSTEMS", "fits_beside",
           "keep_or_release", "kept_ram_bytes", "ram_backed", "release_fds", "release_files",
           "release_ram_files", "take_kept"]

#: A file that held at least this much is closed on a thread of its own: freeing its blocks
#: waits on the device at no CPU (long, on a disk mounted with ``discard``)
RELEASE_IN_BACKGROUND_BYTES = 256 << 20


#: Files of closed backends kept for reuse, at most (the most recent): a program that makes a
#: checkpointer per gradient finds its last file again, while a test suite's many directories
#: hold no more than this many
KEPT_FILES = 2


def _close_all(fds: list[int]) -> None:
    for fd in fds:
        os.close(fd)


def release_fds(fds: list[int], nbytes: int) -> None:
    """Close ``fds``; a large file's on a short-lived thread of its own (see
    :data:`RELEASE_IN_BACKGROUND_BYTES`)."""
    if nbytes >= RELEASE_IN_BACKGROUND_BYTES:
        # the file has no name: nothing can reach it while its blocks are being freed
        threading.Thread(target=_close_all, args=(fds,), name="asyncckpt-file-release",
                         daemon=True).start()
    else:
        _close_all(fds)


@dataclass(frozen=True)
class KeptFile:
    """A closed backend's file: its descriptors and the bytes ``fallocate`` backs."""

    fd: int
    direct_fd: int
    #: bytes backed by fallocate
    nbytes: int

    def fds(self) -> list[int]:
        return [fd for fd in (self.fd, self.direct_fd) if fd >= 0]


class KeptFiles:
    """The files of closed backends, by directory and O_DIRECT, for the next backend there.

    Freeing a file's blocks and allocating them again costs the device time, and in a program
    that makes a checkpointer per gradient the next run pays it: on a disk mounted with
    ``discard`` the next run's transfers and ``fallocate`` wait on it (docs/measurements.md). A
    closed backend's file is kept instead while the device keeps as much free beside it.
    """

    def __init__(self, limit: int) -> None:
        self.limit = limit
        self._lock = threading.Lock()
        self._files: dict[tuple[str, bool], KeptFile] = {}  # oldest first
        self._ram: set[tuple[str, bool]] = set()  # the keys of files on RAM-backed filesystems

    def take(self, key: tuple[str, bool]) -> KeptFile | None:
        with self._lock:
            self._ram.discard(key)
            return self._files.pop(key, None)

    def keep(self, key: tuple[str, bool], kept: KeptFile, ram: bool = False) -> None:
        """Keep ``kept`` for ``key`` (``ram``: on a RAM-backed filesystem), letting go of what
        it replaces and of the oldest beyond :attr:`limit`."""
        with self._lock:
            evicted = [self._files.pop(key)] if key in self._files else []
            self._files[key] = kept
            if ram:
                self._ram.add(key)
            else:
                self._ram.discard(key)
            while len(self._files) > self.limit:
                oldest = next(iter(self._files))
                self._ram.discard(oldest)
                evicted.append(self._files.pop(oldest))
        for old in evicted:
            release_fds(old.fds(), old.nbytes)

    def forget(self) -> None:
        """In a child after ``fork``: drop the parent's files (closing the child's descriptors
        only), so that parent and child never write into one file."""
        files, self._files = list(self._files.values()), {}
        self._ram = set()
        self._lock = threading.Lock()  # another thread may have held it at the fork
        for kept in files:
            _close_all(kept.fds())

    def ram_bytes(self) -> int:
        """Bytes the kept files on RAM-backed filesystems hold."""
        with self._lock:
            return sum(self._files[key].nbytes for key in self._ram)

    def release(self, ram_only: bool = False) -> int:
        """Close every kept file (``ram_only``: those on RAM-backed filesystems); return the
        bytes they held."""
        with self._lock:
            keys = list(self._ram if ram_only else self._files)
            files = [self._files.pop(key) for key in keys]
            self._ram.clear()
        for kept in files:
            release_fds(kept.fds(), kept.nbytes)
        return sum(kept.nbytes for kept in files)


_KEPT = KeptFiles(KEPT_FILES)
if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_KEPT.forget)


def take_kept(where: str, direct: bool | None) -> KeptFile | None:
    """A kept file under the directory ``where`` (a real path) that ``direct`` accepts: with
    O_DIRECT if True, without if False, either if None (O_DIRECT first)."""
    for with_direct in (True, False):
        if direct is None or direct is with_direct:
            kept = _KEPT.take((where, with_direct))
            if kept is not None:
                return kept
    return None


def release_files() -> int:
    """Free the disk space (and on a RAM-backed filesystem the memory) of the files that
    closed :class:`FileStorage` backends keep for the next backend under the same directory;
    return how many bytes that was."""
    return _KEPT.release()


def release_ram_files() -> int:
    """Free the memory of the kept files on RAM-backed filesystems; return the bytes."""
    return _KEPT.release(ram_only=True)


def fits_beside(fd: int, nbytes: int) -> bool:
    """Whether a closed file of ``nbytes`` (open as ``fd``) is kept: while the device has as
    much free beside it."""
    try:
        stat = os.fstatvfs(fd)
    except OSError:
        return False
    return stat.f_bavail * stat.f_frsize >= nbytes


#: Filesystems whose files are RAM: a file kept there is memory held, not disk
RAM_FILESYSTEMS = ("tmpfs", "ramfs")


def ram_backed(path: str) -> bool:
    """Whether ``path`` (a real path) lies on a filesystem kept in RAM (tmpfs, ramfs): found
    from the mount table (psutil), not guessed from the name."""
    mounts = [p for p in psutil.disk_partitions(all=True)
              if path == p.mountpoint or path.startswith(p.mountpoint.rstrip("/") + "/")]
    return bool(mounts) and max(mounts, key=lambda p: len(p.mountpoint)).fstype in RAM_FILESYSTEMS


def keep_or_release(where: str, kept: KeptFile, ram: bool = False) -> None:
    """Keep a closed backend's file for the next backend under ``where`` (a real path) where
    :func:`fits_beside` says so, else close it. A file on a RAM-backed filesystem (``ram``) is
    memory the process goes on holding, kept as the process's pool keeps touched DRAM: while
    the pool's limit holds it beside the pool's buffers and the other kept files in RAM (freed
    and faulted in again at every run, a tmpfs tier was slower than a disk, whose file stays
    in the page cache)."""
    if ram:
        room = POOL.limit_bytes - POOL.nbytes - kept_ram_bytes()
        if kept.nbytes > room:
            release_fds(kept.fds(), kept.nbytes)
            return
    if kept.nbytes and kept.fd >= 0 and fits_beside(kept.fd, kept.nbytes):
        _KEPT.keep((where, kept.direct_fd >= 0), kept, ram)
    else:
        release_fds(kept.fds(), kept.nbytes)


def kept_ram_bytes() -> int:
    """Bytes of RAM that kept files on RAM-backed filesystems hold."""
    return _KEPT.ram_bytes()
