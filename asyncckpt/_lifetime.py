"""When a checkpointer closes: at the end of its ``with`` block, when its program calls
``close()``, when the garbage collector finalizes it, or at the interpreter's exit, whichever
comes first."""
from __future__ import annotations

import atexit
import weakref
from contextlib import suppress
from typing import Self

__all__ = ["Closing"]


class Closing:
    """A resource closed once, however its program lets go of it. Subclasses define
    :meth:`close` and :meth:`_without_threads`, and call :meth:`_opened` once made."""

    _closed = True  # until made

    def close(self) -> None:
        raise NotImplementedError

    def _without_threads(self) -> None:
        """From now on, close without starting a thread (see :meth:`__del__`)."""
        raise NotImplementedError

    def _leave(self) -> None:
        """At the interpreter's exit, where :meth:`close` is refused (a call runs on a daemon
        thread, which the exit ends): leave nothing on disk that outlives the process, closing
        nothing that call may still use."""
        raise NotImplementedError

    def _opened(self) -> None:
        self._closed = False
        _OPEN.add(self)

    def __enter__(self) -> Self:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()

    def __del__(self) -> None:
        # The cyclic collector runs finalizers wherever an allocation triggers it, the
        # threading module's own locks held included, and a thread started then waits for them
        # forever (as does any thread started while the interpreter exits).
        if not self._closed:
            with suppress(Exception):  # nothing to report to at interpreter teardown
                self._without_threads()
                self.close()


#: Resources not closed yet. At the interpreter's exit they are closed while threads can still
#: start (a finalizer run later, at teardown, could not give their calls a deadline).
_OPEN: weakref.WeakSet[Closing] = weakref.WeakSet()


@atexit.register
def _close_open() -> None:
    for resource in list(_OPEN):
        try:
            resource.close()
        except Exception:  # noqa: BLE001 - a run under way on another thread refuses close()
            with suppress(Exception):  # nothing to report to at exit
                resource._leave()
