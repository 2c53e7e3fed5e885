"""The one way the caller's thread calls Level-2 or waits on it: within a deadline.

Every storage call the caller's thread makes (the probe, ``reserve``, ``room_for``, recompute's
retries and rereads, deletes, ``in``, inline transfers, ``close``) runs on a daemon thread of
:class:`BoundedCalls` while the caller waits at most ``transfer_timeout``; every wait for an I/O
thread's transfer has the same deadline. Past it the caller gets :class:`Stalled` (a
:class:`~asyncckpt.TransferError` whose ``__cause__`` is a :class:`TimeoutError`) and the
stalled call's thread is abandoned: it ends when the call returns, if ever, and never keeps the
interpreter from exiting.
"""
from __future__ import annotations

import logging
import sys
import time
from collections.abc import Callable, Iterable
from typing import Any

from ..errors import TransferError
from ..storage import HostMemoryStorage, PinnedMemoryStorage, Storage, TieredStorage
from .futures import Completed, DaemonExecutor, Outcome, wait_awake

__all__ = ["ABANDON_S", "BoundedCalls", "Stalled", "in_own_memory", "stalled"]

log = logging.getLogger(__name__)

#: How long an abandoned run (an interrupt, a failure) waits for its transfers in flight and
#: deletes what it wrote before it abandons them
ABANDON_S = 2.0
#: The Storage calls a checkpointer makes
CALLS = ("put", "adopt", "put_staged", "get", "delete", "__contains__", "reserve", "room_for",
         "close")
#: asyncckpt's own backends whose every call is a copy within this process's memory, and their
#: calls as shipped (a patched method is a backend of someone else's)
_OWN: dict[type[Storage], dict[str, Any]] = {cls: {name: getattr(cls, name) for name in CALLS}
        for cls in (HostMemoryStorage, PinnedMemoryStorage, TieredStorage)}


def in_own_memory(storage: Storage) -> bool:
    """Whether every call of ``storage`` is asyncckpt's own code copying within this process's
    memory (host DRAM, tiers of it): no device that can stall, and a copy cheaper than a thread
    handoff. Any subclass, patched method or other tier is not."""
    shipped = _OWN.get(type(storage))
    if shipped is None or any(getattr(type(storage), name) is not call
                              or name in getattr(storage, "__dict__", {})
                              for name, call in shipped.items()):
        return False
    return type(storage) is not TieredStorage or all(in_own_memory(t) for t in storage.tiers)


class Stalled(TransferError):
    """A Level-2 call or transfer that gave no answer within its deadline (the device is
    stalled); its ``__cause__`` is a :class:`TimeoutError`. Never retried nor recomputed
    around: the call's thread is abandoned."""


class BoundedCalls:
    """Runs the caller's Level-2 calls on a daemon thread (``asyncckpt-call_0``) and waits for
    them, and for the I/O threads' transfers, at most ``deadline_s`` (or until an ``until`` of
    :func:`time.monotonic` that comes first, as :meth:`~asyncckpt.AsyncCheckpointer.close`'s).

    Parameters
    ----------
    storage : Storage
        Level-2 (named in errors). Where it is :func:`in_own_memory` its calls run on the
        caller's thread: nothing there can stall.
    deadline_s : float
        The longest the caller waits for one call (``transfer_timeout``); may be set later.
    """

    def __init__(self, storage: Storage, deadline_s: float) -> None:
        self.storage = storage
        self.deadline_s = deadline_s
        self.inline = in_own_memory(storage)
        self._executor: DaemonExecutor | None = None
        #: threads left to stalled calls
        self.abandoned = 0

    def _seconds(self, until: float | None) -> float:
        if until is None:
            return self.deadline_s
        return min(self.deadline_s, until - time.monotonic())

    def stalled(self, what: str, seconds: float) -> Stalled:
        """The error of ``what`` (e.g. "delete of u_3") not answered within ``seconds``."""
        cause = TimeoutError(f"no answer within {max(seconds, 0.0):g} s (transfer_timeout "
                             f"{self.deadline_s:g} s): the device is stalled")
        error = Stalled(f"{what} on Level-2 {self.storage!r} failed: {cause!r}")
        error.__cause__ = cause
        return error

    def call(self, what: str, fn: Callable[..., Any], /, *args: Any,
             until: float | None = None) -> Any:
        """``fn(*args)`` (the Level-2 call ``what``), within the deadline, else :class:`Stalled`
        (at once where ``until`` has passed)."""
        if self.inline or sys.is_finalizing():
            return fn(*args)
        seconds = self._seconds(until)
        if seconds > 0:
            if self._executor is None:
                self._executor = DaemonExecutor(1, "asyncckpt-call")
            future = self._executor.submit(fn, *args)
            try:
                if wait_awake([future], seconds):
                    return future.result()
            finally:
                # a failure's traceback holds this frame, the future its failure: without the
                # name, no cycle keeps the checkpointer (and its threads) for the collector
                del future
            self._abandon(what, seconds)
        raise self.stalled(what, seconds)

    def _abandon(self, what: str, seconds: float) -> None:
        """Leave the stalled call to its thread, which ends once it returns."""
        assert self._executor is not None
        self._executor.shutdown(timeout=0)
        self._executor = None
        self.abandoned += 1
        log.warning("abandoned the Level-2 %s on %r: still running after %g s", what,
                    self.storage, seconds)

    def submit(self, fn: Callable[..., Any], what: str, /, *args: Any) -> Completed:
        """An inline transfer: :meth:`call`, its outcome as a finished future."""
        try:
            return Completed(self.call(what, fn, *args))
        except Exception as exc:  # carried like a worker thread's failure
            return Completed(exception=exc)

    def wait(self, futures: Iterable[Outcome], what: str, until: float | None = None) -> None:
        """Wait for the transfers ``futures`` (the ``what``), else raise :class:`Stalled`."""
        seconds = self._seconds(until)
        if not wait_awake(futures, max(seconds, 0.0)):
            raise self.stalled(what, seconds)

    def settle(self, futures: Iterable[Outcome], until: float | None = None) -> bool:
        """Wait for ``futures`` as :meth:`wait` does; whether all ended (no error)."""
        return wait_awake(futures, max(self._seconds(until), 0.0))

    def close(self, until: float | None = None) -> None:
        """Stop the thread (idle: a stalled one was abandoned already)."""
        if self._executor is not None:
            self._executor.shutdown(timeout=max(self._seconds(until), 0.0))
            self._executor = None


def stalled(outcome: Outcome) -> bool:
    """Whether a transfer is stalled: still running, or an inline one given up on."""
    return not outcome.done() or (not outcome.cancelled()
                                  and isinstance(outcome.exception(), Stalled))
