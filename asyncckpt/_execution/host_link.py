"""Level-1 in host memory: a store is one memcpy into a staging buffer on the caller's thread,
a load one memcpy out of a prefetch buffer, and operators are timed by the clock."""
from __future__ import annotations

from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import numpy as np
import xxhash

from .._memory.buffers import copy_halves, copy_in, copy_out, copy_pieces
from .._memory.pool import POOL
from ..devices import Device
from ..stats import Stats
from .timing import CallFit, HostTimer

__all__ = ["HostLink"]


class HostLink:
    """Level-1 in host memory.

    Parameters
    ----------
    split_copies : bool
        Copy states of :data:`~asyncckpt._memory.buffers.SPLIT_COPY_BYTES` or more in two
        halves, one on a helper thread of the link's own (ended by :meth:`close`): a copy of a
        state is bound by one core's memory bandwidth, and the caller waits for every one.
    node : int, optional
        The NUMA node its slots, staging and prefetch buffers are bound to (None: unbound).
    """

    def __init__(self, *, split_copies: bool = False, node: int | None = None) -> None:
        self.device: Device | None = None
        self.node = node
        self._split_copies = split_copies
        self._helper: ThreadPoolExecutor | None = None

    def adapt(self, arrays: Sequence[Any]) -> list[Any]:
        return list(arrays)

    def slot(self, nbytes: int) -> Any:
        """A Level-1 slot for a state of at most ``nbytes`` bytes."""
        return POOL.aligned(nbytes, self.node)

    def slots(self, nbytes: int, count: int) -> list[Any]:
        """``count`` Level-1 slots at once, the fresh ones faulted in on several threads."""
        return POOL.make(nbytes, count, self.node)

    def release(self, buffers: list[Any]) -> None:
        """Let slots and engine buffers go (to the process's pool, for the next checkpointer)."""
        POOL.give(buffers, self.node)

    def staging_buffer(self, nbytes: int) -> np.ndarray:
        """A host buffer a Level-2 write is staged in."""
        return POOL.aligned(nbytes, self.node)

    prefetch_buffer = staging_buffer

    def copy_out(self, arrays: Sequence[Any], slot: Any) -> None:
        """Copy the live ``arrays`` into a Level-1 ``slot``."""
        if not (self._split_copies and self._copy_split(arrays, slot, out=True)):
            copy_out(arrays, slot)

    def copy_in(self, slot: Any, arrays: Sequence[Any]) -> None:
        """Copy a Level-1 ``slot`` into the live ``arrays``."""
        if not (self._split_copies and self._copy_split(arrays, slot, out=False)):
            copy_in(slot, arrays)

    def _copy_split(self, arrays: Sequence[Any], buffer: np.ndarray, out: bool) -> bool:
        """Copy half of a large state on the helper thread, the other half here; False where
        the state is not split (see :func:`~asyncckpt._memory.buffers.copy_halves`)."""
        halves = copy_halves(arrays, buffer, out) if self._split_copies else None
        if halves is None:
            return False
        if self._helper is None:
            self._helper = ThreadPoolExecutor(1, thread_name_prefix="asyncckpt-copy")
        theirs = self._helper.submit(copy_pieces, halves[1])
        try:
            copy_pieces(halves[0])
        finally:
            theirs.result()
        return True

    @staticmethod
    def checksum(view: np.ndarray) -> int:
        """The checksum of a state in a host buffer, as this link's digests compute it."""
        # xxh3 runs at several times the speed of the copy it guards (docs/benchmarks.md)
        return xxhash.xxh3_64_intdigest(view.data)

    def send(self, arrays: Sequence[Any], host: np.ndarray, nbytes: int, digest: bool) -> Any:
        """Start moving the live ``arrays`` (``nbytes``) into the staging buffer ``host``, with
        their checksum where the link computes it (``digest``); return what :meth:`sent` waits
        on."""
        self.copy_out(arrays, host)
        return None

    def sent(self, ticket: Any) -> tuple[float, int | None]:
        """On the I/O thread: wait until ``host`` holds the state; return the link's seconds
        and the checksum it computed (None: the caller computes :meth:`checksum` of ``host``)."""
        return 0.0, None

    def receive(self, host: np.ndarray, nbytes: int, digest: bool) -> tuple[float, int | None]:
        """On the I/O thread, after a Level-2 read into the prefetch buffer ``host``: make it
        ready for :meth:`deliver`; return the link's seconds and, with ``digest``, the checksum
        of the state where it arrived (None: the caller checks ``host``)."""
        return 0.0, None

    def deliver(self, host: np.ndarray, arrays: Sequence[Any]) -> None:
        """Copy a received prefetch buffer into the live ``arrays``."""
        self.copy_in(host, arrays)

    def keep(self, arrays: Sequence[Any], host: np.ndarray) -> None:
        """Put the live ``arrays`` where :meth:`deliver` takes them from (a recomputed state)."""
        self.copy_out(arrays, host)

    def timer(self, stats: Stats, fit: CallFit) -> HostTimer:
        """What times the operators' calls during one sweep."""
        return HostTimer(stats, fit)

    def settle(self) -> None:
        """Wait until the live state is what the calls so far made it."""

    def measure(self, nbytes: int) -> tuple[float, float]:
        """Seconds the link adds to a Level-2 write and a read of ``nbytes`` (host: none)."""
        return 0.0, 0.0

    @property
    def device_bytes(self) -> int:
        """Device memory held by the run's buffers."""
        return 0

    def close(self) -> None:
        """End the helper thread of split copies, if one was started."""
        helper, self._helper = self._helper, None
        if helper is not None:
            helper.shutdown(wait=True)
