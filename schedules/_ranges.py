"""What reversing one range of steps from a stored state costs in Revolve's schedules: forward
steps, forward calls and in-memory copies, counted from binomials (the performance model's
building block, :mod:`schedules.model`)."""
from __future__ import annotations

import functools
from dataclasses import dataclass

from .costs import Costs
from .revolve import _recomputations, checkpoints_taken, loads_kept

__all__ = ["Counts", "range_counts"]


@dataclass(frozen=True, slots=True)
class Counts:
    """What reversing one range costs in forward steps, forward calls and in-memory copies."""

    steps: int
    calls: int
    copies: int

    def seconds(self, costs: Costs, reverses: int) -> float:
        return (self.steps * costs.tf + self.calls * costs.tcall + reverses * costs.adjoint
                + self.copies * costs.tc)


@functools.lru_cache(maxsize=1 << 16)  # "auto" prices thousands of plans over few ranges
def range_counts(length: int, snaps: int, taping: bool, slack: int,
                  reaches_end: bool) -> Counts:
    """Counts of :func:`schedules.revolve.reverse_range` over ``length`` steps from a stored start
    (or of :func:`~schedules.revolve.forward_then_reverse` with ``reaches_end``: the live state
    is the start on entry and the range's forward part runs to u_n first).

    Every reverse step but the last is followed by a load, but for those that find the state
    held (``slack``, :func:`~schedules.revolve.loads_kept`); with taping each loop of the
    generator advances once, and without, every loop but the reverse of a range's start does
    (each store opens one more range).
    """
    if not taping and reaches_end:
        length += 1  # the fictitious step n, whose reverse is dropped
    stores = checkpoints_taken(length, snaps)
    loads = length - 1 if reaches_end else length
    kept = loads_kept(length, snaps, slack, taping, ends_forward=reaches_end) if slack else 0
    if taping:
        steps = length + _recomputations(length, snaps)
        calls = stores + length
    else:
        steps = _recomputations(length, snaps)
        calls = length - 1
    return Counts(steps, calls, stores + loads - kept)
