"""The Level-2 contract: :class:`Storage`, what every backend is, and :class:`WrapperStorage`,
a backend around another one (metering, fault injection, compression)."""
from __future__ import annotations

import abc
import functools
from collections.abc import Sequence
from typing import Any

import numpy as np

from .._memory.buffers import padded
from ..errors import InvalidTypeError, InvalidValueError

__all__ = ["Storage", "WrapperStorage"]

_GIB = float(1 << 30)


def gib(nbytes: float) -> str:
    """``nbytes`` in GiB, for messages."""
    return f"{nbytes / _GIB:.2f} GiB"


class Storage(abc.ABC):
    """The Level-2 abstract base: the contract every backend keeps.

    Keys are ints (the step t, or negative for the checkpointer's own probes); a value is the
    bytes of one flat uint8 buffer. The five abstract methods are the whole required contract;
    :meth:`reserve`, :meth:`adopt` and :meth:`get_config` have working defaults that a backend
    overrides where it can do better. ``put``, ``get``, ``adopt`` and ``delete`` run on the
    transfer engine's worker threads, so they must be safe to call from several threads at
    once for distinct keys. ``asyncckpt.testing.StorageTests`` checks a backend against
    this contract.

    Subclass it, or a concrete backend, to add a backend or to inject faults; wrap one in a
    :class:`WrapperStorage` to change what it does without knowing its class. A subclass that
    overrides ``put`` sees every write: the runtime hands staged states over through
    :meth:`put_staged`, which calls ``adopt`` only where no ``put`` overrides it from below.

    What the runtime needs to know of a backend it asks of these capabilities, never of its
    class, each with a default here: :attr:`holds_process_memory`, :attr:`draws_from_pool`,
    :attr:`nbytes_held`, :meth:`spares`, :meth:`shed`, :attr:`fresh_s`, :attr:`compression`, and for a backend of
    several tiers :attr:`tiers`, :attr:`capacities`, :meth:`set_byte_limit`, :meth:`counters`
    and :meth:`reset_counters`.
    """

    @property
    def holds_process_memory(self) -> bool:
        """Whether stored states occupy this process's memory (host DRAM, pinned memory): a
        memory budget then counts them, and bounds the backend as a tier of its own (default
        False)."""
        return False

    @property
    def draws_from_pool(self) -> bool:
        """Whether the buffers of stored states come from the process's pool of kept buffers
        (and go back to it): the buffers the pool keeps are then this backend's room, not
        memory beside it, as they are beside a file in RAM (default False)."""
        return False

    @property
    def fresh_s(self) -> float:
        """Seconds spent obtaining fresh memory (first-touch page faults) inside ``put`` and
        ``adopt`` so far; the tuner prices writes without it. Backends that allocate as they go
        count it (default 0)."""
        return 0.0

    @property
    def nbytes_held(self) -> int:
        """Bytes of this process's memory the backend holds (stored and kept for reuse); 0 for a
        backend that keeps states elsewhere (a file, another process)."""
        return 0

    def spares(self, nbytes: int) -> int:
        """Buffers of this process's memory kept, already touched, for the next states of
        ``nbytes`` bytes: what a run reuses without faulting fresh memory in (default 0)."""
        return 0

    def footprint(self, nbytes: int) -> int:
        """Bytes a state of ``nbytes`` occupies here: page-padded (default), or a whole record
        in a backend of fixed-size records (a compressed state in a file reserved for full
        ones). Tiers bound by bytes charge this, not the state's own size."""
        return padded(nbytes)

    def shed(self, keep_bytes: int) -> None:
        """Let spare buffers go (to the process pool) until at most ``keep_bytes`` of this
        process's memory are held, stored states included: a budget that gives this backend
        less room gives the rest to Level-1 (default: nothing is kept to let go)."""

    @property
    def compression(self) -> Any:
        """What compressing the states has done so far (a
        :class:`~asyncckpt.storage.CompressionCounters`), or None for a backend that stores them
        as they are (the default)."""
        return None

    @property
    def tiers(self) -> Sequence["Storage"] | None:
        """The backends this one places states on, fastest first, each with its own costs and
        capacity (:class:`~asyncckpt.storage.TieredStorage`); None for one device (the
        default)."""
        return None

    @property
    def capacities(self) -> Sequence[int | None] | None:
        """States each of :attr:`tiers` may hold (None: no limit), or None for one device (the
        default)."""
        return None

    def room_for(self, nbytes: int) -> int | None:
        """How many states of ``nbytes`` bytes the device could hold now, those it holds
        included (None: no limit it can tell, the default); "auto" plans within it, asking
        each of :attr:`tiers` where there are several."""
        return None

    def set_byte_limit(self, tier: int, nbytes: int | None) -> None:
        """Bound the bytes of states ``tier`` of :attr:`tiers` may hold from now on (None: no
        bound). One device has no tiers to bound: the default raises."""
        raise InvalidValueError(f"{self!r} has no tiers: set_byte_limit({tier}, {nbytes}) "
                                "needs a backend of several (a TieredStorage)")

    def counters(self) -> list[dict[str, float]] | None:
        """Per tier since :meth:`reset_counters`: writes, reads, their seconds and the bytes
        written; None for one device (the default)."""
        return None

    def reset_counters(self) -> None:
        """Zero what :meth:`counters` reports (a new run begins). The default does nothing."""

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
        buffer as the stored copy (DRAM) returns a spare one instead and saves a copy.
        """
        self.put(key, buffer[:nbytes])
        return buffer

    def put_staged(self, key: int, buffer: np.ndarray, nbytes: int) -> np.ndarray:
        """What the runtime calls to store a staging buffer: :meth:`adopt`, unless a subclass
        overrides ``put`` below the class whose ``adopt`` it would inherit (that ``adopt``
        would skip the override), in which case the base one, which calls ``put``."""
        if _put_below_adopt(type(self)):
            return Storage.adopt(self, key, buffer, nbytes)
        return self.adopt(key, buffer, nbytes)

    def get_config(self) -> dict[str, Any] | None:
        """A plain dict that :func:`~asyncckpt.storage.from_config` rebuilds the backend from (in
        another process, say), or None where the backend cannot be rebuilt from one (the
        default)."""
        return None

    def __enter__(self) -> "Storage":
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()


@functools.cache
def _put_below_adopt(cls: type) -> bool:
    """Whether ``cls`` takes ``put`` from a class below the one it takes ``adopt`` from."""
    mro = cls.__mro__

    def owner(name: str) -> int:
        return next(i for i, klass in enumerate(mro) if name in vars(klass))
    return owner("put") < owner("adopt")


class WrapperStorage(Storage):
    """A backend that passes every call to ``inner``: subclass it and override what should
    change (a ``put`` that counts, a ``get`` that injects a fault, a codec around both).

    Every capability the runtime asks of a backend (see :class:`Storage`) is the inner
    backend's, so a wrapper around host DRAM is counted by a memory budget as DRAM and one
    around a :class:`~asyncckpt.storage.TieredStorage` shows its tiers. ``close`` closes the
    inner backend.

    Parameters
    ----------
    inner : Storage
        The backend wrapped.
    """

    def __init__(self, inner: Storage) -> None:
        if not isinstance(inner, Storage):
            raise InvalidTypeError(f"{type(self).__name__} wraps a Storage, got "
                                   f"{type(inner).__name__}")
        self.inner = inner

    def __repr__(self) -> str:
        return f"{type(self).__name__}({self.inner!r})"

    @property
    def holds_process_memory(self) -> bool:
        return self.inner.holds_process_memory

    @property
    def draws_from_pool(self) -> bool:
        return self.inner.draws_from_pool

    @property
    def fresh_s(self) -> float:
        return self.inner.fresh_s

    @property
    def tiers(self) -> Sequence[Storage] | None:
        return self.inner.tiers

    @property
    def capacities(self) -> Sequence[int | None] | None:
        return self.inner.capacities

    def room_for(self, nbytes: int) -> int | None:
        return self.inner.room_for(nbytes)

    def set_byte_limit(self, tier: int, nbytes: int | None) -> None:
        self.inner.set_byte_limit(tier, nbytes)

    def counters(self) -> list[dict[str, float]] | None:
        return self.inner.counters()

    def reset_counters(self) -> None:
        self.inner.reset_counters()

    @property
    def nbytes_held(self) -> int:
        return self.inner.nbytes_held

    def spares(self, nbytes: int) -> int:
        return self.inner.spares(nbytes)

    def footprint(self, nbytes: int) -> int:
        return self.inner.footprint(nbytes)

    def shed(self, keep_bytes: int) -> None:
        self.inner.shed(keep_bytes)

    @property
    def compression(self) -> Any:
        return self.inner.compression

    def put(self, key: int, buf: np.ndarray) -> None:
        self.inner.put(key, buf)

    def adopt(self, key: int, buffer: np.ndarray, nbytes: int) -> np.ndarray:
        return self.inner.put_staged(key, buffer, nbytes)

    def get(self, key: int, out: np.ndarray) -> None:
        self.inner.get(key, out)

    def delete(self, key: int) -> None:
        self.inner.delete(key)

    def __contains__(self, key: object) -> bool:
        return key in self.inner

    def reserve(self, nbytes: int, count: int) -> None:
        self.inner.reserve(nbytes, count)

    def close(self) -> None:
        self.inner.close()
