"""The parts of :func:`schedules.model.choose_interval`'s search: the dips of a priced grid,
the full binomial lengths where Revolve's recomputation per step dips, the bound above which
no interval can price below the best, and first-touch prices kept per slot count."""
from __future__ import annotations

import math
from collections.abc import Iterable, Sequence
from typing import TYPE_CHECKING

from ._ranges import range_counts
from .costs import Costs, Level2Tier, Prediction
from .revolve import _repetitions

if TYPE_CHECKING:
    from .model import FirstTouch

__all__ = ["Remembered", "beaten_up_to", "full_lengths", "least", "lowest_dips"]


class Remembered:
    """A :class:`FirstTouch` over one search's tiers whose answers are kept per slot count:
    every interval above the slots asks the same question."""

    def __init__(self, fresh: FirstTouch, tiers: Sequence[Level2Tier]) -> None:
        self.fresh, self.tiers = fresh, tiers
        self.faults: dict[int, float] = {}
        self.splits: dict[int, list[Level2Tier]] = {}

    def slots_s(self, slots: int) -> float:
        if slots not in self.faults:
            self.faults[slots] = self.fresh.slots_s(slots)
        return self.faults[slots]

    def split(self, tiers: Sequence[Level2Tier], slots: int) -> list[Level2Tier]:
        assert tiers is self.tiers  # the search's own
        if slots not in self.splits:
            self.splits[slots] = self.fresh.split(tiers, slots)
        return self.splits[slots]


def least(priced: dict[int, Prediction | None], intervals: Iterable[int]) -> int:
    """The interval of ``intervals`` priced least (each priced, the first held)."""
    least, total = -1, math.inf
    for interval in intervals:
        prediction = priced.get(interval)
        if prediction is not None and prediction.total_s < total:
            least, total = interval, prediction.total_s
    return least


def full_lengths(snaps: int, low: int, high: int, *, most: int = 0,
                  apart: float = 1.0) -> list[int]:
    """The lengths in [``low``, ``high``] that are full binomials C(snaps + t, t), those
    nearest ``low`` first: ``most`` of them at most (0: any number), up to where they lie
    less than ``apart`` times apart."""
    if snaps <= 1 or high < 2:
        return []
    t, found = _repetitions(max(low, 2), snaps), list[int]()
    while (not most or len(found) < most) and (length := math.comb(snaps + t, t)) <= high:
        if found and length < found[-1] * apart:
            break
        if length >= low:
            found.append(length)
        t += 1
    return found


def lowest_dips(priced: dict[int, Prediction | None], count: int) -> list[int]:
    """The ``count`` priced intervals of least price that are priced no higher than the
    priced intervals beside them."""
    held = sorted((i, p.total_s) for i, p in priced.items() if p is not None)
    dips = [held[k] for k in range(len(held))
            if (k == 0 or held[k][1] <= held[k - 1][1]) and
            (k == len(held) - 1 or held[k][1] <= held[k + 1][1])]
    return [i for i, _ in sorted(dips, key=lambda dip: dip[1])[:count]]


def beaten_up_to(n: int, interval: int, l1_slots: int, costs: Costs, taping: bool,
                  best: Prediction) -> int:
    """The largest J such that no interval in [``interval``, J] can price below ``best``.

    Every plan runs n forward steps and n reverse calls, and reverses each of its full
    intervals of I' steps from a stored state in ``steps(I')`` forward steps: its price is at
    least ``(n - I') (tf + adjoint + tf steps(I') / I')``. Revolve's forward steps per step
    never fall as a range grows (its cost is convex in the length, and nil at length 0), so
    for every I' >= I the bound holds with ``steps(I) / I`` in place of ``steps(I') / I'``:
    the grid above the best interval stops where the recomputation alone costs more than the
    best price, whatever n.
    """
    steps = range_counts(interval, l1_slots + 1, taping, costs.slack, False).steps
    rate = costs.tf + costs.adjoint + costs.tf * steps / interval
    if rate <= 0:
        return 0
    return math.floor(n - best.total_s / rate * (1 + 1e-9))
