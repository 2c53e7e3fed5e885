"""Checks of integer and flag arguments, shared by the schedules and the runtime."""
from __future__ import annotations

import numbers

from ._errors import InvalidTypeError, InvalidValueError

__all__ = ["check_bool", "check_int"]


def check_int(name: str, value: object, minimum: int, maximum: int | None = None) -> int:
    """Return ``value`` as an int, or raise naming ``name``, the value and the accepted range.

    Raises
    ------
    TypeError
        If ``value`` is not an integer (bools are refused too).
    ValueError
        If ``value`` is below ``minimum`` or above ``maximum``.
    """
    if isinstance(value, bool) or not isinstance(value, numbers.Integral):
        raise InvalidTypeError(f"{name} must be an int, got {value!r} of type {type(value).__name__}")
    value = int(value)
    if value < minimum or (maximum is not None and value > maximum):
        bound = f">= {minimum}" if maximum is None else f"an int in [{minimum}, {maximum}]"
        raise InvalidValueError(f"{name} must be {bound}, got {value}")
    return value


def check_bool(name: str, value: object) -> bool:
    """Return ``value`` if it is a bool, else raise naming ``name`` and the value.

    Raises
    ------
    TypeError
        If ``value`` is not True or False (0 and 1 are refused: a flag is not a count).
    """
    if not isinstance(value, bool):
        raise InvalidTypeError(f"{name} must be True or False, got {value!r} of type "
                        f"{type(value).__name__}")
    return value
