"""The command line's argument types and its tables (:mod:`asyncckpt.cli`)."""
from __future__ import annotations

import argparse

__all__ = ["mib", "positive_int", "seconds", "table"]


def positive_int(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a positive integer, got {text!r}") from None
    if value < 1:
        raise argparse.ArgumentTypeError(f"expected a positive integer, got {value}")
    return value


def seconds(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a time in seconds, got {text!r}") from None
    if not value >= 0:
        raise argparse.ArgumentTypeError(f"expected a time >= 0 seconds, got {text!r}")
    return value


def table(rows: list[list[str]], header: list[str]) -> str:
    widths = [max(len(r[i]) for r in rows + [header]) for i in range(len(header))]
    line = "  ".join(h.rjust(w) for h, w in zip(header, widths))
    body = ["  ".join(c.rjust(w) for c, w in zip(r, widths)) for r in rows]
    return "\n".join([line, "  ".join("-" * w for w in widths), *body])


def mib(text: str) -> int:
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a size in MiB, got {text!r}") from None
    if not value > 0:
        raise argparse.ArgumentTypeError(f"expected a size > 0 MiB, got {text!r}")
    return max(1, int(value * 2**20))
