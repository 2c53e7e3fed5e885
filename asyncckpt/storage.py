"""Level-2 storage: where every I-th state waits for the reverse sweep.

Keys are ints (the step t); a value is one flat buffer of ``nbytes`` bytes. ``put`` and ``get`` block
and run on the transfer engine's worker threads, so backends must be thread-safe for distinct keys.
"""
from __future__ import annotations

import abc
import errno
import logging
import os
import tempfile
import threading
import time
from pathlib import Path
from collections.abc import Sequence
from typing import Any

import numpy as np
import psutil

from ._buffers import PAGE, aligned_buffer, padded
from ._pool import POOL
from .errors import (InvalidTypeError, InvalidValueError, StorageError, StorageFullError,
                     StorageKeyError)

__all__ = [
    "Storage",
    "HostMemoryStorage",
    "PinnedMemoryStorage",
    "FileStorage",
    "TieredStorage",
    "from_config",
    "open_storage",
    "release_memory",
]

log = logging.getLogger(__name__)

_GIB = float(1 << 30)


def _gib(nbytes: float) -> str:
    return f"{nbytes / _GIB:.2f} GiB"


class Storage(abc.ABC):
    """The Level-2 abstract base: the contract every backend keeps.

    Keys are ints (the step t, or negative for the checkpointer's own probes); a value is the
    bytes of one flat uint8 buffer. The five abstract methods are the whole required contract;
    :meth:`reserve`, :meth:`adopt` and :meth:`get_config` have working defaults that a backend
    overrides where it can do better. ``put``, ``get``, ``adopt`` and ``delete`` run on the
    transfer engine's worker threads, so they must be safe to call from several threads at
    once for distinct keys. :class:`asyncckpt.testing.StorageTests` checks a backend against
    this contract.

    Subclass it, or a concrete backend, to add a backend or to inject faults.
    """

    #: Seconds spent obtaining fresh memory (first-touch page faults) inside ``put`` and
    #: ``adopt``; the tuner prices writes without it. Backends that allocate as they go count it.
    fresh_s: float = 0.0

    @abc.abstractmethod
    def put(self, key: int, buf: np.ndarray) -> None:
        """Store a copy of the bytes of ``buf`` (a 1-d uint8 array) under ``key``.

        Raises
        ------
        StorageKeyError
            If ``key`` is stored already (nothing is replaced).
        StorageError
            If the storage is closed, or the device fails.
        """

    @abc.abstractmethod
    def get(self, key: int, out: np.ndarray) -> None:
        """Copy the bytes stored under ``key`` into ``out`` (a writable 1-d uint8 array).

        Raises
        ------
        StorageKeyError
            If ``key`` is not stored.
        """

    @abc.abstractmethod
    def delete(self, key: int) -> None:
        """Forget ``key`` and release its space.

        Raises
        ------
        StorageKeyError
            If ``key`` is not stored.
        """

    @abc.abstractmethod
    def __contains__(self, key: object) -> bool:
        """Whether ``key`` is stored."""

    @abc.abstractmethod
    def close(self) -> None:
        """Release everything; safe to call twice. ``put`` afterwards raises StorageError."""

    def reserve(self, nbytes: int, count: int) -> None:
        """Prepare room for ``count`` values of ``nbytes`` bytes before the run. The default does
        nothing.

        Raises
        ------
        StorageFullError
            Where a backend can tell that they will not fit.
        """

    def adopt(self, key: int, buffer: np.ndarray, nbytes: int) -> np.ndarray:
        """Store the first ``nbytes`` bytes of ``buffer`` (a staging buffer the caller gives up)
        under ``key``; return a buffer of at least ``nbytes`` bytes to stage into next.

        The default is :meth:`put`, returning ``buffer`` itself. A backend that can keep the
        buffer as the stored copy (DRAM) returns a spare one instead and saves a copy; a
        subclass that changes what ``put`` does must then route ``adopt`` through it as well.
        """
        self.put(key, buffer[:nbytes])
        return buffer

    def get_config(self) -> dict[str, Any] | None:
        """A plain dict that :func:`from_config` rebuilds the backend from (in another process,
        say), or None where the backend cannot be rebuilt from one (the default)."""
        return None

    def __enter__(self) -> "Storage":
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()


