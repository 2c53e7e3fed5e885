"""pyrevolve's storage module: ``NumpyStorage`` (host memory), ``DiskStorage`` (files) and
``BytesStorage`` (compressed bytes in host memory), each holding ``n_ckp`` states of ``size_ckp``
entries, with ``wd`` and ``rd`` the costs H-Revolve prices a write and a read at.

Two interfaces, as pyrevolve's: by key (``save(key, arrays)``, ``load(key, arrays)``) and as a
stack (``push``, ``peek``, ``pop``). The explicitly single- and multi-level revolvers of
:mod:`asyncckpt.compat` store their states in these, synchronously, where pyrevolve would. Unlike
pyrevolve's, a state too large for a slot, a load of a key never saved or a push onto a full stack
raises :class:`~asyncckpt.errors.InvalidValueError` naming the values (pyrevolve asserts, or
ignores the full stack).
"""
from __future__ import annotations

import contextlib
import os
import shutil
import tempfile
import weakref
from collections.abc import Callable, Sequence
from typing import Any

import numpy as np

from ..errors import InvalidValueError
from .compression import CompressedObject

__all__ = ["Storage", "NumpyStorage", "DiskStorage", "BytesStorage"]


class Storage:
    """Base of the storages: ``n_ckp`` states of ``size_ckp`` entries of ``dtype``; ``wd`` and
    ``rd`` price a write and a read for H-Revolve."""

    def __init__(self, size_ckp: int, n_ckp: int, dtype: Any, profiler: Any = None, wd: float = 0,
                 rd: float = 0, name: str = "storage") -> None:
        if int(n_ckp) < 0 or int(size_ckp) < 0:
            raise InvalidValueError(f"a storage needs size_ckp >= 0 and n_ckp >= 0, got "
                                    f"{size_ckp} and {n_ckp}")
        self.size_ckp, self.n_ckp, self.dtype = int(size_ckp), int(n_ckp), np.dtype(dtype)
        self.profiler, self.wd, self.rd, self.name = profiler, wd, rd, name
        self._top = -1  # the stack interface's last key
        self._shapes: dict[int, list[tuple[int, ...]]] = {}

    def save(self, key: int, data_pointers: Sequence[np.ndarray]) -> None:
        """Copy the arrays ``data_pointers`` into slot ``key``."""
        raise NotImplementedError

    def load(self, key: int, locations: Sequence[np.ndarray]) -> None:
        """Copy slot ``key`` into the arrays ``locations``."""
        raise NotImplementedError

    def push(self, data_pointers: Sequence[np.ndarray]) -> None:
        """Save into the next key of the stack."""
        if self.isFull():
            raise InvalidValueError(f"{self.name}: push onto a full stack of {self.n_ckp} states")
        self._top += 1
        self.save(self._top, data_pointers)

    def peek(self, locations: Sequence[np.ndarray]) -> None:
        """Load the top of the stack (nothing when it is empty, as pyrevolve)."""
        if not self.isEmpty():
            self.load(self._top, locations)

    def pop(self, locations: Sequence[np.ndarray]) -> None:
        """Load the top of the stack and drop it."""
        if self.isEmpty():
            raise InvalidValueError(f"{self.name}: pop from an empty stack")
        self.load(self._top, locations)
        self._top -= 1

    def isFull(self) -> bool:  # noqa: N802 (pyrevolve's name)
        return self._top >= self.n_ckp - 1

    def isEmpty(self) -> bool:  # noqa: N802 (pyrevolve's name)
        return self._top == -1

    @property
    def maxsize(self) -> int:
        """Capacity in entries of ``dtype``."""
        return self.size_ckp * self.n_ckp

    @property
    def maxsize_in_bytes(self) -> int:
        return self.maxsize * self.dtype.itemsize

    @property
    def nckp(self) -> int:
        """Capacity in states (what H-Revolve plans with)."""
        return self.n_ckp

    def _check_key(self, key: int) -> int:
        if not 0 <= key < self.n_ckp:
            raise InvalidValueError(f"{self.name}: key {key} outside its {self.n_ckp} slots")
        return key

    def _flat(self, arrays: Sequence[np.ndarray]) -> list[np.ndarray]:
        """The arrays as 1-d arrays of ``dtype``, checked to fit one slot."""
        flat = [np.ascontiguousarray(array).ravel().astype(self.dtype, copy=False)
                for array in arrays]
        total = sum(array.size for array in flat)
        if total > self.size_ckp:
            raise InvalidValueError(f"{self.name}: a state of {total} entries does not fit a "
                                    f"slot of {self.size_ckp}")
        return flat

    def _saved_shapes(self, key: int) -> list[tuple[int, ...]]:
        if key not in self._shapes:
            raise InvalidValueError(f"{self.name}: load of key {key}, which was never saved")
        return self._shapes[key]

    def _timer(self, action: str) -> Any:
        return _timer(self.profiler, action)

    def __repr__(self) -> str:
        return (f"{type(self).__name__}(size_ckp={self.size_ckp}, n_ckp={self.n_ckp}, "
                f"dtype={self.dtype}, wd={self.wd}, rd={self.rd})")


