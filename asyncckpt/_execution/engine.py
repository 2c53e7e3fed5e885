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
from collections.abc import Callable, Sequence
from typing import Any

import numpy as np

from .._memory.buffers import check_size
from ..errors import ScheduleError, TransferError
from ..storage import Storage
from .counters import TransferCounters
from .bounded import ABANDON_S, BoundedCalls, Stalled, stalled
from .engine_buffers import EngineBuffers
from .futures import Completed, DaemonExecutor, Outcome
from .ledger import Ledger, Transfer
from .link import HostLink, Link
from .recovery import Recovery
from .transfers import Transfers

log = logging.getLogger(__name__)

__all__ = ["TransferEngine"]


class TransferEngine:
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

    def __init__(self, storage: Storage, nbytes: int, *, staging_buffers: int,
                 prefetch_buffers: int, io_threads: int, verify: bool, on_error: str = "raise",
                 link: Link | None = None, calls: BoundedCalls | None = None) -> None:
        self.storage, self.nbytes, self.verify = storage, nbytes, verify
        link = self._link = HostLink() if link is None else link
        self.calls = BoundedCalls(storage, 60.0) if calls is None else calls
        #: this run's counts, read by the run's meter
        self.counters = TransferCounters()
        self.recovery = Recovery(on_error, repr(storage), self.counters)
        self._transfers = Transfers(storage, link, verify, self.counters, self.recovery.enabled)
        #: made for each run that uses Level-2 (see :class:`EngineBuffers`)
        buffers = self.buffers = EngineBuffers(link, nbytes, staging_buffers, prefetch_buffers)
        self._free_staging, self._free_prefetch = buffers.free_staging, buffers.free_prefetch
        ledger = self._ledger = Ledger()
        self._writes, self._reads, self._sizes = ledger.writes, ledger.reads, ledger.sizes
        #: checksums of the writes that completed: the replay check's
        self.digests = self._digests = ledger.digests
        # None: every transfer runs inline, through ``calls``
        self._executor = DaemonExecutor(io_threads, "asyncckpt-io") if io_threads else None
        self._broken: BaseException | None = None
        self.last_submit = 0.0  # perf_counter() when the latest write was handed over

    @property
    def buffers_held(self) -> int:
        """Staging and prefetch buffers the engine holds now (free or in use)."""
        return self.buffers.free + len(self._writes) + len(self._reads)

    def _start(self, what: str, key: int, transfer: Callable[..., Any], *args: Any) -> Outcome:
        """Run ``transfer`` (the ``what`` of u_key) on an I/O thread, or inline."""
        if self._executor is None:
            return self.calls.submit(transfer, f"{what} of u_{key}", key, *args)
        return self._executor.submit(transfer, key, *args)

    def _read_now(self, key: int, buffer: np.ndarray, failed: Callable[[Exception], None]
                  ) -> bool:
        """Read u_key into ``buffer`` for the caller (a recovery's read); whether it did. A
        failure the policy survives goes to ``failed``; any other raises."""
        try:
            self.calls.call(f"read of u_{key}", self._transfers.read, key, buffer,
                            self._sizes[key], self._digests.get(key), self._ledger.writing(key))
        except Exception as exc:  # noqa: BLE001 - recompute policy: recompute instead
            if not self.recovery.survives(exc):
                raise self._fail("read", key, exc)
            failed(exc)
            return False
        self.counters.reads += 1
        return True

    def _fail(self, what: str, key: int, exc: BaseException) -> TransferError:
        error = exc if isinstance(exc, Stalled) else TransferError(  # a stall names its call
            f"{what} of u_{key} on Level-2 {self.storage!r} failed: {exc!r}")
        if error is not exc:
            error.__cause__ = exc
        self._broken = error
        return error

    def _await(self, futures: list[Outcome], what: str, key: int) -> None:
        """Wait for ``futures`` (the ``what`` of u_key) at most the deadline, else raise."""
        try:
            self.calls.wait(futures, f"{what} of u_{key}")
        except Stalled as exc:
            raise self._fail(what, key, exc)

    def check(self) -> None:
        """Reap finished writes; raise the first failure on the caller's thread."""
        if self._broken is not None:
            raise TransferError(f"the transfer engine is broken by an earlier failure: "
                                f"{self._broken}") from self._broken
        while self._writes and self._ledger.oldest_write().future.done():
            self._reap_write()

    def _reap_write(self) -> None:
        write = self._writes.pop(self._ledger.oldest_write().key)
        key, future, buffer = write.key, write.future, write.buffer
        exc = future.exception()
        if exc is not None and self.recovery.survives(exc) and not write.doomed:
            exc, buffer = self._write_again(key, buffer, exc)
            if exc is None:
                self._free_staging.append(buffer)
                return
        if exc is not None:
            if not stalled(future):  # a stalled write's thread keeps its buffer
                self._free_staging.append(buffer)
            raise self._fail("write", key, exc)
        digest, replacement = future.result()
        self._free_staging.append(replacement)
        if write.doomed:
            self._delete(key)
        else:
            self._digests[key] = digest

    def _write_again(self, key: int, buffer: np.ndarray,
                     exc: BaseException) -> tuple[BaseException | None, np.ndarray]:
        """After a failed write of u_key (still in its staging buffer), the recovery's say:
        the error to raise, if any, and the buffer to stage into next."""
        staged = [buffer]

        def again() -> None:
            digest, staged[0] = self.calls.call(f"write of u_{key}", self._transfers.rewrite,
                                                key, buffer, self._sizes[key])
            self._digests[key] = digest
        return self.recovery.write_failed(key, exc, again), staged[0]

    def _delete(self, key: int) -> None:
        try:
            self._transfers.delete_within(key, self.calls)
        except Exception as exc:
            if not self.recovery.delete_failed(key, exc):
                raise self._fail("delete", key, exc)

    def store(self, key: int, arrays: Sequence[np.ndarray]) -> None:
        """Copy ``arrays`` (u_key) into a staging buffer and write it in the background."""
        self.check()
        if not self._free_staging and not self._writes:
            raise ScheduleError(f"store of u_{key}: the engine holds no staging buffer (a run "
                                "that uses Level-2 is equipped first)")
        if key in self._writes:
            raise ScheduleError(f"store of u_{key} while its earlier write is under way")
        if not self._free_staging:
            start, oldest = time.perf_counter(), self._ledger.oldest_write()
            self._await([oldest.future], "write", oldest.key)
            self.counters.write_stall_s += time.perf_counter() - start
            self._reap_write()
        buffer = self._free_staging.pop()
        size = sum(a.nbytes for a in arrays)
        start = time.perf_counter()
        ticket = self._link.send(arrays, buffer, size, self._transfers.digests)
        self.counters.copy_s += time.perf_counter() - start
        self.counters.copies += 1
        self._sizes[key] = size
        self.last_submit = time.perf_counter()
        future = self._start("write", key, self._transfers.write, buffer, size, ticket,
                             self._transfers.epoch)
        self._writes[key] = Transfer(key, "write", future, buffer)
        self.counters.stored(size)

    def writing_for(self) -> float | None:
        """Seconds since the latest write was handed over, while it runs (None: none does)."""
        self.check()
        if not self._writes:
            return None
        return time.perf_counter() - self.last_submit

    def staging_free(self) -> bool:
        """Whether a store would find a free staging buffer now (no wait for a write)."""
        self.check()
        return bool(self._free_staging)

    def completed_writes(self) -> tuple[int, float]:
        """The Level-2 writes completed this run and their seconds in all."""
        return self.counters.completed(len(self._writes))

    def stored_before(self, key: int) -> list[int]:
        """The Level-2 states before u_key, newest first (where a lost u_key is rebuilt from)."""
        return sorted((k for k in self._sizes if k < key), reverse=True)

    def prefetch(self, key: int) -> None:
        """Start reading u_key into a free prefetch buffer."""
        self.check()
        if not self._free_prefetch:
            raise ScheduleError(f"prefetch of u_{key}: every prefetch buffer is in use "
                                f"(holding {sorted(self._reads)})")
        buffer = self._free_prefetch.pop()
        future: Outcome
        if key in self.recovery.lost:
            future = Completed(exception=TransferError(f"u_{key} was never written to Level-2"))
        else:
            future = self._start("read", key, self._transfers.read, buffer, self._sizes[key],
                                 self._digests.get(key), self._ledger.writing(key))
            self.counters.reads += 1
            self.counters.bytes_read += self._sizes[key]
        self._reads[key] = Transfer(key, "read", future, buffer)

    def _arrived(self, key: int) -> bool:
        """Wait for u_key's prefetch; whether it holds a good copy (else raise, or count it)."""
        future = self._reads[key].future
        if not future.done():
            start = time.perf_counter()
            self._await([future], "read", key)
            self.counters.read_stall_s += time.perf_counter() - start
        exc = future.exception()
        if exc is None:
            return True
        if not self.recovery.survives(exc):
            raise self._fail("read", key, exc)
        self.recovery.read_failed(key, exc)
        return False

    def load(self, key: int, arrays: Sequence[np.ndarray]) -> bool:
        """Wait for the prefetch of u_key and copy it into ``arrays``.

        Returns False, with ``arrays`` untouched, when u_key is lost (recompute policy): the
        caller then rebuilds it and hands it back with :meth:`recovered`.
        """
        self.check()
        check_size(key, self._sizes[key], arrays, "Level-2")
        if not self._arrived(key):
            return False
        start = time.perf_counter()
        self._link.deliver(self._reads[key].buffer, arrays)
        self.counters.copy_s += time.perf_counter() - start
        self.counters.copies += 1
        return True

    def fetch(self, key: int, arrays: Sequence[np.ndarray], via: int) -> bool:
        """Copy u_key into ``arrays`` for a recomputation: from its prefetch buffer if it has
        one, else by a read now into the prefetch buffer of ``via`` (the state being rebuilt).
        False if u_key is lost too."""
        if key in self._reads:
            if not self._arrived(key):
                return False
            self._link.deliver(self._reads[key].buffer, arrays)
            return True
        if key in self.recovery.lost:
            return False
        buffer = self._reads[via].buffer
        if not self._read_now(key, buffer, lambda exc: self.recovery.read_failed(
                key, exc, f" while recomputing u_{via}")):
            return False  # noted: the caller looks further back
        self._link.deliver(buffer, arrays)
        return True

    def reread(self, key: int, arrays: Sequence[np.ndarray]) -> bool:
        """Read u_key again, now, into its own prefetch buffer and ``arrays``: a transient fault
        (a flipped byte in transit, a short read) needs nothing more. False if it fails again or
        u_key was never written."""
        if key in self._writes:
            # its write failed or is still going: settle every write (a failed one is retried)
            self._await([write.future for write in self._writes.values()], "write", key)
            self.check()
        if key not in self._digests:
            return False
        buffer = self._reads[key].buffer
        if not self._read_now(key, buffer, lambda exc: log.warning(
                "Level-2 read of u_%d on %r failed again (%r)", key, self.storage, exc)):
            return False  # the caller recomputes it
        self.recovery.lost.discard(key)
        self._reads[key].future = Completed()
        self._link.deliver(buffer, arrays)
        return True

    def recovered(self, key: int, arrays: Sequence[np.ndarray]) -> None:
        """Keep the recomputed u_key (``arrays``) in its prefetch buffer, as if it had been read."""
        read = self._reads[key]
        self._link.keep(arrays, read.buffer)
        read.future = Completed()

    def free(self, key: int) -> None:
        """Release u_key's prefetch buffer and delete it from Level-2 (once its write is done)."""
        self.check()
        read = self._reads.pop(key, None)
        if read is not None:
            self._await([read.future], "read", key)  # the buffer is in use until its read ends
            self._free_prefetch.append(read.buffer)
        self.counters.held -= 1
        self._sizes.pop(key, None)
        if key in self._writes:
            self._writes[key].doomed = True
            self._transfers.stale.add(key)  # swept before the next run unless deleted first
        elif key in self.recovery.lost:
            self.recovery.lost.discard(key)
            if key in self._digests:  # written, then unreadable: still on Level-2
                self._digests.pop(key)
                self._delete(key)
        else:
            self._digests.pop(key, None)
            self._delete(key)

    def drain(self) -> None:
        """Wait for every transfer in flight and raise the first failure."""
        for transfer in self._ledger.in_flight():
            self._await([transfer.future], transfer.kind, transfer.key)
        self.check()

    def _in_flight(self) -> list[Outcome]:
        return [transfer.future for transfer in self._ledger.in_flight()]

    def discard(self, until: float | None = None) -> None:
        """Abandon the current run: wait for what is in flight and delete what it wrote until
        ``until`` (default ``ABANDON_S`` from now), then abandon the rest, ignore its failures
        and make the engine usable again, as a fresh one (``buffers.equip()`` and new threads)."""
        until = time.monotonic() + ABANDON_S if until is None else until
        self.calls.settle(self._in_flight(), until)
        if self._executor is not None and any(map(stalled, self._in_flight())):
            self._executor = self._executor.renewed()  # stuck threads serve no later run
        # every key this run may have written: an interrupt can fall between a write and its
        # record; what a stalled write may still write comes later
        written = self._ledger.written()
        in_flight = []
        for write in self._writes.values():
            if stalled(write.future):  # its thread keeps the buffer
                in_flight.append(write.key)
                log.warning("abandoned the Level-2 write of u_%d: still running", write.key)
                continue
            failed = write.future.cancelled() or write.future.exception() is not None
            self._free_staging.append(write.buffer if failed else write.future.result()[1])
        for read in self._reads.values():
            if stalled(read.future):
                log.warning("abandoned the Level-2 read of u_%d: still running", read.key)
            else:
                self._free_prefetch.append(read.buffer)
        self._ledger.clear()
        for table in (self.recovery.lost, self.recovery.causes, self._transfers.staged):
            table.clear()
        self.counters.held = 0
        self._transfers.abandon(written, in_flight, self.calls, until)
        self._broken = None

    def sweep(self) -> None:
        """Before a run: delete what earlier runs left on Level-2 (a state whose delete failed)
        so that it begins as a fresh checkpointer's would."""
        self._transfers.sweep(self.calls)

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
