"""What the transfer engine waits on: futures of transfers run inline, daemon worker threads,
and a wait that stays awake for signals."""
from __future__ import annotations

import queue
import threading
import time
from collections.abc import Callable, Iterable
from concurrent.futures import Future, wait
from typing import Any, Protocol

__all__ = ["Completed", "DaemonExecutor", "Outcome", "WAKE_S", "wait_awake"]


class Outcome(Protocol):
    """The read side of a future that the engine uses (a :class:`~concurrent.futures.Future`,
    or a :class:`Completed` one)."""

    def done(self) -> bool: ...

    def cancelled(self) -> bool: ...

    def cancel(self) -> bool: ...

    def exception(self) -> BaseException | None: ...

    def result(self) -> Any: ...


class Completed:
    """A finished future's read side (``done``, ``cancelled``, ``result``, ``exception``): what
    the engine reads of a transfer that ran inline, without a condition variable per call."""

    __slots__ = ("_result", "_exception")

    def __init__(self, result: object = None, exception: BaseException | None = None) -> None:
        self._result, self._exception = result, exception

    def done(self) -> bool:
        return True

    def cancelled(self) -> bool:
        return False

    def cancel(self) -> bool:
        return False  # it has run

    def exception(self) -> BaseException | None:
        return self._exception

    def result(self) -> Any:
        if self._exception is not None:
            raise self._exception
        return self._result


#: Longest the caller's thread sleeps in one wait for a transfer. A signal (Ctrl-C) that the
#: kernel delivers to another thread, an I/O thread say, runs its Python handler only once the
#: main thread wakes: an unbounded wait on a stalled device would never see it.
WAKE_S = 0.05


def wait_awake(futures: Iterable[Outcome], timeout: float | None = None) -> bool:
    """``concurrent.futures.wait`` for the futures not yet done, waking every :data:`WAKE_S`;
    whether all are done (False once ``timeout`` seconds have passed first)."""
    # an inline transfer's outcome is done by construction: only threads' futures are waited on
    pending = [f for f in futures if isinstance(f, Future) and not f.done()]
    deadline = None if timeout is None else time.monotonic() + timeout
    while pending:
        step = WAKE_S if deadline is None else min(WAKE_S, deadline - time.monotonic())
        if step <= 0:
            return False
        pending = list(wait(pending, timeout=step).not_done)
    return True


class DaemonExecutor:
    """``submit``/``shutdown`` on worker threads (named ``{prefix}_{i}``) that never keep the
    interpreter from exiting: a Level-2 call that never returns leaves its thread behind, not
    the process. The threads hold no reference to the executor, and stop at a sentinel."""

    def __init__(self, workers: int, prefix: str) -> None:
        self.workers, self.prefix = workers, prefix
        self._queue: queue.SimpleQueue[tuple[Future[Any], Callable[..., Any], tuple[Any, ...]]
                                       | None] = queue.SimpleQueue()
        self._threads = [threading.Thread(target=_work, args=(self._queue,),
                                          name=f"{prefix}_{i}", daemon=True)
                         for i in range(workers)]
        self._started = False

    def submit(self, fn: Callable[..., Any], /, *args: Any) -> Future[Any]:
        future: Future[Any] = Future()
        self.start(future, fn, *args)
        return future

    def start(self, future: Future[Any], fn: Callable[..., Any], /, *args: Any) -> None:
        """Run ``fn(*args)`` on a worker, its outcome set on ``future`` (made, and recorded,
        by the caller before: one cancelled first never runs)."""
        if not self._started:
            self._started = True
            for thread in self._threads:
                thread.start()
        self._queue.put((future, fn, args))

    def renewed(self) -> "DaemonExecutor":
        """A fresh executor of as many threads, this one's left to what they run (a stalled
        call's thread serves no later work: it ends when the call returns, if ever)."""
        self.shutdown(timeout=0)
        return DaemonExecutor(self.workers, self.prefix)

    def shutdown(self, timeout: float | None = None) -> list[str]:
        """Stop the threads once the work queued before is done, waiting at most ``timeout``
        seconds for them all; return the names of those still running (abandoned)."""
        if not self._started:
            return []
        for _ in self._threads:
            self._queue.put(None)
        end = None if timeout is None else time.monotonic() + timeout
        for thread in self._threads:
            thread.join(None if end is None else max(0.0, end - time.monotonic()))
        return [thread.name for thread in self._threads if thread.is_alive()]


def _work(jobs: "queue.SimpleQueue[Any]") -> None:
    while (job := jobs.get()) is not None:
        future, fn, args = job
        if not future.set_running_or_notify_cancel():
            continue
        try:
            future.set_result(fn(*args))
        except BaseException as exc:  # carried to the caller's thread by the future
            future.set_exception(exc)
        del job, future, fn, args  # a finished job holds no buffer while the thread waits
