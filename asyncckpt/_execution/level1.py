"""The Level-1 slots of a run."""
from __future__ import annotations

import time
from collections.abc import Sequence

import numpy as np

from .._memory.buffers import check_size
from .host_link import HostLink
from .link import Link

__all__ = ["Level1"]


class Level1:
    """The Level-1 slots: buffers made by the ``link`` when first used (never per step; on the
    host page-aligned and drawn from the process pool, on a device in its memory), each holding
    one state by its step."""

    def __init__(self, nbytes: int, link: Link | None = None) -> None:
        self.nbytes = nbytes
        self.link: Link = HostLink() if link is None else link
        self.held: dict[int, np.ndarray] = {}
        self.sizes: dict[int, int] = {}  # bytes of each held state (at most ``nbytes``)
        self._free: list[np.ndarray] = []
        self.copies = 0
        self.copy_s = 0.0

    def take(self) -> np.ndarray:
        """A free slot: a released one, one a closed checkpointer left in the pool, or new."""
        return self._free.pop() if self._free else self.link.slot(self.nbytes)

    def give(self, slot: np.ndarray) -> None:
        self._free.append(slot)

    def reserve(self, count: int) -> None:
        """Make slots now, up to ``count`` made in all, for a run that will hold that many at
        once: on the host the fresh ones fault in on several threads together instead of one
        by one inside the sweep."""
        if count > self.made:
            self._free.extend(self.link.slots(self.nbytes, count - self.made))

    def shed(self, count: int) -> None:
        """Let free slots go (on the host, to the process pool) until at most ``count`` are
        made: a run with fewer slots leaves the budget's bytes to the engine and Level-2."""
        surplus = max(0, min(len(self._free), self.made - count))
        if surplus:
            # out of the free list first: an interrupt between the two loses a slot, never
            # lets the pool hand out one still listed here
            shed = self._free[-surplus:]
            del self._free[-surplus:]
            self.link.release(shed)

    @property
    def made(self) -> int:
        """Slots made so far (held and free): what a run reuses without new memory."""
        return len(self._free) + len(self.held)

    def store(self, step: int, arrays: Sequence[np.ndarray], nbytes: int) -> None:
        """Copy u_step from ``arrays``, which hold ``nbytes`` bytes, into a slot."""
        slot = self.take()
        start = time.perf_counter()
        self.link.copy_out(arrays, slot)
        self.copy_s += time.perf_counter() - start
        self.copies += 1
        self.held[step] = slot
        self.sizes[step] = nbytes

    def load(self, step: int, arrays: Sequence[np.ndarray], nbytes: int) -> None:
        """Copy u_step into ``arrays``, which hold ``nbytes`` bytes."""
        if nbytes != self.sizes[step]:
            check_size(step, self.sizes[step], arrays, "Level-1")
        start = time.perf_counter()
        self.link.copy_in(self.held[step], arrays)
        self.copy_s += time.perf_counter() - start
        self.copies += 1

    def free(self, step: int) -> None:
        self._free.append(self.held.pop(step))
        del self.sizes[step]

    def abandon(self) -> None:
        """Free every held slot (a run was cut short)."""
        self._free.extend(self.held.values())
        self.held.clear()
        self.sizes.clear()

    def release(self) -> None:
        """Let every slot go (on the host, to the process pool)."""
        self.abandon()
        self.link.release(self._free)
        self._free = []
