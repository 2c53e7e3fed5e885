"""Level-2 in one preallocated file with no name, on a ramdisk or an SSD."""
from __future__ import annotations

import errno
import logging
import os
import tempfile
import threading
import weakref
from pathlib import Path
from typing import Any

import numpy as np

from .._memory.buffers import PAGE, aligned_buffer, padded
from .._memory.keytable import KeyTable
from ..errors import (InvalidTypeError, InvalidValueError, StorageError, StorageFullError,
                      StorageKeyError)
from .base import Storage, gib
from .directories import make_private, remove_made
from .kept import (KEPT_FILES, KeptFile, keep_or_release, ram_backed, release_files,
                   take_kept)

__all__ = ["FileStorage", "release_files", "KEPT_FILES"]

log = logging.getLogger(__name__)

#: the backends open in this process, whose files a forked child must not keep alive
_OPEN: weakref.WeakSet["FileStorage"] = weakref.WeakSet()


def _close_in_child() -> None:
    """In a child after ``fork``: close the descriptors of every open backend (the parent's
    file, whose space would otherwise outlive the parent for as long as the child runs); the
    child's copies of the backends are closed."""
    for backend in list(_OPEN):
        backend._forget_after_fork()


if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_close_in_child)


def _open_unnamed(directory: Path) -> int:
    """Open a new file (mode 0600) under ``directory`` that no name reaches, so that its bytes
    go with the last descriptor, even when the process is killed: O_TMPFILE where the
    filesystem has it, else a fresh name unlinked at once."""
    if hasattr(os, "O_TMPFILE"):
        try:
            return os.open(directory, os.O_RDWR | os.O_TMPFILE | os.O_CLOEXEC, 0o600)
        except OSError as exc:
            if exc.errno not in (errno.EOPNOTSUPP, errno.EISDIR, errno.EINVAL):
                raise
    fd, name = tempfile.mkstemp(prefix=".asyncckpt-", dir=directory)
    os.unlink(name)
    return fd


