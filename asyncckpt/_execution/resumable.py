"""The transfer engine of a run whose Level-2 states outlive a reverse sweep or the process."""
from __future__ import annotations

import logging
import time

from .bounded import ABANDON_S, stalled
from .engine import TransferEngine
from .level1 import Level1

log = logging.getLogger(__name__)

__all__ = ["ResumableEngine", "unwind_reverse"]


class ResumableEngine(TransferEngine):
    """The transfer engine of a run that outlives its reverse sweep or its process: it takes
    the states an earlier process of the run committed as its own (``run_dir=``), and keeps
    them through a reverse sweep for the next (``keep_forward=True``)."""

    #: whether a reverse sweep's frees keep the states on Level-2 (releasing their buffers)
    keep_states = False

    def restored(self, key: int, size: int, digest: int) -> None:
        """Take u_key (``size`` bytes, checksum ``digest``) as on Level-2: a resumed run's."""
        self._sizes[key], self._digests[key] = size, digest
        self.counters.held += 1

    def free(self, key: int) -> None:
        """Release u_key's prefetch buffer; delete u_key from Level-2 unless states are kept
        (then the next apply_forward's abandoning of the run deletes it)."""
        if not self.keep_states:
            super().free(key)
            return
        self.check()
        read = self._reads.pop(key, None)
        if read is not None:
            self._await([read.future], "read", key)  # the buffer is in use until its read ends
            self._free_prefetch.append(read.buffer)

    def settle_reads(self) -> None:
        """After a reverse sweep that raised: wait for its prefetch reads (at most
        ``ABANDON_S``, their failures ignored) and take their buffers back; the states stay on
        Level-2 for the next reverse sweep. Where every state the forward sweep stored was
        written whole (a checksum for each, no write under way), a failure of the sweep (a
        read's: a transient fault, a stall) no longer breaks the engine: the next sweep reads
        each state again, checked against its checksum, and raises again if the fault stays."""
        reads = dict(self._reads)
        self._reads.clear()  # the ledger's table: its reads are over
        for read in reads.values():
            read.future.cancel()  # one not yet started never runs
        self.calls.settle([read.future for read in reads.values()],
                          time.monotonic() + ABANDON_S)
        if self._executor is not None and any(stalled(r.future) for r in reads.values()):
            self._executor = self._executor.renewed()  # stuck threads serve no later sweep
        for read in reads.values():
            if stalled(read.future):  # its thread keeps the buffer
                log.warning("abandoned the Level-2 read of u_%d: still running", read.key)
            else:
                self._free_prefetch.append(read.buffer)
        if not self._writes and all(key in self._digests for key in self._sizes):
            self._broken = None


def unwind_reverse(engine: TransferEngine, level1: Level1) -> None:
    """After a reverse sweep that raised, with ``keep_forward=True``: its Level-1 slots and
    prefetch buffers back; the forward sweep's states stay on Level-2 for the next."""
    assert isinstance(engine, ResumableEngine)
    engine.settle_reads()
    level1.abandon()
