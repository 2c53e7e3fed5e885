"""What the transfer engine knows of a run's Level-2 states and the transfers under way: one
:class:`Transfer` record per transfer, and a compact table per fact of a state at rest, with the
invariants that tie them to the engine's buffers in one place."""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from .._memory.keytable import KeyTable
from .futures import Outcome

__all__ = ["Ledger", "Transfer"]


@dataclass(slots=True, eq=False)
class Transfer:
    """One Level-2 transfer under way: the write of u_key from a staging buffer, or its read
    into a prefetch buffer (``future``: its outcome). ``doomed``: a write whose state was freed
    before it ended, deleted once it does."""

    key: int
    kind: str  # "write" or "read"
    future: Outcome
    buffer: np.ndarray
    doomed: bool = False


class Ledger:
    """The engine's account of one run.

    Invariants, between the engine's calls:

    - each staging buffer is free or the buffer of one write in :attr:`writes`, each prefetch
      buffer free or that of one read in :attr:`reads` (once a run is abandoned, a stalled
      transfer's thread keeps its buffer);
    - writes are reaped oldest first (:attr:`writes` keeps the order they were handed over);
    - a state on Level-2 has its size in :attr:`sizes` from its store to its free, and its
      checksum in :attr:`digests` once its write has succeeded, unless it was freed first
      (a doomed write, whose key stays stale until its delete);
    - a key may have a write and a read under way at once: the read waits for the write.

    States at rest take a few bytes each in :class:`KeyTable` s (runs of 10^5 states and more);
    only transfers under way, a handful, are Python objects.
    """

    def __init__(self) -> None:
        #: the writes under way by key, oldest first, and the reads into prefetch buffers
        self.writes: dict[int, Transfer] = {}
        self.reads: dict[int, Transfer] = {}
        #: checksums of the writes that completed (8 bytes per state): the replay check's
        self.digests = KeyTable(np.uint64)
        #: bytes of each state on Level-2 (states may be smaller than the largest)
        self.sizes = KeyTable()

    def oldest_write(self) -> Transfer:
        """The write handed over first of those under way."""
        return next(iter(self.writes.values()))

    def writing(self, key: int) -> Outcome | None:
        """The write of u_key while it is under way."""
        write = self.writes.get(key)
        return None if write is None else write.future

    def in_flight(self) -> list[Transfer]:
        """Every transfer under way, writes first."""
        return [*self.writes.values(), *self.reads.values()]

    def written(self) -> list[int]:
        """Every key the run may have written to Level-2."""
        return [*self.digests, *self.sizes, *self.writes]

    def clear(self) -> None:
        """Forget the run (the tables stay the same objects)."""
        for table in (self.writes, self.reads, self.digests, self.sizes):
            table.clear()