def release_memory() -> int:
    """Return the DRAM that closed :class:`HostMemoryStorage` backends keep for reuse to the
    operating system; return how many bytes that was."""
    return POOL.release()


class HostMemoryStorage(Storage):
    """Level-2 in host DRAM: one touched buffer per stored state, reused.

    ``nbytes_held`` tells how much DRAM it holds, for memory accounting. On ``close`` its buffers
    go to a process-wide pool (a quarter of the physical memory at most) that the next
    HostMemoryStorage draws from, so repeated checkpointers do not fault fresh memory in again;
    :func:`release_memory` returns them to the operating system.
    """

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._stored: dict[int, np.ndarray] = {}
        # freed buffers by their (page-padded) size, for the next state of that size
        self._spare: dict[int, list[np.ndarray]] = {}
        self._closed = False
        self.fresh_s = 0.0  # buffers from the pool or fresh pages: what a kept buffer avoids

    def __repr__(self) -> str:
        return "HostMemoryStorage()"

    def _fresh(self, nbytes: int) -> np.ndarray:
        start = time.perf_counter()
        buffer = POOL.aligned(nbytes)  # one a closed backend left in the pool, else new
        elapsed = time.perf_counter() - start
        with self._lock:
            self.fresh_s += elapsed
        return buffer

    def get_config(self) -> dict[str, Any]:
        """Describe the backend as a plain dict."""
        return {"name": "HostMemoryStorage"}

    @property
    def nbytes_held(self) -> int:
        """Bytes of DRAM this backend's buffers occupy (stored and spare; every byte touched)."""
        with self._lock:
            return sum(b.nbytes for b in self._buffers())

    def _buffers(self) -> list[np.ndarray]:
        return list(self._stored.values()) + [b for kept in self._spare.values() for b in kept]

    def spares(self, nbytes: int) -> int:
        """Freed buffers kept for the next states of ``nbytes`` bytes (page-padded)."""
        with self._lock:
            return len(self._spare.get(padded(nbytes), ()))

    def reserve(self, nbytes: int, count: int) -> None:
        """Check that ``count`` states of ``nbytes`` fit in the available memory.

        Nothing is allocated here: buffers are allocated and touched by ``put`` and ``adopt``,
        which run on the I/O thread, so the page faults of fresh memory (0.4 to 1.4 GB/s here)
        overlap the computation instead of delaying the run's start.
        """
        need = nbytes * count
        available = psutil.virtual_memory().available + POOL.nbytes  # the pool's is ours
        if need > available:
            raise StorageFullError(
                f"HostMemoryStorage.reserve: {count} states of {nbytes} bytes need {_gib(need)}, "
                f"only {_gib(available)} of memory is available"
            )

    def _store(self, call: str, key: int, size: int, kept: np.ndarray | None) -> np.ndarray:
        """Check a store under ``key``, keep ``kept`` as its copy when given, and return a buffer
        of ``size`` bytes (page-padded): a spare one, or fresh memory."""
        with self._lock:
            if self._closed:
                raise StorageError(f"HostMemoryStorage.{call}({key}): the storage is closed")
            if key in self._stored:
                raise StorageKeyError(f"HostMemoryStorage.{call}({key}): key already stored")
            spares = self._spare.get(size)
            spare = spares.pop() if spares else None
            if kept is not None:
                self._stored[key] = kept
        return spare if spare is not None else self._fresh(size)

    def put(self, key: int, buf: np.ndarray) -> None:
        target = self._store("put", key, padded(buf.nbytes), None)
        np.copyto(target[: buf.nbytes], buf)
        with self._lock:
            self._stored[key] = target

    def adopt(self, key: int, buffer: np.ndarray, nbytes: int) -> np.ndarray:
        """Keep ``buffer`` itself as the stored copy of ``key`` and return a spare buffer of the
        same size in exchange: in DRAM the staging copy already is the transfer, so handing the
        buffer over saves a second memory copy per store. A state that fills less of the buffer
        than a page-padded copy of it would is copied instead, so that every state is held at
        its own size."""
        if padded(nbytes) < buffer.nbytes:
            self.put(key, buffer[:nbytes])
            return buffer
        return self._store("adopt", key, buffer.nbytes, buffer)

    def get(self, key: int, out: np.ndarray) -> None:
        with self._lock:
            source = self._stored.get(key)
        if source is None:
            raise StorageKeyError(f"HostMemoryStorage.get({key}): key not stored")
        np.copyto(out, source[: out.nbytes])

    def delete(self, key: int) -> None:
        with self._lock:
            buffer = self._stored.pop(key, None)
            if buffer is None:
                raise StorageKeyError(f"HostMemoryStorage.delete({key}): key not stored")
            self._spare.setdefault(buffer.nbytes, []).append(buffer)

    def __contains__(self, key: object) -> bool:
        with self._lock:
            return key in self._stored

    def close(self) -> None:
        with self._lock:
            self._closed = True
            buffers = self._buffers()
            self._stored.clear()
            self._spare.clear()
        POOL.give(buffers)


