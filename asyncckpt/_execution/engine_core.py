"""The transfer engine's state and how it starts, awaits and fails a transfer: the parts that
:mod:`~asyncckpt._execution.engine_writes` and :mod:`~asyncckpt._execution.engine_reads` share
(see :class:`~asyncckpt._execution.engine.TransferEngine`)."""
from __future__ import annotations

from collections.abc import Callable
from concurrent.futures import Future
from typing import Any

import numpy as np

from ..errors import TransferError
from ..storage import Storage
from .counters import TransferCounters
from .bounded import BoundedCalls, Stalled
from .engine_buffers import EngineBuffers
from .futures import Completed, DaemonExecutor, Outcome
from .ledger import Ledger, Transfer
from .link import HostLink, Link
from .recovery import Recovery
from .transfers import Transfers

__all__ = ["EngineCore"]


class EngineCore:
    """The state of a :class:`~asyncckpt._execution.engine.TransferEngine` (its parameters are
    documented there) and the steps every transfer takes: started on an I/O thread or inline,
    awaited within the deadline, its failure breaking the engine."""

    def __init__(self, storage: Storage, nbytes: int, *, staging_buffers: int,
                 prefetch_buffers: int, io_threads: int, verify: bool, on_error: str = "raise",
                 link: Link | None = None, calls: BoundedCalls | None = None) -> None:
        self.storage = storage
        self.nbytes = nbytes
        self.verify = verify
        if link is None:
            link = HostLink()
        self._link = link
        self.calls = BoundedCalls(storage, 60.0) if calls is None else calls
        #: this run's counts, read by the run's meter
        self.counters = TransferCounters()
        self.recovery = Recovery(on_error, repr(storage), self.counters)
        self._transfers = Transfers(storage, link, verify, self.counters, self.recovery.enabled)
        #: made for each run that uses Level-2 (see :class:`EngineBuffers`)
        self.buffers = EngineBuffers(link, nbytes, staging_buffers, prefetch_buffers)
        self._free_staging = self.buffers.free_staging
        self._free_prefetch = self.buffers.free_prefetch
        self._ledger = Ledger()
        self._writes = self._ledger.writes
        self._reads = self._ledger.reads
        self._sizes = self._ledger.sizes
        self._digests = self._ledger.digests
        #: checksums of the writes that completed: the replay check's
        self.digests = self._digests
        # None: every transfer runs inline, through ``calls``
        self._executor = DaemonExecutor(io_threads, "asyncckpt-io") if io_threads else None
        self._broken: BaseException | None = None
        self.last_submit = 0.0  # perf_counter() when the latest write was handed over

    @property
    def buffers_held(self) -> int:
        """Staging and prefetch buffers the engine holds now (free or in use)."""
        return self.buffers.free + len(self._writes) + len(self._reads)


    def _start(self, table: dict[int, Transfer], kind: str, key: int, buffer: np.ndarray,
               transfer: Callable[..., Any], *args: Any) -> None:
        """Run ``transfer`` (the ``kind`` of u_key, from or into ``buffer``) on an I/O thread,
        recorded in ``table`` first: an interrupt between the two leaves a record whose transfer
        never starts (:meth:`discard` cancels it), never a transfer no record names, whose key
        nothing would wait for before deleting it. Inline, the call has ended when it is
        recorded; one an interrupt cuts short goes on on the thread of ``calls``, ahead of
        every later call there, the delete of its key (recorded in the sizes) included."""
        if self._executor is None:
            if self.calls.inline:  # own memory: nothing can stall, so no call is named
                try:
                    outcome = Completed(transfer(key, *args))
                except Exception as exc:  # carried like a worker thread's failure
                    outcome = Completed(exception=exc)
            else:
                outcome = self.calls.submit(transfer, f"{kind} of u_{key}", key, *args)
            table[key] = Transfer(key, kind, outcome, buffer)
            return
        future: Future[Any] = Future()
        table[key] = Transfer(key, kind, future, buffer)
        self._executor.start(future, transfer, key, *args)


    def _fail(self, what: str, key: int, exc: BaseException) -> TransferError:
        error = exc if isinstance(exc, Stalled) else TransferError(  # a stall names its call
            f"{what} of u_{key} on Level-2 {self.storage!r} failed: {exc!r}")
        if error is not exc:
            error.__cause__ = exc
        self._broken = error
        return error


    def _await(self, futures: list[Outcome], what: str, key: int) -> None:
        """Wait for ``futures`` (the ``what`` of u_key) at most the deadline, else raise."""
        if all(future.done() for future in futures):  # inline transfers: named only if waited on
            return
        try:
            self.calls.wait(futures, f"{what} of u_{key}")
        except Stalled as exc:
            raise self._fail(what, key, exc)


    def _delete(self, key: int) -> None:
        try:
            self._transfers.delete_within(key, self.calls)
        except Exception as exc:
            if not self.recovery.delete_failed(key, exc):
                raise self._fail("delete", key, exc)


    def _in_flight(self) -> list[Outcome]:
        return [transfer.future for transfer in self._ledger.in_flight()]
