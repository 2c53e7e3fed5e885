"""A checkpointer's calls, one at a time: a call into it while one runs (from an operator, or
from another thread) is refused instead of corrupting the run."""
from __future__ import annotations

import threading
from collections.abc import Iterator
from contextlib import contextmanager

from ..errors import UsageError

__all__ = ["CallGuard"]


class CallGuard:
    """Which of the checkpointer's calls runs now, and on which thread."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._thread: int | None = None
        self._running = ""
        #: set by ``close()``: every later call is refused
        self.closed = False

    @contextmanager
    def running(self, call: str) -> Iterator[None]:
        """Run ``call`` (e.g. ``"apply_forward()"``), unless the checkpointer is closed or
        another call runs."""
        with self._lock:
            if self.closed:
                raise UsageError(f"{call}: the AsyncCheckpointer is closed")
            self._refuse(call)
            self._thread, self._running = threading.get_ident(), call
        try:
            yield
        finally:
            self._thread = None

    def check(self, call: str) -> None:
        """Raise :class:`~asyncckpt.UsageError` if another call runs now."""
        with self._lock:
            self._refuse(call)

    def _refuse(self, call: str) -> None:
        if self._thread is None:
            return
        where = ("from inside an operator" if self._thread == threading.get_ident()
                 else "from another thread")
        raise UsageError(f"{call} {where} while {self._running} runs: a checkpointer runs one "
                         "call at a time; call it after that one returns")
