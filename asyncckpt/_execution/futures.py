"""What the transfer engine waits on: futures of transfers run inline, an executor that runs them
so, and a wait that stays awake for signals."""
from __future__ import annotations

from collections.abc import Callable, Iterable
from concurrent.futures import Future, wait
from typing import Any, Protocol

__all__ = ["Completed", "InlineExecutor", "Outcome", "WAKE_S", "wait_awake"]


class Outcome(Protocol):
    """The read side of a future that the engine uses (a :class:`~concurrent.futures.Future`,
    or a :class:`Completed` one)."""

    def done(self) -> bool: ...

    def cancelled(self) -> bool: ...

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

    def exception(self) -> BaseException | None:
        return self._exception

    def result(self) -> Any:
        if self._exception is not None:
            raise self._exception
        return self._result


class InlineExecutor:
    """The ``submit``/``shutdown`` of an executor, running each call at once on the caller's
    thread, so the engine's logic is the same in both modes."""

    def submit(self, fn: Callable[..., Any], /, *args: Any) -> Completed:
        try:
            return Completed(fn(*args))
        except Exception as exc:  # carried like a worker thread's failure
            return Completed(exception=exc)

    def shutdown(self, wait: bool = True, *, cancel_futures: bool = False) -> None:
        """Nothing runs in the background: nothing to stop."""


#: Longest the caller's thread sleeps in one wait for a transfer. A signal (Ctrl-C) that the
#: kernel delivers to another thread, an I/O thread say, runs its Python handler only once the
#: main thread wakes: an unbounded wait on a stalled device would never see it.
WAKE_S = 0.05


def wait_awake(futures: Iterable[Outcome]) -> None:
    """``concurrent.futures.wait`` for the futures not yet done, waking every :data:`WAKE_S`."""
    # an inline transfer's outcome is done by construction: only threads' futures are waited on
    pending = [f for f in futures if isinstance(f, Future) and not f.done()]
    while pending:
        pending = list(wait(pending, timeout=WAKE_S).not_done)
