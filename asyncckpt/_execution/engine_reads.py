"""The transfer engine's reads: a prefetch reads a Level-2 state into a prefetch buffer ahead of
its load; a lost or corrupted state is read again or handed to the caller to recompute."""
from __future__ import annotations

import logging
import time
from collections.abc import Callable, Sequence

import numpy as np

from .._memory.buffers import check_size
from ..errors import ScheduleError, TransferError
from .engine_writes import EngineWrites
from .futures import Completed
from .ledger import Transfer

log = logging.getLogger(__name__)

__all__ = ["EngineReads"]


class EngineReads(EngineWrites):
    """Prefetches and loads states through the prefetch buffers, and frees them (see
    :class:`~asyncckpt._execution.engine.TransferEngine`)."""

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


    def prefetch(self, key: int) -> None:
        """Start reading u_key into a free prefetch buffer."""
        self.check()
        if not self._free_prefetch:
            raise ScheduleError(f"prefetch of u_{key}: every prefetch buffer is in use "
                                f"(holding {sorted(self._reads)})")
        buffer = self._free_prefetch.pop()
        if key in self.recovery.lost:
            self._reads[key] = Transfer(key, "read", Completed(exception=TransferError(
                f"u_{key} was never written to Level-2")), buffer)
            return
        size = self._sizes[key]
        write = self._writes.get(key)
        self._start(self._reads, "read", key, buffer, self._transfers.read, buffer, size,
                    self._digests.get(key), None if write is None else write.future)
        self.counters.reads += 1
        self.counters.bytes_read += size


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


    def load(self, key: int, arrays: Sequence[np.ndarray], nbytes: int | None = None) -> bool:
        """Wait for the prefetch of u_key and copy it into ``arrays`` (``nbytes`` in all where
        the caller knows).

        Returns False, with ``arrays`` untouched, when u_key is lost (recompute policy): the
        caller then rebuilds it and hands it back with :meth:`recovered`.
        """
        self.check()
        stored = self._sizes[key]
        if nbytes != stored:
            check_size(key, stored, arrays, "Level-2")
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
        """Release u_key's prefetch buffer and delete it from Level-2 (once its write is done).
        Its records go only once it is deleted, or marked stale: an interrupt anywhere here
        leaves it where :meth:`discard` finds it."""
        self.check()
        read = self._reads.pop(key, None)
        if read is not None:
            if not read.future.done():  # the buffer is in use until its read ends
                self._await([read.future], "read", key)
            self._free_prefetch.append(read.buffer)
        self.counters.held -= 1
        if key in self._writes:
            self._transfers.stale.add(key)  # swept before the next run unless deleted first
            self._writes[key].doomed = True
        elif key not in self.recovery.lost or key in self._digests:  # lost: written, unreadable
            self._delete(key)
        self.recovery.lost.discard(key)
        self._digests.pop(key, None)
        self._sizes.pop(key, None)
