"""The ``ASYNCCKPT_*`` environment variables, read in this module alone: once per construction
of a checkpointer (or of a ``compat.Revolver``, whose checkpointer is built later), as one
frozen :class:`Environment` that its runs then use, so that a variable changed between the
construction and a run changes nothing."""
from __future__ import annotations

import os
from collections.abc import Iterator
from contextlib import contextmanager
from contextvars import ContextVar
from dataclasses import dataclass
from typing import Any

from ..compression import parse_compression
from .values import parse_bytes, parse_flag, parse_interval

__all__ = ["VARIABLES", "Environment", "environment"]

#: Every variable asyncckpt reads, in the order of :class:`Environment`'s fields
VARIABLES = ("ASYNCCKPT_TAPING", "ASYNCCKPT_MEMORY_BUDGET", "ASYNCCKPT_STORAGE",
             "ASYNCCKPT_INTERVAL", "ASYNCCKPT_COMPRESSION")

_PINNED: ContextVar[Environment | None] = ContextVar("asyncckpt_environment", default=None)


def environment(name: str) -> str | None:
    """``$name`` stripped, or None where it is unset or empty."""
    value = os.environ.get(name, "").strip()
    return value or None


@dataclass(frozen=True)
class Environment:
    """The text of each ``ASYNCCKPT_*`` variable as :meth:`read` found it (None: unset or
    empty); its properties parse it, with errors that name the variable.

    Raises
    ------
    InvalidValueError
        From a property whose variable does not parse, naming it and the accepted values.
    """

    taping_text: str | None = None
    memory_budget_text: str | None = None
    #: ``$ASYNCCKPT_STORAGE``: where Level-2 goes ("dram" or a directory), as given
    storage: str | None = None
    interval_text: str | None = None
    compression_text: str | None = None

    @classmethod
    def read(cls) -> Environment:
        """The variables as they are now; within :meth:`pinned`, the pinned value."""
        pinned = _PINNED.get()
        if pinned is not None:
            return pinned
        return cls(*(environment(name) for name in VARIABLES))

    @contextmanager
    def pinned(self) -> Iterator[Environment]:
        """Within the block (in this thread or task), :meth:`read` returns this value: a
        construction that reads the environment again reads what it held back then."""
        token = _PINNED.set(self)
        try:
            yield self
        finally:
            _PINNED.reset(token)

    def check(self) -> Environment:
        """This value, once every variable set parses (else raise naming the first bad one)."""
        for name in ("taping", "memory_budget", "interval", "compression"):
            getattr(self, name)
        return self

    @property
    def taping(self) -> bool | None:
        """``$ASYNCCKPT_TAPING`` as a bool (1/0, true/false, yes/no, on/off), or None."""
        text = self.taping_text
        return None if text is None else parse_flag("ASYNCCKPT_TAPING", text)

    @property
    def memory_budget(self) -> int | None:
        """``$ASYNCCKPT_MEMORY_BUDGET`` in bytes ("4GiB", "512MB", an int), or None."""
        text = self.memory_budget_text
        return None if text is None else parse_bytes("ASYNCCKPT_MEMORY_BUDGET", text)

    @property
    def interval(self) -> int | str | None:
        """``$ASYNCCKPT_INTERVAL``: an int >= 0, "auto" or "adaptive", or None."""
        text = self.interval_text
        return (None if text is None
                else parse_interval(text, name="ASYNCCKPT_INTERVAL", adaptive=True))

    @property
    def compression(self) -> dict[str, Any] | str | None:
        """``$ASYNCCKPT_COMPRESSION`` as a spec (see
        :func:`~asyncckpt.compression.parse_compression`), or None."""
        text = self.compression_text
        return None if text is None else parse_compression("ASYNCCKPT_COMPRESSION", text)
