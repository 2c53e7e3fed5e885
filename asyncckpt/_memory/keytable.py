"""A map from a state's index to an integer, held in flat arrays: the bookkeeping kept for every
Level-2 state (its size, its checksum, where it lies) takes 9 to 17 bytes a state instead of the
100 to 150 a dict of Python ints takes, so a run of 100,000 states of 1 KiB keeps about 4 MiB of
it, not 30."""
from __future__ import annotations

import array
from collections.abc import Iterator
from itertools import compress
from typing import Any

import numpy as np

__all__ = ["KeyTable"]

_MISSING = object()


class KeyTable:
    """``key -> int`` for keys that are state indices (dense, from 0), with a dict's methods that
    the runtime uses. Negative keys (the cost probes' scratch states) live in a small dict.

    The values are a :class:`array.array` and the presence flags a :class:`bytearray`: an item
    of either reads and writes as a plain Python int, several times faster than a numpy
    array's scalar, and the engine looks a state up several times per Level-2 transfer.

    Parameters
    ----------
    dtype : numpy dtype
        Of the values (``np.uint64`` for checksums).
    """

    __slots__ = ("_values", "_present", "_count", "_negative", "_typecode")

    def __init__(self, dtype: Any = np.int64) -> None:
        dtype = np.dtype(dtype)
        typecode = dtype.char
        if typecode not in array.typecodes or array.array(typecode).itemsize != dtype.itemsize:
            raise TypeError(f"KeyTable holds integers of a C type, got dtype {dtype}")
        self._typecode = typecode
        self._values = array.array(typecode)
        self._present = bytearray()
        self._count = 0
        self._negative: dict[int, int] = {}

    def _grow(self, key: int) -> None:
        more = max(key + 1, 2 * len(self._values), 64) - len(self._values)
        self._values.frombytes(bytes(more * self._values.itemsize))
        self._present.extend(bytes(more))

    def __setitem__(self, key: int, value: int) -> None:
        if key < 0:
            self._negative[key] = value
            return
        if key >= len(self._present):
            self._grow(key)
        self._values[key] = value
        if not self._present[key]:
            self._present[key] = 1
            self._count += 1

    def get(self, key: int, default: Any = None) -> Any:
        if key < 0:
            return self._negative.get(key, default)
        if key < len(self._present) and self._present[key]:
            return self._values[key]
        return default

    def __getitem__(self, key: int) -> int:
        if 0 <= key < len(self._present) and self._present[key]:
            return self._values[key]
        if key < 0:
            return self._negative[key]
        raise KeyError(key)

    def pop(self, key: int, default: Any = _MISSING) -> Any:
        if key < 0:
            if default is _MISSING:
                return self._negative.pop(key)
            return self._negative.pop(key, default)
        if key < len(self._present) and self._present[key]:
            self._present[key] = 0
            self._count -= 1
            return self._values[key]
        if default is _MISSING:
            raise KeyError(key)
        return default

    def __contains__(self, key: object) -> bool:
        return isinstance(key, (int, np.integer)) and self.get(int(key), _MISSING) is not _MISSING

    def __len__(self) -> int:
        return self._count + len(self._negative)

    def __bool__(self) -> bool:
        return len(self) > 0

    def __iter__(self) -> Iterator[int]:
        """The keys, negative ones first, then ascending."""
        yield from sorted(self._negative)
        yield from compress(range(len(self._present)), self._present)

    def clear(self) -> None:
        self._values = array.array(self._typecode)
        self._present = bytearray()
        self._count = 0
        self._negative.clear()