def _timer(profiler: Any, action: str) -> Any:
    """The profiler's timer of a storage ``action``, or nothing to time without a profiler."""
    return profiler.get_timer("storage", action) if profiler is not None \
        else contextlib.nullcontext()


class NumpyStorage(Storage):
    """All slots in one C-contiguous array of ``(n_ckp, size_ckp)``."""

    def __init__(self, size_ckp: int, n_ckp: int, dtype: Any, profiler: Any = None,
                 wd: float = 0, rd: float = 0, name: str = "MemoryStorage") -> None:
        super().__init__(size_ckp, n_ckp, dtype, profiler, wd, rd, name)
        self.storage = np.zeros((self.n_ckp, self.size_ckp), dtype=self.dtype)

    def __getitem__(self, key: int) -> np.ndarray:
        return self.storage[self._check_key(key)]

    def save(self, key: int, data_pointers: Sequence[np.ndarray]) -> None:
        slot, offset = self[key], 0
        with self._timer("copy_save"):
            for array in self._flat(data_pointers):
                slot[offset:offset + array.size] = array
                offset += array.size
        self._shapes[key] = [np.shape(array) for array in data_pointers]

    def load(self, key: int, locations: Sequence[np.ndarray]) -> None:
        slot, offset = self[key], 0
        self._saved_shapes(key)
        with self._timer("copy_load"):
            for location in locations:
                size = location.size
                location[...] = slot[offset:offset + size].reshape(location.shape)
                offset += size


class DiskStorage(Storage):
    """Slots in files under a fresh directory in ``filedir`` (one file, or one per key with
    ``singlefile=False``), removed by ``removeDatdir()``, when the storage is collected, or at
    exit, unless ``keepfiles``."""

    def __init__(self, size_ckp: int, n_ckp: int, dtype: Any, profiler: Any = None,
                 filedir: str | os.PathLike[str] | None = "./", singlefile: bool = True,
                 wd: float = 0, rd: float = 0, name: str = "DiskStorage",
                 keepfiles: bool = False) -> None:
        super().__init__(size_ckp, n_ckp, dtype, profiler, wd, rd, name)
        self.singlefile, self.keepfiles = singlefile, keepfiles
        parent = os.fspath(filedir) if filedir is not None else "."
        os.makedirs(parent, exist_ok=True)
        self.filedir = tempfile.mkdtemp(prefix=f"dat_PID{os.getpid()}_", dir=parent)
        self.datFileName = os.path.join(self.filedir, "checkpoints.dat")  # noqa: N815
        self._file = open(self.datFileName, "w+b") if singlefile else None
        self._cleanup = None if keepfiles else weakref.finalize(
            self, _remove, self.filedir, self._file)

    def _path(self, key: int) -> str:
        return f"{self.datFileName}.k{key}"

    def save(self, key: int, data_pointers: Sequence[np.ndarray]) -> None:
        self._check_key(key)
        flat = self._flat(data_pointers)
        with self._timer("copy_save"):
            if self._file is not None:
                self._file.seek(key * self.size_ckp * self.dtype.itemsize)
                for array in flat:
                    self._file.write(array.data.cast("B"))
                self._file.flush()
            else:
                with open(self._path(key), "wb") as out:
                    for array in flat:
                        out.write(array.data.cast("B"))
        self._shapes[key] = [np.shape(array) for array in data_pointers]

    def load(self, key: int, locations: Sequence[np.ndarray]) -> None:
        self._check_key(key)
        self._saved_shapes(key)
        with self._timer("copy_load"):
            if self._file is not None:
                self._file.seek(key * self.size_ckp * self.dtype.itemsize)
                self._read_into(self._file, locations)
            else:
                with open(self._path(key), "rb") as source:
                    self._read_into(source, locations)

    def _read_into(self, source: Any, locations: Sequence[np.ndarray]) -> None:
        for location in locations:
            values = np.fromfile(source, dtype=self.dtype, count=location.size)
            if values.size != location.size:
                raise InvalidValueError(f"{self.name}: {self.datFileName} ends inside a state")
            location[...] = values.reshape(location.shape)

    def removeDatdir(self) -> None:  # noqa: N802 (pyrevolve's name)
        """Delete the directory and its files now."""
        if self._cleanup is not None:
            self._cleanup()
        else:
            _remove(self.filedir, self._file)