class FileStorage(Storage):
    """Level-2 in one preallocated file on a ramdisk or an SSD.

    Parameters
    ----------
    path : str or os.PathLike
        A directory (created, mode 0700, if missing, and removed on ``close`` if still empty).
        The backend's one file there has no name from the moment it is opened (O_TMPFILE, or a
        name unlinked at once; mode 0600): no other process can open it, two checkpointers on
        one path never meet, and its bytes go with the process at exit or when it is killed
        (SIGKILL included). ``close`` keeps the file, its blocks allocated, for the next backend
        under the same directory (the ``KEPT_FILES`` most recent, while the device has as much
        free beside each): a checkpointer per gradient then writes into blocks the last one
        allocated (a child after ``fork`` opens its own).
        :func:`~asyncckpt.storage.release_files` frees them; a file not kept is freed on
        ``close``, a large one on a short-lived thread while the device frees its blocks.
    direct : bool or None
        Use O_DIRECT for page-aligned states of ``direct_min_bytes`` or more: sustained writes
        that bypass the page cache run several times faster on a disk, and leave the page cache
        (memory outside any budget) alone. None (default): where the filesystem allows it.
    direct_min_bytes : int
        Smaller states go through the page cache, where a write of a few pages costs about a
        tenth of an O_DIRECT one (default 1 MiB).

    Notes
    -----
    Every state occupies a page-aligned record of the file. Writes use ``os.pwrite``, reads
    ``os.preadv`` straight into the caller's buffer; the partial last page of a record goes through
    a small per-thread aligned bounce buffer.
    """

    def __init__(self, path: str | os.PathLike[str], *, direct: bool | None = None,
                 direct_min_bytes: int = 1 << 20) -> None:
        if not isinstance(path, (str, os.PathLike)):
            raise InvalidTypeError(f"FileStorage path must be a str or os.PathLike, got {type(path).__name__}")
        root = Path(path)
        self._made_root: Path | None = None
        if root.exists() and not root.is_dir():
            raise InvalidValueError(f"FileStorage path {str(root)!r} is not a directory")
        if not root.exists():
            self._made_root = make_private(root)
        if not os.access(root, os.W_OK | os.X_OK):
            raise InvalidValueError(f"FileStorage path {str(root)!r} is not writable")
        self.path = root
        self.direct_min_bytes = direct_min_bytes
        self._fd = self._direct_fd = -1
        self._record = 0  # bytes per record, fixed by the first put or reserve
        self._backed = 0  # bytes of the file backed by fallocate
        self._where = os.path.realpath(root)
        self._ram = ram_backed(self._where)  # its file is memory, not disk
        self._take_file(root, direct)
        self._lock = threading.Lock()
        self._bounce = threading.local()
        self._nbytes = 0
        self._slots = KeyTable()  # key -> record
        self._free: list[int] = []
        self._n_records = 0
        self._closed = False
        _OPEN.add(self)
        log.debug("FileStorage under %s (O_DIRECT %s)", self.path, self.direct)

    def _take_file(self, root: Path, direct: bool | None) -> None:
        """Take the file a closed backend kept under ``root``, else open a new one."""
        kept = take_kept(self._where, direct)
        if kept is not None:
            self._fd, self._direct_fd, self._backed = kept.fd, kept.direct_fd, kept.nbytes
        else:
            self._open(root, direct)

    def _open(self, root: Path, direct: bool | None) -> None:
        """Open a new nameless file under ``root``, and again with O_DIRECT unless ``direct``
        is False (where the filesystem refuses it: an error if ``direct`` is True)."""
        try:
            self._fd = self._open_file(root)
        except OSError as exc:
            self._remove_made_root()
            raise InvalidValueError(f"FileStorage cannot create its file under {str(root)!r}: "
                                    f"{exc.strerror}") from exc
        if direct is not False and hasattr(os, "O_DIRECT"):
            try:  # the same inode again, through the descriptor: it has no name to open
                self._direct_fd = os.open(f"/proc/self/fd/{self._fd}",
                                          os.O_RDWR | os.O_DIRECT | os.O_CLOEXEC)
            except OSError as exc:
                if direct:
                    self._cleanup()
                    raise InvalidValueError(f"FileStorage: O_DIRECT is not supported under "
                                            f"{str(root)!r}: {exc.strerror}") from exc

    def _open_file(self, root: Path) -> int:
        """The descriptor of the backend's file under ``root`` (one with no name)."""
        return _open_unnamed(root)

    @property
    def direct(self) -> bool:
        """Whether O_DIRECT is used for aligned buffers."""
        return self._direct_fd >= 0

    def __repr__(self) -> str:
        return f"FileStorage({str(self.path)!r})"

    @property
    def holds_process_memory(self) -> bool:
        """Whether the file is RAM (tmpfs, ramfs): a memory budget counts and bounds it."""
        return self._ram

    @property
    def nbytes_held(self) -> int:
        """Bytes of RAM the file holds where it is RAM-backed (else 0: it is on a disk)."""
        return self._backed if self._ram else 0

    def fileno(self) -> int:
        """The descriptor of the backend's one (nameless) file."""
        return self._fd

    def get_config(self) -> dict[str, Any]:
        """Describe the backend as a plain dict."""
        return {"name": "FileStorage", "path": str(self.path), "direct": self.direct,
                "direct_min_bytes": self.direct_min_bytes}

    def _set_size(self, nbytes: int, *, exact: bool) -> None:
        """Make every record hold ``nbytes`` (``exact``: a reservation), or at least that much (a
        put: a smaller state takes a record of its own, writing only its bytes)."""
        if self._nbytes == nbytes or (not exact and self._nbytes is not None
                                      and nbytes <= self._nbytes):
            return
        if self._slots:
            raise InvalidValueError(f"FileStorage holds states of up to {self._nbytes} bytes; "
                                    f"got {nbytes}")
        self._nbytes, self._record = nbytes, padded(nbytes)
        self._free, self._n_records = [], 0

    def free_bytes(self) -> int:
        """Bytes free for this user on the device under ``path`` (statvfs)."""
        stat = os.fstatvfs(self._fd)
        return stat.f_bavail * stat.f_frsize

    def room_for(self, nbytes: int) -> int | None:
        """States of ``nbytes`` the file holds now and the device's free space adds."""
        with self._lock:
            return (self._backed + self.free_bytes()) // padded(nbytes)

    def reserve(self, nbytes: int, count: int) -> None:
        with self._lock:
            self._set_size(nbytes, exact=True)
            need = count * self._record - self._backed
            if need <= 0:
                return
            free = self.free_bytes()
            if need > free:
                raise StorageFullError(
                    f"FileStorage.reserve under {str(self.path)!r}: the run writes {count} states "
                    f"of {nbytes} bytes ({gib(count * self._record)}), the device has "
                    f"{gib(free)} free"
                )
            self._fallocate(count)

    def _fallocate(self, records: int) -> None:
        # only the range beyond what is backed: from 0 every time, each growth walks the whole
        # file (on tmpfs, every page of it), and a run of n puts costs O(n^2)
        start, end = self._backed, records * self._record
        if end <= start:
            return
        try:
            os.posix_fallocate(self._fd, start, end - start)
        except OSError as exc:
            if exc.errno == errno.ENOSPC:
                raise StorageFullError(
                    f"FileStorage under {str(self.path)!r}: device full while preallocating "
                    f"{gib(records * self._record)}"
                ) from exc
            if exc.errno not in (errno.EOPNOTSUPP, errno.EINVAL):
                raise
        self._backed = max(self._backed, records * self._record)

    def _grow(self, records: int) -> None:
        """Back at least ``records`` records: a quarter more than now where the device has
        room for it (appends then seldom fall back to the allocator), else just ``records``."""
        ahead = max(records, (self._backed // self._record) * 5 // 4)
        if ahead > records and not self._ram:  # in RAM, what is backed is memory held
            try:
                self._fallocate(ahead)
                return
            except StorageFullError:
                pass  # the quarter does not fit: what this put needs may
        self._fallocate(records)

    def _bounce_page(self) -> np.ndarray:
        page = getattr(self._bounce, "page", None)
        if page is None:
            page = self._bounce.page = aligned_buffer(PAGE)
        return page

    def _aligned(self, array: np.ndarray) -> bool:
        return (self.direct and array.nbytes >= self.direct_min_bytes
                and array.ctypes.data % PAGE == 0)

    def put(self, key: int, buf: np.ndarray) -> None:
        with self._lock:
            if self._closed:
                raise StorageError(f"FileStorage.put({key}): the storage is closed")
            self._set_size(buf.nbytes, exact=False)
            if key in self._slots:
                raise StorageKeyError(f"FileStorage.put({key}): key already stored")
            if self._free:
                slot = self._free.pop()
            else:
                slot = self._n_records
                if slot + 1 > self._backed // self._record:
                    self._grow(slot + 1)
                self._n_records = slot + 1  # only once its room exists: a failed put leaks none
            self._slots[key] = slot
        offset = slot * self._record
        try:
            self._write(buf, offset)
        except OSError as exc:
            with self._lock:
                self._slots.pop(key, None)
                self._free.append(slot)
            if exc.errno == errno.ENOSPC:
                raise StorageFullError(
                    f"FileStorage.put({key}): device under {str(self.path)!r} full after "
                    f"{gib(len(self._slots) * self._record)} written"
                ) from exc
            raise

    def _write(self, buf: np.ndarray, offset: int) -> None:
        nbytes = buf.nbytes
        if not self._aligned(buf):
            self._pwrite_all(self._fd, buf.data, offset)
            return
        body = nbytes - nbytes % PAGE
        if body:
            self._pwrite_all(self._direct_fd, buf[:body].data, offset)
        if body < nbytes:
            page = self._bounce_page()
            page[: nbytes - body] = buf[body:]
            self._pwrite_all(self._direct_fd, page.data, offset + body)

    @staticmethod
    def _pwrite_all(fd: int, data: memoryview, offset: int) -> None:
        while data.nbytes:
            written = os.pwrite(fd, data, offset)
            data, offset = data[written:], offset + written

    def get(self, key: int, out: np.ndarray) -> None:
        with self._lock:
            slot = self._slots.get(key)
        if slot is None:
            raise StorageKeyError(f"FileStorage.get({key}): key not stored")
        offset = slot * self._record
        nbytes = out.nbytes
        if not self._aligned(out):
            self._pread_exact(self._fd, out.data, offset, key)
            return
        body = nbytes - nbytes % PAGE
        if body:
            self._pread_exact(self._direct_fd, out[:body].data, offset, key)
        if body < nbytes:
            page = self._bounce_page()
            self._pread_exact(self._direct_fd, page.data, offset + body, key,
                              need=nbytes - body)
            out[body:] = page[: nbytes - body]

    def _pread_exact(self, fd: int, view: memoryview, offset: int, key: int,
                     need: int | None = None) -> None:
        need = view.nbytes if need is None else need
        done = 0
        while done < need:
            got = os.preadv(fd, [view[done:]], offset + done)
            if got == 0:
                raise StorageError(
                    f"FileStorage.get({key}): short read, {done} of {need} bytes at offset {offset}"
                )
            done += got

    def drop_cache(self) -> None:
        """Flush the file and ask the kernel to drop its cached pages, so the next reads come
        from the device (a cold read)."""
        os.fsync(self._fd)
        if hasattr(os, "posix_fadvise"):
            os.posix_fadvise(self._fd, 0, 0, os.POSIX_FADV_DONTNEED)

    def delete(self, key: int) -> None:
        with self._lock:
            slot = self._slots.pop(key, None)
            if slot is None:
                raise StorageKeyError(f"FileStorage.delete({key}): key not stored")
            self._free.append(slot)
            if self._ram and not self._slots:
                # an empty file in RAM gives its memory back (the probe's state, a finished
                # run's): a budget would otherwise pay for records nothing is stored in
                os.ftruncate(self._fd, 0)
                self._backed, self._free, self._n_records = 0, [], 0

    def __contains__(self, key: object) -> bool:
        with self._lock:
            return key in self._slots

    def _forget_after_fork(self) -> None:
        """Close the descriptors without touching the file (the parent's); refuse any use."""
        self._lock = threading.Lock()  # another thread may have held it at the fork
        self._closed = True
        for fd in (self._fd, self._direct_fd):
            if fd >= 0:
                os.close(fd)
        self._fd = self._direct_fd = -1
        self._made_root = None  # the parent's to remove

    def close(self) -> None:
        with self._lock:
            if self._closed:
                return
            self._closed = True
            self._slots.clear()
        self._cleanup()

    def _cleanup(self) -> None:
        kept = KeptFile(self._fd, self._direct_fd, self._backed)
        self._fd = self._direct_fd = -1
        keep_or_release(self._where, kept)
        self._remove_made_root()

    def _remove_made_root(self) -> None:
        if self._made_root is not None:
            remove_made(self.path, self._made_root)
            self._made_root = None

    def __del__(self) -> None:
        if not getattr(self, "_closed", True):
            self.close()

