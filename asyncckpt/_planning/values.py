"""How one option's value is read, from an argument, the command line or an environment
variable: a choice among words, a flag, an interval, a size in bytes; each error names the
option, the value and what is accepted."""
from __future__ import annotations

import re

from schedules._args import check_int

from ..errors import InvalidValueError

__all__ = ["check_choice", "parse_bytes", "parse_flag", "parse_interval"]

_TRUE, _FALSE = ("1", "true", "yes", "on"), ("0", "false", "no", "off")


def check_choice(name: str, value: object, choices: tuple[str, ...]) -> str:
    """Return ``value`` if it is one of ``choices``, else raise naming ``name`` and them."""
    if not isinstance(value, str) or value not in choices:
        listed = ", ".join(repr(c) for c in choices)
        raise InvalidValueError(f"{name} must be one of {listed}, got {value!r}")
    return value


def parse_flag(name: str, text: str) -> bool:
    """``text`` (from ``$name``) as a bool: 1/0, true/false, yes/no, on/off, any case."""
    folded = text.strip().lower()
    if folded in _TRUE:
        return True
    if folded in _FALSE:
        return False
    raise InvalidValueError(f"{name} must be 1 or 0 (or true/false, yes/no, on/off), got {text!r}")


def parse_interval(value: object, n_timesteps: int | None = None, *,
                   name: str = "interval", adaptive: bool = False) -> int | str:
    """The interval option: an int in [0, n_timesteps] (any int >= 0 where n is not given; 0:
    Level-1 alone), "auto", or where ``adaptive`` is allowed "adaptive". Text (from the command
    line or ``$ASYNCCKPT_INTERVAL``) may spell the int."""
    words = ("auto", "adaptive") if adaptive else ("auto",)
    if isinstance(value, str):
        text = value.strip()
        if text in words:
            return text
        if not text.isdigit():
            bound = (f"an int in [0, {n_timesteps}]" if n_timesteps is not None
                     else "an int >= 0")
            raise InvalidValueError(f"{name} must be {bound} or {' or '.join(map(repr, words))}, "
                                    f"got {value!r}")
        value = int(text)
    return check_int(name, value, 0, n_timesteps)


_UNITS = {"": 1, "b": 1, "kb": 10**3, "mb": 10**6, "gb": 10**9, "tb": 10**12,
          "kib": 2**10, "mib": 2**20, "gib": 2**30, "tib": 2**40}
_SIZE = re.compile(r"\s*(\d+(?:\.\d*)?|\.\d+)\s*([a-zA-Z]*)\s*")


def parse_bytes(name: str, value: object) -> int:
    """A size in bytes: an int, or text such as "512MiB", "8GB", "1.5 GiB" (KB, MB, GB, TB are
    powers of 1000; KiB, MiB, GiB, TiB of 1024; any case). Must be positive.

    Raises
    ------
    InvalidValueError
        Naming the value and the accepted forms, for text that does not parse, zero, or a
        negative size.
    InvalidTypeError
        For anything but an int or a str.
    """
    if isinstance(value, str):
        match = _SIZE.fullmatch(value)
        unit = match.group(2).lower() if match else ""
        if match is None or unit not in _UNITS:
            raise InvalidValueError(f"{name} must be a number of bytes, or a size such as "
                                    f"'512MiB', '8GB' or '1.5 GiB', got {value!r}")
        size = int(float(match.group(1)) * _UNITS[unit])
    else:
        size = check_int(name, value, -(2**63))
    if size <= 0:
        raise InvalidValueError(f"{name} must be a positive size in bytes, got {value!r}")
    return size
