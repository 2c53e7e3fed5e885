"""The transfer engine: Level-1 staging and prefetch buffers, moved to and from Level-2 on named
worker threads.

The main thread pays one memory copy per store and waits for a write only when every staging
buffer is in flight, never past a deadline. Futures carry each transfer's result or exception
back: under "raise" the first failure breaks the engine and is raised, chained, on the main
thread at its next call; under "recompute" a failed write is retried once and a lost state is
reported by :meth:`TransferEngine.load` for the caller to rebuild.
"""
from __future__ import annotations

import logging
import time

from .bounded import ABANDON_S, stalled
from .engine_reads import EngineReads

log = logging.getLogger(__name__)

__all__ = ["TransferEngine"]


class TransferEngine(EngineReads):
    """Moves states between Level-1 buffers and a Level-2 :class:`Storage`.

    Parameters
    ----------
    storage : Storage
        The Level-2 backend.
    nbytes : int
        Bytes in one state.
    staging_buffers, prefetch_buffers : int
        Writes in flight before a store waits; Level-2 states held in Level-1 at once.
    io_threads : int
        Worker threads (``asyncckpt-io_N``); 0 runs every transfer inline, through ``calls``
        (faster where a transfer costs less than waking a thread).
    verify : bool
        Check every read against the checksum taken at write time.
    on_error : {"raise", "recompute"}
        A failed or corrupted transfer raises on the caller's thread, or its state is lost and
        the caller recomputes it (see :meth:`load`).
    link : Link
        How states go from Level-1 to the staging buffers and from the prefetch buffers back
        (host copies, or a device's streams); it makes those buffers.
    calls : BoundedCalls, optional
        The caller's Level-2 calls and waits, each within the deadline (default 60 s), else a
        :class:`~asyncckpt.TransferError` whatever ``on_error`` says.

    Notes
    -----
    What it knows of the run's states and transfers, and the invariants that hold between its
    calls, are in one place: :class:`~asyncckpt._execution.ledger.Ledger`.
    """

    def drain(self) -> None:
        """Wait for every transfer in flight and raise the first failure."""
        for transfer in self._ledger.in_flight():
            self._await([transfer.future], transfer.kind, transfer.key)
        self.check()


    def discard(self, until: float | None = None) -> None:
        """Abandon the current run: wait for what is in flight and delete what it wrote until
        ``until`` (default ``ABANDON_S`` from now), then abandon the rest, ignore its failures
        and make the engine usable again, as a fresh one (``buffers.equip()`` and new threads).

        An interrupt anywhere in it leaves the engine for the next call to discard again: every
        key the run may have written is marked stale before any record of it goes, and each
        transfer's record goes before its buffer is freed (a buffer may be lost, then made
        again, but never freed twice)."""
        until = time.monotonic() + ABANDON_S if until is None else until
        for transfer in self._ledger.in_flight():
            transfer.future.cancel()  # one not yet started never runs
        self.calls.settle(self._in_flight(), until)
        if self._executor is not None and any(map(stalled, self._in_flight())):
            self._executor = self._executor.renewed()  # stuck threads serve no later run
        in_flight = [write.key for write in self._writes.values() if stalled(write.future)]
        self._transfers.abandon(self._ledger.written(), in_flight)
        while self._writes:
            write = self._writes.popitem()[1]
            if stalled(write.future):  # its thread keeps the buffer
                log.warning("abandoned the Level-2 write of u_%d: still running", write.key)
            elif write.future.cancelled() or write.future.exception() is not None:
                self._free_staging.append(write.buffer)
            else:
                self._free_staging.append(write.future.result()[1])
        while self._reads:
            read = self._reads.popitem()[1]
            if stalled(read.future):
                log.warning("abandoned the Level-2 read of u_%d: still running", read.key)
            else:
                self._free_prefetch.append(read.buffer)
        self._ledger.clear()
        for table in (self.recovery.lost, self.recovery.causes, self._transfers.staged):
            table.clear()
        self.counters.held = 0
        self._transfers.sweep(self.calls, until)
        self._broken = None


    def sweep(self) -> None:
        """Before a run: delete what earlier runs left on Level-2 (a state whose delete failed)
        so that it begins as a fresh checkpointer's would.

        Raises
        ------
        Stalled
            If a delete stalled: the device is, and the run would wait on it again.
        """
        stall = self._transfers.sweep(self.calls)
        if stall is not None:
            raise stall


    def close(self, until: float | None = None) -> None:
        """Stop the worker threads after the transfers in flight (waiting at most the deadline or
        until ``until``, then abandoning them, logged) and give the idle staging and prefetch
        buffers to the process's pool; safe to call twice."""
        self.calls.settle(self._in_flight(), until)
        if self._executor is not None:
            left = self.calls.deadline_s if until is None else until - time.monotonic()
            stuck = self._executor.shutdown(timeout=max(0.0, left))
            if stuck:
                log.warning("abandoned the Level-2 threads %s of %r: a transfer never "
                            "returned", ", ".join(stuck), self.storage)
        self.calls.close(until)
        if not self._writes and not self._reads:
            self.buffers.release()
