"""Level-2 in tiers, fastest first (host DRAM, then a disk)."""
from __future__ import annotations

import threading
import time
from collections.abc import Callable, Sequence

import numpy as np

from .._memory.buffers import padded
from .._memory.keytable import KeyTable
from ..errors import InvalidTypeError, InvalidValueError, StorageError, StorageFullError, \
    StorageKeyError
from .base import Storage

__all__ = ["TieredStorage"]


class TieredStorage(Storage):
    """Level-2 in tiers, fastest first: a state goes to the first tier with room and stays
    there until deleted; reads go to whichever tier holds it. A tier has room while it holds
    fewer than its capacity and byte limit and its device has not reported itself full: a put
    that a tier refuses with :class:`~asyncckpt.StorageFullError` goes on to the next tier, and
    that tier is passed over until it holds fewer states than it held then (or a new plan
    reserves).
    A put that fails otherwise leaves its key in the tier where the tier still holds it, and a
    key is forgotten only once its tier's delete succeeds: a failed call never hides a state.

    Parameters
    ----------
    tiers : sequence of Storage
        The tiers, fastest first (host DRAM, then a disk, say).
    capacities : sequence of int or None, optional
        How many states each tier may hold at once; None (the default for every tier) is no
        limit. A put that finds no room raises :class:`~asyncckpt.StorageFullError`.
    byte_limits : sequence of int or None, optional
        How many bytes of states (each page-padded) each tier may hold at once, beside its
        capacity: states of different sizes are counted at their own sizes. None: no limit.
    owned : sequence of bool, optional
        Which tiers :meth:`close` closes (default: all).
    """

    def __init__(self, tiers: Sequence[Storage], capacities: Sequence[int | None] | None = None,
                 *, byte_limits: Sequence[int | None] | None = None,
                 owned: Sequence[bool] | None = None) -> None:
        self._tiers = list(tiers)
        if not self._tiers or not all(isinstance(t, Storage) for t in self._tiers):
            raise InvalidTypeError(f"TieredStorage needs one Storage per tier, got {tiers!r}")
        self._capacities: list[int | None] = (list(capacities) if capacities is not None
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
        # key -> the tier holding it, and its padded bytes there
        self._tier_of, self._padded_of = KeyTable(np.int16), KeyTable()
        self._held = [0] * len(self.tiers)
        self._held_bytes = [0] * len(self.tiers)
        # per tier, the states it held when its device refused one more (None: never refused)
        self._full_at: list[int | None] = [None] * len(self.tiers)
        #: states written to and read from each tier, the seconds spent and the bytes written,
        #: since :meth:`reset_counters`
        self.writes = [0] * len(self.tiers)
        self.reads = [0] * len(self.tiers)
        self.write_s = [0.0] * len(self.tiers)
        self.read_s = [0.0] * len(self.tiers)
        self.written_bytes = [0] * len(self.tiers)
        self._fresh_base = [0.0] * len(self.tiers)
        self._closed = False

    def __repr__(self) -> str:
        tiers = ", ".join(f"{t!r} (at most {c})" if c is not None else repr(t)
                          for t, c in zip(self.tiers, self.capacities))
        return f"TieredStorage([{tiers}])"

    @property
    def fresh_s(self) -> float:
        return sum(t.fresh_s for t in self.tiers)

    @property
    def capacities(self) -> list[int | None]:
        """States each tier may hold (None: no limit)."""
        return self._capacities

    @property
    def tiers(self) -> list[Storage]:
        """The tiers, fastest first."""
        return self._tiers

    @property
    def holds_process_memory(self) -> bool:
        """Whether any tier keeps its states in this process's memory."""
        return any(t.holds_process_memory for t in self._tiers)

    @property
    def draws_from_pool(self) -> bool:
        """Whether any tier draws its buffers from the process's pool."""
        return any(t.draws_from_pool for t in self._tiers)

    @property
    def nbytes_held(self) -> int:
        """Bytes of process memory the tiers hold (see :attr:`Storage.nbytes_held`)."""
        return sum(t.nbytes_held for t in self._tiers)

    def spares(self, nbytes: int) -> int:
        return sum(t.spares(nbytes) for t in self._tiers)

    def reset_counters(self) -> None:
        """Zero the per-tier counts and times (a new run begins)."""
        with self._lock:
            n = len(self.tiers)
            self.writes, self.reads = [0] * n, [0] * n
            self.write_s, self.read_s = [0.0] * n, [0.0] * n
            self.written_bytes = [0] * n
            self._fresh_base = [t.fresh_s for t in self.tiers]

    def counters(self) -> list[dict[str, float]]:
        """Per tier: writes, reads, the seconds they took (less first-touch time) and the bytes
        written (what the tier stored: compressed states at their compressed size)."""
        with self._lock:
            return [{"writes": w, "reads": r,
                     "write_s": max(0.0, ws - (t.fresh_s - base)), "read_s": rs,
                     "written_bytes": b}
                    for w, r, ws, rs, b, t, base in zip(
                        self.writes, self.reads, self.write_s, self.read_s,
                        self.written_bytes, self.tiers, self._fresh_base)]

    def _count(self, index: int, wrote: bool, seconds: float, nbytes: int = 0) -> None:
        with self._lock:
            if wrote:
                self.writes[index] += 1
                self.write_s[index] += seconds
                self.written_bytes[index] += nbytes
            else:
                self.reads[index] += 1
                self.read_s[index] += seconds

    def set_capacity(self, tier: int, capacity: int | None) -> None:
        """Change how many states ``tier`` may hold from now on."""
        with self._lock:
            self.capacities[tier] = capacity

    def set_byte_limit(self, tier: int, nbytes: int | None) -> None:
        """Change how many bytes of states ``tier`` may hold from now on; a tier in process
        memory lets its spare buffers beyond them go."""
        with self._lock:
            self.byte_limits[tier] = nbytes
        if nbytes is not None:
            self._tiers[tier].shed(nbytes)

    def _has_room(self, index: int, size: int) -> bool:
        capacity, limit, full_at = (self.capacities[index], self.byte_limits[index],
                                    self._full_at[index])
        held = self._held[index]
        return ((capacity is None or held < capacity)
                and (limit is None or self._held_bytes[index] + size <= limit)
                and (full_at is None or held < full_at))

    def _place(self, key: int, call: str, nbytes: int) -> int:
        with self._lock:
            if self._closed:
                raise StorageError(f"TieredStorage.{call}({key}): the storage is closed")
            if key in self._tier_of:
                raise StorageKeyError(f"TieredStorage.{call}({key}): key already stored")
            for index in range(len(self.tiers)):
                # what the state occupies there: a compressed state in a file of records
                # made for full ones takes a whole record (counted at its own size, a tmpfs
                # tier under a 48 MiB budget held 114 MiB)
                size = self._tiers[index].footprint(nbytes)
                if self._has_room(index, size):
                    self._held[index] += 1
                    self._held_bytes[index] += size
                    self._tier_of[key], self._padded_of[key] = index, size
                    return index
        raise StorageFullError(f"TieredStorage.{call}({key}): every tier is full "
                               f"({self._held} states of at most {self.capacities}, "
                               f"{self._held_bytes} bytes of at most {self.byte_limits}, "
                               f"devices full at {self._full_at})")

    def _unplace(self, key: int, *, full: bool = False) -> int:
        """Forget where ``key`` was placed; ``full``: because its tier's device is full, which
        it is taken to be while it holds as many states as it does now."""
        with self._lock:
            index, size = self._tier_of.pop(key), self._padded_of.pop(key)
            self._held[index] -= 1
            self._held_bytes[index] -= size
            if full:
                self._full_at[index] = self._held[index]
            return index

    def _store(self, key: int, call: str, nbytes: int,
               write: Callable[[Storage], np.ndarray | None]) -> np.ndarray | None:
        """``write`` u_key (``nbytes``) to the first tier with room, and to the next where that
        one's device turns out full; the spare buffer ``write`` returns."""
        full: StorageFullError | None = None
        while True:
            try:
                index = self._place(key, call, nbytes)
            except StorageFullError as exc:
                raise exc from full
            start = time.perf_counter()
            try:
                spare = write(self.tiers[index])
            except StorageFullError as exc:
                self._unplace(key, full=True)
                full = exc
                continue
            except BaseException:
                if not _holds(self.tiers[index], key):
                    self._unplace(key)
                raise
            self._count(index, True, time.perf_counter() - start, nbytes)
            return spare

    def put(self, key: int, buf: np.ndarray) -> None:
        self._store(key, "put", buf.nbytes, lambda tier: tier.put(key, buf))

    def adopt(self, key: int, buffer: np.ndarray, nbytes: int) -> np.ndarray:
        spare = self._store(key, "adopt", nbytes,
                            lambda tier: tier.put_staged(key, buffer, nbytes))
        assert spare is not None
        return spare

    def tier_of(self, key: int) -> int:
        """The index of the tier holding ``key``."""
        with self._lock:
            index = self._tier_of.get(key)
        if index is None:
            raise StorageKeyError(f"TieredStorage: key {key} not stored")
        return index

    def get(self, key: int, out: np.ndarray) -> None:
        with self._lock:
            index = self._tier_of.get(key)
        if index is None:
            raise StorageKeyError(f"TieredStorage.get({key}): key not stored")
        start = time.perf_counter()
        self.tiers[index].get(key, out)
        self._count(index, False, time.perf_counter() - start)

    def delete(self, key: int) -> None:
        """Delete ``key`` from its tier, and forget it once that succeeded (or the tier has it
        no more): a failed delete leaves it stored, to be deleted again."""
        with self._lock:
            index = self._tier_of.get(key)
        if index is None:
            raise StorageKeyError(f"TieredStorage.delete({key}): key not stored")
        try:
            self.tiers[index].delete(key)
        except StorageKeyError:
            self._unplace(key)
            raise
        self._unplace(key)

    def __contains__(self, key: object) -> bool:
        with self._lock:
            return key in self._tier_of

    def reserve(self, nbytes: int, count: int) -> None:
        """Reserve on each tier, in order, what it can take of ``count``: its capacity, its
        byte limit and, but for the last tier, the room its device has now bound its share;
        the last tier takes the rest (its device raising :class:`~asyncckpt.StorageFullError`
        where that does not fit)."""
        with self._lock:
            self._full_at = [None] * len(self.tiers)  # a new plan: every device asked anew
        last = len(self.tiers) - 1
        for index, (tier, capacity, limit) in enumerate(zip(self.tiers, self.capacities,
                                                            self.byte_limits)):
            share = max(0, count if capacity is None else min(count, capacity))
            if limit is not None:
                share = min(share, limit // padded(nbytes))
            room = tier.room_for(nbytes) if index < last and share else None
            if room is not None:
                share = min(share, room)
            # a tier given no share is told so: one in RAM gives back an earlier plan's room
            tier.reserve(nbytes, share)
            count -= share

    def close(self) -> None:
        with self._lock:
            if self._closed:
                return
            self._closed = True
            self._tier_of.clear()
            self._padded_of.clear()
        for tier, owned in zip(self.tiers, self._owned):
            if owned:
                tier.close()


def _holds(tier: Storage, key: int) -> bool:
    """Whether ``tier`` holds ``key`` after a put of it failed (some of it may be stored); a
    tier that cannot say is taken to hold it, for a delete to find out."""
    try:
        return key in tier
    except Exception:  # noqa: BLE001 - the put's failure is the one to report
        return True
