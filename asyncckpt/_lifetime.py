"""When a checkpointer closes: at the end of its ``with`` block, when its program calls
``close()``, when the garbage collector finalizes it, or at the interpreter's exit, whichever
comes first.

A finalizer does no work that waits. The cyclic collector runs finalizers wherever an
allocation triggers it, on whatever thread, while that thread holds any lock (the memory
pool's, a storage's, the threading module's own), so a ``close()`` run there may wait forever
for a lock its own thread holds. ``__del__`` only hands the resource to the reaper, a daemon
thread that closes it like any other caller; the hand-over is a :class:`queue.SimpleQueue`,
whose ``put`` takes no lock a finalizer could be interrupting.
"""
from __future__ import annotations

import atexit
import logging
import os
import queue
import threading
import weakref
from contextlib import suppress
from typing import Protocol, Self

__all__ = ["Closing", "reap", "start_reaper"]

log = logging.getLogger("asyncckpt")


class Closable(Protocol):
    def close(self) -> None: ...


class Closing:
    """A resource closed once, however its program lets go of it. Subclasses define
    :meth:`close` and :meth:`_leave`, and call :meth:`_opened` once made."""

    _closed = True  # until made

    def close(self) -> None:
        raise NotImplementedError

    def _leave(self) -> None:
        """At the interpreter's exit, where :meth:`close` is refused (a call runs on a daemon
        thread, which the exit ends): leave nothing on disk that outlives the process, closing
        nothing that call may still use."""
        raise NotImplementedError

    def _opened(self) -> None:
        self._closed = False
        _OPEN.add(self)
        start_reaper()

    def __enter__(self) -> Self:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()

    def __del__(self) -> None:
        if not self._closed:
            reap(self)


def start_reaper() -> None:
    """Start the reaper, where this process has none yet (from a constructor: a finalizer
    must not start a thread)."""
    _REAPER.start()


def reap(resource: Closable) -> None:
    """Have the reaper close ``resource``; safe in a finalizer (it takes no lock and starts
    no thread). The resource lives on until the reaper has closed it."""
    _REAPER.queue.put(resource)


class _Reaper:
    """The daemon thread that closes what finalizers hand it, started by the first resource
    opened in a process (never by a finalizer)."""

    def __init__(self) -> None:
        self.queue: queue.SimpleQueue[Closable] = queue.SimpleQueue()
        self._thread: threading.Thread | None = None
        self._starting = threading.Lock()  # taken by constructors only, never by a finalizer

    def start(self) -> None:
        if self._thread is not None and self._thread.is_alive():
            return
        with self._starting:
            if self._thread is None or not self._thread.is_alive():
                self._thread = threading.Thread(target=self._run, name="asyncckpt-reaper",
                                                daemon=True)
                self._thread.start()

    def _run(self) -> None:
        while True:
            close(self.queue.get())

    def close_queued(self) -> None:
        """Close on this thread what is still queued (at the interpreter's exit)."""
        while True:
            try:
                resource = self.queue.get_nowait()
            except queue.Empty:
                return
            close(resource)

    def after_fork_in_child(self) -> None:
        # the parent's thread is not in the child, and its queue may have been mid-put
        self.queue, self._thread = queue.SimpleQueue(), None
        self._starting = threading.Lock()


def close(resource: Closable) -> None:
    """Close ``resource``, logging what it raises: a finalized resource has no caller to
    raise to."""
    try:
        resource.close()
    except Exception:  # noqa: BLE001 - nobody to report to but the log
        log.warning("closing %r, which its program left to the garbage collector, failed",
                    resource, exc_info=True)
        if isinstance(resource, Closing):
            with suppress(Exception):
                resource._leave()


_REAPER = _Reaper()
os.register_at_fork(after_in_child=_REAPER.after_fork_in_child)

#: Resources not closed yet. At the interpreter's exit they are closed while threads can still
#: start (a finalizer run later, at teardown, could not give their calls a deadline).
_OPEN: weakref.WeakSet[Closing] = weakref.WeakSet()


@atexit.register
def _close_open() -> None:
    _REAPER.close_queued()
    for resource in list(_OPEN):
        try:
            resource.close()
        except Exception:  # noqa: BLE001 - a run under way on another thread refuses close()
            with suppress(Exception):  # nothing to report to at exit
                resource._leave()
