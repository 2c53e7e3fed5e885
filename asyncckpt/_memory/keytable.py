"""A map from a state's index to an integer, held in numpy arrays: the bookkeeping kept for every
Level-2 state (its size, its checksum, where it lies) takes 9 to 17 bytes a state instead of the
100 to 150 a dict of Python ints takes, so a run of 100,000 states of 1 KiB keeps about 4 MiB of
it, not 30."""
from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import numpy as np

__all__ = ["KeyTable"]

_MISSING = object()


class KeyTable:
    """``key -> int`` for keys that are state indices (dense, from 0), with a dict's methods that
    the runtime uses. Negative keys (the cost probes' scratch states) live in a small dict.

    Parameters
    ----------
    dtype : numpy dtype
        Of the values (``np.uint64`` for checksums).
    """

    def __init__(self, dtype: Any = np.int64) -> None:
        self._values = np.zeros(0, dtype)
        self._present = np.zeros(0, bool)
        self._count = 0
        self._negative: dict[int, int] = {}

    def _grow(self, key: int) -> None:
        size = max(key + 1, 2 * len(self._values), 64)
        values = np.zeros(size, self._values.dtype)
        present = np.zeros(size, bool)
        values[:len(self._values)] = self._values
        present[:len(self._present)] = self._present
        self._values, self._present = values, present

    def __setitem__(self, key: int, value: int) -> None:
        if key < 0:
            self._negative[key] = value
            return
        if key >= len(self._values):
            self._grow(key)
        if not self._present[key]:
            self._present[key] = True
            self._count += 1
        self._values[key] = value

    def get(self, key: int, default: Any = None) -> Any:
        if key < 0:
            return self._negative.get(key, default)
        if key < len(self._present) and self._present[key]:
            return int(self._values[key])
        return default

    def __getitem__(self, key: int) -> int:
        value = self.get(key, _MISSING)
        if value is _MISSING:
            raise KeyError(key)
        return value

    def pop(self, key: int, default: Any = _MISSING) -> Any:
        value = self.get(key, _MISSING)
        if value is _MISSING:
            if default is _MISSING:
                raise KeyError(key)
            return default
        if key < 0:
            del self._negative[key]
        else:
            self._present[key] = False
            self._count -= 1
        return value

    def __contains__(self, key: object) -> bool:
        return isinstance(key, (int, np.integer)) and self.get(int(key), _MISSING) is not _MISSING

    def __len__(self) -> int:
        return self._count + len(self._negative)

    def __bool__(self) -> bool:
        return len(self) > 0

    def __iter__(self) -> Iterator[int]:
        """The keys, negative ones first, then ascending."""
        yield from sorted(self._negative)
        yield from (int(key) for key in np.flatnonzero(self._present))

    def clear(self) -> None:
        self._values = np.zeros(0, self._values.dtype)
        self._present = np.zeros(0, bool)
        self._count = 0
        self._negative.clear()
