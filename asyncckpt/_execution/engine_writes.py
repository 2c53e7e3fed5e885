"""The transfer engine's writes: a store copies a state into a staging buffer and writes it to
Level-2 in the background; finished writes are reaped, a failed one retried where the recovery
policy says so."""
from __future__ import annotations

import time
from collections.abc import Sequence

import numpy as np

from ..errors import ScheduleError, TransferError
from .bounded import stalled
from .engine_core import EngineCore

__all__ = ["EngineWrites"]


class EngineWrites(EngineCore):
    """Stores states through the staging buffers and reaps their writes (see
    :class:`~asyncckpt._execution.engine.TransferEngine`)."""

    def check(self) -> None:
        """Reap finished writes; raise the first failure on the caller's thread."""
        if self._broken is not None:
            raise TransferError(f"the transfer engine is broken by an earlier failure: "
                                f"{self._broken}") from self._broken
        while self._writes and self._ledger.oldest_write().future.done():
            self._reap_write()


    def _reap_write(self) -> None:
        write = self._writes.pop(next(iter(self._writes)))  # the oldest
        key = write.key
        future = write.future
        buffer = write.buffer
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


    def store(self, key: int, arrays: Sequence[np.ndarray], nbytes: int | None = None) -> None:
        """Copy ``arrays`` (u_key, ``nbytes`` in all where the caller knows) into a staging
        buffer and write it in the background."""
        self.check()
        if not self._free_staging and not self._writes:
            raise ScheduleError(f"store of u_{key}: the engine holds no staging buffer (a run "
                                "that uses Level-2 is equipped first)")
        if key in self._writes:
            raise ScheduleError(f"store of u_{key} while its earlier write is under way")
        if not self._free_staging:
            start = time.perf_counter()
            oldest = self._ledger.oldest_write()
            self._await([oldest.future], "write", oldest.key)
            self.counters.write_stall_s += time.perf_counter() - start
            self._reap_write()
        buffer = self._free_staging.pop()
        size = sum([a.nbytes for a in arrays]) if nbytes is None else nbytes
        counters = self.counters
        start = time.perf_counter()
        ticket = self._link.send(arrays, buffer, size, self._transfers.digests)
        self.last_submit = submit = time.perf_counter()
        counters.copy_s += submit - start
        counters.copies += 1
        self._sizes[key] = size
        self._start(self._writes, "write", key, buffer, self._transfers.write, buffer, size,
                    ticket, self._transfers.epoch)
        counters.stored(size)


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
