"""The file under a :class:`~asyncckpt.storage.FileStorage`: one nameless file of page-aligned
records, opened (or taken from a closed backend) and closed (or kept for the next), grown ahead
of the puts and reserved for a run, within the device's free space."""
from __future__ import annotations

import errno
import os
import tempfile
import threading
import weakref
from pathlib import Path

from .._lifetime import reap, start_reaper
from .._memory.buffers import padded
from .._memory.keytable import KeyTable
from ..errors import InvalidTypeError, InvalidValueError, StorageFullError
from .base import Storage, gib
from .directories import make_private, remove_made
from .kept import KeptFile, keep_or_release, ram_backed, take_kept

__all__ = ["FileRecords"]

#: the backends open in this process, whose files a forked child must not keep alive
_OPEN: weakref.WeakSet["FileRecords"] = weakref.WeakSet()


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


class FileRecords(Storage):
    """The file of a :class:`~asyncckpt.storage.FileStorage` (its parameters are documented
    there) and its records: which key holds which, their size, and the blocks that back them.
    Puts, gets and deletes are the subclass's."""

    def __init__(self, path: str | os.PathLike[str], direct: bool | None) -> None:
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
        self._fd = self._direct_fd = -1
        self._record = 0  # bytes per record, fixed by the first put or reserve
        self._backed = 0  # bytes of the file backed by fallocate
        # bytes the last reserve backed: an emptied file in RAM gives back what lies beyond
        # them and keeps them for the run's states
        self._reserved = 0
        self._where = os.path.realpath(root)
        self._ram = ram_backed(self._where)  # its file is memory, not disk
        self._take_file(root, direct)
        self._lock = threading.Lock()
        self._nbytes = 0
        self._slots = KeyTable()  # key -> record
        self._free: list[int] = []
        self._n_records = 0
        self._closed = False
        _OPEN.add(self)
        start_reaper()


    def _take_file(self, root: Path, direct: bool | None) -> None:
        """Take the file a closed backend kept under ``root``, else open a new one."""
        kept = take_kept(self._where, direct)
        if kept is not None:
            self._fd = kept.fd
            self._direct_fd = kept.direct_fd
            self._backed = kept.nbytes
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


    def _set_size(self, nbytes: int, *, exact: bool) -> None:
        """Make every record hold ``nbytes`` (``exact``: a reservation), or at least that much (a
        put: a smaller state takes a record of its own, writing only its bytes)."""
        if self._nbytes == nbytes or (not exact and self._nbytes is not None
                                      and nbytes <= self._nbytes):
            return
        if self._slots:
            raise InvalidValueError(f"FileStorage holds states of up to {self._nbytes} bytes; "
                                    f"got {nbytes}")
        self._nbytes = nbytes
        self._record = padded(nbytes)
        self._free = []
        self._n_records = 0


    def free_bytes(self) -> int:
        """Bytes free for this user on the device under ``path`` (statvfs)."""
        stat = os.fstatvfs(self._fd)
        return stat.f_bavail * stat.f_frsize

    def footprint(self, nbytes: int) -> int:
        """A record: a smaller state than the file's records are made for takes a whole one."""
        return max(padded(nbytes), self._record)

    def room_for(self, nbytes: int) -> int | None:
        """States of ``nbytes`` the file holds now and the device's free space adds."""
        with self._lock:
            return (self._backed + self.free_bytes()) // padded(nbytes)


    def reserve(self, nbytes: int, count: int) -> None:
        with self._lock:
            self._set_size(nbytes, exact=True)
            self._reserved = count * self._record
            need = count * self._record - self._backed
            if need < 0 and self._ram:
                self._shrink(max(count, self._n_records) * self._record)
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
        start = self._backed
        end = records * self._record
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


    def _shrink(self, nbytes: int) -> None:
        """Free the RAM of the file beyond ``nbytes`` (a kept file a run needs less of: it is
        memory the account charges)."""
        if nbytes < self._backed:
            os.ftruncate(self._fd, nbytes)
            self._backed = nbytes

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
        keep_or_release(self._where, kept, self._ram)
        self._remove_made_root()


    def remove_directories(self) -> None:
        """Remove the directories made for ``path`` where empty, as :meth:`close` does, and
        nothing else: at the interpreter's exit, while a call on a thread the exit ends still
        uses the file (which has no name there, and goes with the process)."""
        self._remove_made_root()


    def _remove_made_root(self) -> None:
        if self._made_root is not None:
            remove_made(self.path, self._made_root)
            self._made_root = None


    def __del__(self) -> None:
        if not getattr(self, "_closed", True):
            reap(self)  # a finalizer takes no lock: its thread may hold this one