def _remove(directory: str, handle: Any) -> None:
    if handle is not None:
        handle.close()
    shutil.rmtree(directory, ignore_errors=True)


class BytesStorage(Storage):
    """Compressed states in host memory: ``compression`` is a ``(compressor, decompressor)``
    pair as ``asyncckpt.compat.compression.init_compression`` returns. A slot holds
    ``size_ckp`` entries' worth of compressed bytes."""

    def __init__(self, size_ckp: int, n_ckp: int, dtype: Any,
                 compression: tuple[Callable[[Any], Any], Callable[[Any], Any]],
                 auto_pickle: bool = False, profiler: Any = None, wd: float = 0, rd: float = 0,
                 name: str = "ByteStorage") -> None:
        super().__init__(size_ckp, n_ckp, dtype, profiler, wd, rd, name)
        self.compressor, self.decompressor = compression
        self.auto_pickle = auto_pickle
        self.slot_bytes = self.size_ckp * self.dtype.itemsize
        self.storage = memoryview(bytearray(self.slot_bytes * self.n_ckp))
        self._records: dict[int, list[tuple[int, int, dict[str, Any]]]] = {}

    def save(self, key: int, data_pointers: Sequence[np.ndarray]) -> None:
        start = self._check_key(key) * self.slot_bytes
        end, records = start + self.slot_bytes, []
        with self._timer("compress"):
            packed = [self.compressor(array) for array in data_pointers]
        for item in packed:
            if not isinstance(item, CompressedObject):
                raise InvalidValueError(f"{self.name}: the compressor returned a "
                                        f"{type(item).__name__}, expected a CompressedObject")
            data = memoryview(item.data).cast("B")
            if start + data.nbytes > end:
                raise InvalidValueError(f"{self.name}: {data.nbytes} compressed bytes do not "
                                        f"fit what is left of a slot of {self.slot_bytes} bytes")
            self.storage[start:start + data.nbytes] = data
            records.append((start, data.nbytes, item.metadata))
            start += data.nbytes
        self._records[key] = records
        self._shapes[key] = [np.shape(array) for array in data_pointers]

    def load(self, key: int, locations: Sequence[np.ndarray]) -> None:
        self._saved_shapes(key)
        records = self._records[key]
        if len(records) != len(locations):
            raise InvalidValueError(f"{self.name}: key {key} holds {len(records)} arrays, "
                                    f"{len(locations)} locations given")
        with self._timer("decompress"):
            for (start, nbytes, metadata), location in zip(records, locations):
                packed = CompressedObject(bytes(self.storage[start:start + nbytes]),
                                          metadata=metadata)
                location[...] = np.asarray(self.decompressor(packed)).reshape(location.shape)
