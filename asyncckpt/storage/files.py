"""Level-2 in one preallocated file with no name, on a ramdisk or an SSD."""
from __future__ import annotations

import errno
import logging
import os
import threading
from typing import Any

import numpy as np

from .._memory.buffers import PAGE, aligned_buffer
from ..errors import StorageError, StorageFullError, StorageKeyError
from .base import gib
from .file_records import FileRecords
from .kept import KEPT_FILES, release_files

__all__ = ["FileStorage", "release_files", "KEPT_FILES"]

log = logging.getLogger(__name__)


class FileStorage(FileRecords):
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
        super().__init__(path, direct)
        self.direct_min_bytes = direct_min_bytes
        self._bounce = threading.local()
        log.debug("FileStorage under %s (O_DIRECT %s)", self.path, self.direct)


    def __repr__(self) -> str:
        return f"FileStorage({str(self.path)!r})"


    def get_config(self) -> dict[str, Any]:
        """Describe the backend as a plain dict."""
        return {"name": "FileStorage", "path": str(self.path), "direct": self.direct,
                "direct_min_bytes": self.direct_min_bytes}


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
            data = data[written:]
            offset += written


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
                # an empty file in RAM gives back the memory beyond its reservation (the
                # probe's state before a plan reserved any): a budget would otherwise pay for
                # records nothing is stored in. Cut to nothing, every later put faulted its
                # record in anew, and a tmpfs tier ran slower than a disk
                self._shrink(self._reserved)
                self._free = []
                self._n_records = 0


    def __contains__(self, key: object) -> bool:
        with self._lock:
            return key in self._slots
