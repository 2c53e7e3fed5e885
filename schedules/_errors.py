"""The base of asyncckpt's errors, and the errors schedules raise.

They live here, beside the schedules that cannot import the runtime, so that one
``except CheckpointError`` catches every error of both packages. Each concrete error also derives
from the built-in exception a caller would catch without knowing asyncckpt (ValueError,
TypeError, KeyError, RuntimeError), so code written against those keeps working.
"""
from __future__ import annotations

__all__ = ["CheckpointError", "InvalidTypeError", "InvalidValueError", "ScheduleError"]

# Tracebacks show a class's __module__: these are shown under the public module that exports
# them to users (asyncckpt.errors, in the same distribution), not this private one.
_SHOWN_AS = "asyncckpt.errors"


class CheckpointError(Exception):
    """Base of the errors of asyncckpt and its schedules."""

    __module__ = _SHOWN_AS


class InvalidValueError(CheckpointError, ValueError):
    """An argument, an option or an environment variable has a value outside what is accepted:
    the message names it, the value and what was expected."""

    __module__ = _SHOWN_AS


class InvalidTypeError(CheckpointError, TypeError):
    """An argument has the wrong type, or an object lacks the methods the protocol needs: the
    message names it and what was expected."""

    __module__ = _SHOWN_AS


class ScheduleError(CheckpointError, ValueError):
    """A schedule breaks an invariant: the message names the action and the invariant."""

    __module__ = _SHOWN_AS
