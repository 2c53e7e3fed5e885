"""Checks for the integer arguments of schedules."""
from __future__ import annotations

import numbers

__all__ = ["check_int"]


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
        raise TypeError(f"{name} must be an int, got {value!r} of type {type(value).__name__}")
    value = int(value)
    if value < minimum:
        raise ValueError(f"{name} must be >= {minimum}, got {value}")
    if maximum is not None and value > maximum:
        raise ValueError(f"{name} must be <= {maximum}, got {value}")
    return value