class PinnedMemoryStorage(HostMemoryStorage):
    """Level-2 in page-locked (pinned) host memory, for states whose Level-1 is a device's: a
    device copies to and from pinned memory by DMA, beside its compute, at the link's full
    bandwidth. Like :class:`HostMemoryStorage` it keeps each state in a buffer of its own
    (adopting the staging buffer the device copied into) and reuses freed ones.

    Parameters
    ----------
    device : asyncckpt.devices.Device, optional
        The device whose page-locked memory to use; default: CUDA device 0 through CuPy.
    """

    def __init__(self, device: Any = None) -> None:
        super().__init__()
        if device is None:
            from .devices.cuda import CupyDevice

            device = CupyDevice()
        self.device = device

    def __repr__(self) -> str:
        return f"PinnedMemoryStorage({self.device.name})"

    def get_config(self) -> None:  # type: ignore[override]
        return None  # its device is a live object, which a plain dict cannot describe

    def _fresh(self, nbytes: int) -> np.ndarray:
        start = time.perf_counter()
        buffer = self.device.pinned(nbytes)
        elapsed = time.perf_counter() - start
        with self._lock:
            self.fresh_s += elapsed
        return buffer

    def close(self) -> None:
        with self._lock:
            self._closed = True
            self._stored.clear()  # pinned memory goes back to the device's allocator
            self._spare.clear()


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
        one path never meet, and its bytes are freed with the last descriptor, on ``close``, at
        exit or when the process is killed (SIGKILL included).
    direct : bool or None
        Use O_DIRECT for page-aligned states of ``direct_min_bytes`` or more (sustained disk
        writes at 2.65 GB/s against 0.37 GB/s through the page cache here). None (default): where
        the filesystem allows it.
    direct_min_bytes : int
        Smaller states go through the page cache, where a 32 KiB write takes about 7 us against
        about 77 us with O_DIRECT here (default 1 MiB).

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
            missing = root
            while not missing.parent.exists():
                missing = missing.parent
            try:
                root.mkdir(parents=True, mode=0o700)
            except OSError as exc:
                raise InvalidValueError(f"FileStorage path {str(root)!r} does not exist and cannot be "
                                 f"created: {exc.strerror}") from exc
            self._made_root = missing
        if not os.access(root, os.W_OK | os.X_OK):
            raise InvalidValueError(f"FileStorage path {str(root)!r} is not writable")
        self.path = root
        self.direct_min_bytes = direct_min_bytes
        self._fd = self._direct_fd = -1
        try:
            self._fd = _open_unnamed(root)
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
        self._lock = threading.Lock()
        self._bounce = threading.local()
        self._record = 0  # bytes per record, fixed by the first put or reserve
        self._nbytes = 0
        self._slots: dict[int, int] = {}
        self._free: list[int] = []
        self._n_records = 0
        self._allocated = 0  # records backed by fallocate
        self._closed = False
        log.debug("FileStorage under %s (O_DIRECT %s)", self.path, self.direct)

    @property
    def direct(self) -> bool:
        """Whether O_DIRECT is used for aligned buffers."""
        return self._direct_fd >= 0

    def __repr__(self) -> str:
        return f"FileStorage({str(self.path)!r})"

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
        self._free, self._n_records, self._allocated = [], 0, 0

    def free_bytes(self) -> int:
        """Bytes free for this user on the device under ``path`` (statvfs)."""
        stat = os.fstatvfs(self._fd)
        return stat.f_bavail * stat.f_frsize

    def reserve(self, nbytes: int, count: int) -> None:
        with self._lock:
            self._set_size(nbytes, exact=True)
            need = (count - self._allocated) * self._record
            if need <= 0:
                return
            free = self.free_bytes()
            if need > free:
                raise StorageFullError(
                    f"FileStorage.reserve under {str(self.path)!r}: the run writes {count} states "
                    f"of {nbytes} bytes ({_gib(count * self._record)}), the device has "
                    f"{_gib(free)} free"
                )
            self._fallocate(count)

    def _fallocate(self, records: int) -> None:
        try:
            os.posix_fallocate(self._fd, 0, records * self._record)
        except OSError as exc:
            if exc.errno == errno.ENOSPC:
                raise StorageFullError(
                    f"FileStorage under {str(self.path)!r}: device full while preallocating "
                    f"{_gib(records * self._record)}"
                ) from exc
            if exc.errno not in (errno.EOPNOTSUPP, errno.EINVAL):
                raise
        self._allocated = max(self._allocated, records)

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
                slot, self._n_records = self._n_records, self._n_records + 1
                if self._n_records > self._allocated:
                    # grow by a quarter at least, so appends seldom fall back to the allocator
                    self._fallocate(max(self._n_records, self._allocated * 5 // 4))
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
                    f"{_gib(len(self._slots) * self._record)} written"
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

    def __contains__(self, key: object) -> bool:
        with self._lock:
            return key in self._slots

    def close(self) -> None:
        with self._lock:
            if self._closed:
                return
            self._closed = True
            self._slots.clear()
        self._cleanup()

    def _cleanup(self) -> None:
        for fd in (self._fd, self._direct_fd):
            if fd >= 0:
                os.close(fd)
        self._fd = self._direct_fd = -1
        self._remove_made_root()

    def _remove_made_root(self) -> None:
        if self._made_root is None:
            return
        # remove only the directories this backend created, and only while empty
        current = self.path
        while True:
            try:
                current.rmdir()
            except OSError:
                break
            if current == self._made_root:
                break
            current = current.parent
        self._made_root = None

    def __del__(self) -> None:
        if not getattr(self, "_closed", True):
            self.close()


class TieredStorage(Storage):
    """Level-2 in tiers, fastest first: a state goes to the first tier with room and stays
    there until deleted; reads go to whichever tier holds it.

    Parameters
    ----------
    tiers : sequence of Storage
        The tiers, fastest first (host DRAM, then a disk, say).
    capacities : sequence of int or None, optional
        How many states each tier may hold at once; None (the default for every tier) is no
        limit. A put that finds no room raises :class:`StorageFullError`.
    byte_limits : sequence of int or None, optional
        How many bytes of states (each page-padded) each tier may hold at once, beside its
        capacity: states of different sizes are counted at their own sizes. None: no limit.
    owned : sequence of bool, optional
        Which tiers :meth:`close` closes (default: all).
    """

    def __init__(self, tiers: Sequence[Storage], capacities: Sequence[int | None] | None = None,
                 *, byte_limits: Sequence[int | None] | None = None,
                 owned: Sequence[bool] | None = None) -> None:
        self.tiers = list(tiers)
        if not self.tiers or not all(isinstance(t, Storage) for t in self.tiers):
            raise InvalidTypeError(f"TieredStorage needs one Storage per tier, got {tiers!r}")
        self.capacities: list[int | None] = (list(capacities) if capacities is not None
                                             else [None] * len(self.tiers))
        if len(self.capacities) != len(self.tiers):
            raise InvalidValueError(f"TieredStorage: {len(self.capacities)} capacities for "
                                    f"{len(self.tiers)} tiers")
        self.byte_limits: list[int | None] = (list(byte_limits) if byte_limits is not None
                                              else [None] * len(self.tiers))
        if len(self.byte_limits) != len(self.tiers):
            raise InvalidValueError(f"TieredStorage: {len(self.byte_limits)} byte limits for "
                                    f"{len(self.tiers)} tiers")
        self._owned = list(owned) if owned is not None else [True] * len(self.tiers)
        self._lock = threading.Lock()
        self._where: dict[int, tuple[int, int]] = {}  # key -> (tier, padded bytes)
        self._held = [0] * len(self.tiers)
        self._held_bytes = [0] * len(self.tiers)
        #: states written to and read from each tier, and the seconds spent, since
        #: :meth:`reset_counters`
        self.writes = [0] * len(self.tiers)
        self.reads = [0] * len(self.tiers)
        self.write_s = [0.0] * len(self.tiers)
        self.read_s = [0.0] * len(self.tiers)
        self._fresh_base = [0.0] * len(self.tiers)
        self._closed = False

    def __repr__(self) -> str:
        tiers = ", ".join(f"{t!r} (at most {c})" if c is not None else repr(t)
                          for t, c in zip(self.tiers, self.capacities))
        return f"TieredStorage([{tiers}])"

    @property
    def fresh_s(self) -> float:  # type: ignore[override]
        return sum(t.fresh_s for t in self.tiers)

    @property
    def nbytes_held(self) -> int:
        """Bytes of DRAM the in-process tiers hold (see :attr:`HostMemoryStorage.nbytes_held`)."""
        return sum(t.nbytes_held for t in self.tiers if isinstance(t, HostMemoryStorage))

    def reset_counters(self) -> None:
        """Zero the per-tier counts and times (a new run begins)."""
        with self._lock:
            n = len(self.tiers)
            self.writes, self.reads = [0] * n, [0] * n
            self.write_s, self.read_s = [0.0] * n, [0.0] * n
            self._fresh_base = [t.fresh_s for t in self.tiers]

    def counters(self) -> list[dict[str, float]]:
        """Per tier: writes, reads and the seconds they took (less first-touch time)."""
        with self._lock:
            return [{"writes": w, "reads": r,
                     "write_s": max(0.0, ws - (t.fresh_s - base)), "read_s": rs}
                    for w, r, ws, rs, t, base in zip(self.writes, self.reads, self.write_s,
                                                     self.read_s, self.tiers, self._fresh_base)]

    def _count(self, index: int, wrote: bool, seconds: float) -> None:
        with self._lock:
            if wrote:
                self.writes[index] += 1
                self.write_s[index] += seconds
            else:
                self.reads[index] += 1
                self.read_s[index] += seconds

    def set_capacity(self, tier: int, capacity: int | None) -> None:
        """Change how many states ``tier`` may hold from now on."""
        with self._lock:
            self.capacities[tier] = capacity

    def set_byte_limit(self, tier: int, nbytes: int | None) -> None:
        """Change how many bytes of states ``tier`` may hold from now on."""
        with self._lock:
            self.byte_limits[tier] = nbytes

    def _place(self, key: int, call: str, nbytes: int) -> int:
        size = padded(nbytes)
        with self._lock:
            if self._closed:
                raise StorageError(f"TieredStorage.{call}({key}): the storage is closed")
            if key in self._where:
                raise StorageKeyError(f"TieredStorage.{call}({key}): key already stored")
            for index, (capacity, limit) in enumerate(zip(self.capacities, self.byte_limits)):
                if ((capacity is None or self._held[index] < capacity)
                        and (limit is None or self._held_bytes[index] + size <= limit)):
                    self._held[index] += 1
                    self._held_bytes[index] += size
                    self._where[key] = index, size
                    return index
        raise StorageFullError(f"TieredStorage.{call}({key}): every tier is full "
                               f"({self._held} states of at most {self.capacities}, "
                               f"{self._held_bytes} bytes of at most {self.byte_limits})")

    def _unplace(self, key: int) -> int:
        with self._lock:
            index, size = self._where.pop(key)
            self._held[index] -= 1
            self._held_bytes[index] -= size
            return index

    def put(self, key: int, buf: np.ndarray) -> None:
        index = self._place(key, "put", buf.nbytes)
        start = time.perf_counter()
        try:
            self.tiers[index].put(key, buf)
        except BaseException:
            self._unplace(key)
            raise
        self._count(index, True, time.perf_counter() - start)

    def adopt(self, key: int, buffer: np.ndarray, nbytes: int) -> np.ndarray:
        index = self._place(key, "adopt", nbytes)
        start = time.perf_counter()
        try:
            spare = self.tiers[index].adopt(key, buffer, nbytes)
        except BaseException:
            self._unplace(key)
            raise
        self._count(index, True, time.perf_counter() - start)
        return spare

    def tier_of(self, key: int) -> int:
        """The index of the tier holding ``key``."""
        with self._lock:
            place = self._where.get(key)
        if place is None:
            raise StorageKeyError(f"TieredStorage: key {key} not stored")
        return place[0]

    def get(self, key: int, out: np.ndarray) -> None:
        with self._lock:
            place = self._where.get(key)
        if place is None:
            raise StorageKeyError(f"TieredStorage.get({key}): key not stored")
        index = place[0]
        start = time.perf_counter()
        self.tiers[index].get(key, out)
        self._count(index, False, time.perf_counter() - start)

    def delete(self, key: int) -> None:
        with self._lock:
            if key not in self._where:
                raise StorageKeyError(f"TieredStorage.delete({key}): key not stored")
        self.tiers[self._unplace(key)].delete(key)

    def __contains__(self, key: object) -> bool:
        with self._lock:
            return key in self._where

    def reserve(self, nbytes: int, count: int) -> None:
        """Reserve on each tier, in order, what its capacity lets it take of ``count``."""
        for tier, capacity, limit in zip(self.tiers, self.capacities, self.byte_limits):
            if count <= 0:
                break
            share = count if capacity is None else min(count, capacity)
            if limit is not None:
                share = min(share, limit // padded(nbytes))
            if share:
                tier.reserve(nbytes, share)
            count -= share

    def close(self) -> None:
        with self._lock:
            if self._closed:
                return
            self._closed = True
            self._where.clear()
        for tier, owned in zip(self.tiers, self._owned):
            if owned:
                tier.close()


def _backends() -> dict[str, type[Storage]]:
    """Every concrete Storage subclass defined so far, by class name (the first one wins)."""
    found: dict[str, type[Storage]] = {}
    pending: list[type[Storage]] = [Storage]  # type: ignore[type-abstract]
    while pending:
        for sub in pending.pop().__subclasses__():
            if not getattr(sub, "__abstractmethods__", None):
                found.setdefault(sub.__name__, sub)
            pending.append(sub)
    return found


def from_config(config: dict[str, Any]) -> Storage:
    """Rebuild a backend from its ``get_config()`` dict: ``config["name"]`` names the class
    (any Storage subclass defined in the process), the other items are its keyword arguments.

    Raises
    ------
    InvalidValueError
        If ``config["name"]`` is not a backend's name.
    """
    backends = _backends()
    name = config.get("name")
    if name not in backends:
        raise InvalidValueError(f"config name {name!r} is not a storage backend; expected one of "
                                f"{', '.join(sorted(backends))}")
    return backends[name](**{k: v for k, v in config.items() if k != "name"})  # type: ignore[index]


def open_storage(storage: Any, device: Any = None) -> tuple[Storage, bool]:
    """Resolve a Level-2 spec: None or "dram" (any case) for host DRAM (page-locked, a
    :class:`PinnedMemoryStorage`, where Level-1 is a ``device``), a path for a
    :class:`FileStorage` with a nameless file under it, a :class:`Storage` instance, or a list
    or tuple of those: tiers, fastest first, as one :class:`TieredStorage` (a list of one is
    that one tier).

    Returns
    -------
    (Storage, bool)
        The backend, and whether this call made it (and so whoever called must close it; a
        TieredStorage made here closes only the tiers made here).

    Raises
    ------
    InvalidTypeError
        If ``storage`` is none of those.
    """
    if isinstance(storage, (list, tuple)):
        if not storage:
            raise InvalidValueError("storage is an empty list; expected tiers, fastest first, "
                                    "such as ['dram', '/scratch']")
        opened: list[tuple[Storage, bool]] = []
        try:
            for spec in storage:
                if isinstance(spec, (list, tuple)):
                    raise InvalidTypeError(f"storage tiers cannot nest, got {spec!r}")
                opened.append(open_storage(spec, device))
        except BaseException:
            for tier, owned in opened:
                if owned:
                    tier.close()
            raise
        if len(opened) == 1:
            return opened[0]
        return TieredStorage([t for t, _ in opened], owned=[o for _, o in opened]), True
    if storage is None or (isinstance(storage, str) and storage.strip().lower() == "dram"):
        return (HostMemoryStorage() if device is None else PinnedMemoryStorage(device)), True
    if isinstance(storage, (str, os.PathLike)):
        return FileStorage(storage), True
    if isinstance(storage, Storage):
        return storage, False
    raise InvalidTypeError(
        f"storage must be None or 'dram' (host DRAM), a path, an asyncckpt.storage.Storage "
        f"instance, or a list of those (tiers); got {type(storage).__name__}"
    )
