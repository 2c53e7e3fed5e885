"""Level-2 that outlives the process: a :class:`~asyncckpt.storage.FileStorage` whose file has a
name in the run's directory, each state flushed to the device before its write returns."""
from __future__ import annotations

import os
from collections.abc import Mapping
from pathlib import Path

import numpy as np

from .._memory.buffers import padded
from ..errors import CorruptionError, StorageKeyError
from .files import FileStorage
from .kept import release_fds
from .rundir import open_own

__all__ = ["DurableFileStorage", "STATES_FILE"]

#: The file of a run directory that holds the Level-2 states, a page-aligned record each
STATES_FILE = "states.bin"


class DurableFileStorage(FileStorage):
    """Level-2 in ``path/states.bin``: what a :class:`FileStorage` does, with a name, so that
    a later process finds it, and with every ``put`` flushed to the device (``fdatasync``)
    before it returns: a state a put returned from survives a crash of the process or the node.

    Which record holds which key is the caller's to record (:meth:`records`) and give back to
    a backend in a later process (:meth:`restore`): the file alone says nothing of it.

    Parameters
    ----------
    path : str or os.PathLike
        The run's directory (made private, 0700, where missing). Its ``states.bin`` is opened
        without following a link: a link there, a hard link or a file of another kind is
        refused (a :class:`~asyncckpt.errors.UsageError` naming it).
    direct : bool or None
        As for :class:`FileStorage`.
    """

    #: States the file may hold where it is in RAM and a budget bounds it (None: no bound)
    ram_room: int | None = None

    def room_for(self, nbytes: int) -> int | None:
        room = super().room_for(nbytes)
        if self.ram_room is None:
            return room
        return self.ram_room if room is None else min(room, self.ram_room)

    def _take_file(self, root: Path, direct: bool | None) -> None:
        self._lengths: dict[int, int] = {}
        self._open(root, direct)  # never a kept file: those have no name

    def _open_file(self, root: Path) -> int:
        # never through a link: the states would overwrite the file it names
        return open_own(root / STATES_FILE, os.O_RDWR | os.O_CREAT)

    def __repr__(self) -> str:
        return f"DurableFileStorage({str(self.path)!r})"

    def get_config(self) -> dict[str, object]:
        return {**super().get_config(), "name": "DurableFileStorage"}

    def put(self, key: int, buf: np.ndarray) -> None:
        super().put(key, buf)
        os.fdatasync(self._fd)
        with self._lock:
            self._lengths[key] = buf.nbytes

    def delete(self, key: int) -> None:
        # the base's, less its truncation of an empty file in RAM: a manifest put in place
        # before this delete may still name the records
        with self._lock:
            slot = self._slots.pop(key, None)
            if slot is None:
                raise StorageKeyError(f"DurableFileStorage.delete({key}): key not stored")
            self._free.append(slot)
            self._lengths.pop(key, None)

    def records(self) -> dict[int, tuple[int, int]]:
        """Every key stored: its record index and its bytes."""
        with self._lock:
            return {key: (self._slots[key], self._lengths[key]) for key in self._slots
                    if key in self._lengths}

    @property
    def record_bytes(self) -> int:
        """Bytes per record (0 before the first put or reserve)."""
        return self._record

    def restore(self, nbytes: int, records: Mapping[int, tuple[int, int]]) -> None:
        """Take the states an earlier backend left in the file: ``records`` (key -> record
        index and bytes, as :meth:`records` gave them) of states of ``nbytes`` bytes at most.

        Raises
        ------
        CorruptionError
            If a record lies beyond the end of the file (the file was cut short).
        """
        size = os.fstat(self._fd).st_size
        slots = {slot for slot, _ in records.values()}
        end = (max(slots, default=-1) + 1) * padded(nbytes)
        if end > size:
            raise CorruptionError(f"{self.path / STATES_FILE} holds {size} bytes, its records "
                                  f"need {end}: the file was cut short")
        with self._lock:
            self._set_size(nbytes, exact=True)
            for key, (slot, length) in records.items():
                self._slots[key], self._lengths[key] = slot, length
            self._n_records = max(slots, default=-1) + 1
            self._free = sorted(set(range(self._n_records)) - slots, reverse=True)
            self._backed = max(self._backed, size)

    def remove_directories(self) -> None:
        """Nothing: the run directory's removal is the run's to decide."""

    def _cleanup(self) -> None:
        # the file stays, with its name, for a later process: never kept for another backend
        fds = [fd for fd in (self._fd, self._direct_fd) if fd >= 0]
        self._fd = self._direct_fd = -1
        release_fds(fds, 0)
        self._made_root = None  # the run directory's removal is the run's to decide
