"""The plans "auto" chooses between, and how it chooses."""
from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass

from schedules.model import IntervalChoice

__all__ = ["EXPLORE", "NEAR_TIE", "Plan", "cheapest_near_fastest", "explored",
           "fastest_once_warm"]

#: Plans predicted within this share of the fastest once memory is warm count as equally fast:
#: the model's prediction of one plan moves by a few percent between runs (docs/model.md), so a
#: smaller difference is no evidence that one plan is faster, and no reason to fault in new
#: memory.
NEAR_TIE = 0.03

#: A kind of plan no run has measured (with Level-2 transfers, or Revolve in Level-1 alone)
#: is priced with what runs of the other kind measured, which misjudges it either way: the
#: copies and the residual of runs with transfers priced Revolve in 79 slots at 9.6 s, 4.5%
#: above their own plan, and it ran in 8.2 s (Devito 3D at 8% of the states). Within this share
#: of the fastest, it runs once, and its own costs price it from then on.
EXPLORE = 0.10


@dataclass(frozen=True)
class Plan:
    """One schedule "auto" may run: ``interval`` (0: Revolve in the Level-1 slots alone) with
    ``slots`` Level-1 slots, its predicted seconds once memory is warm (``warm_s``) and for the
    next run, faults in fresh memory included (``total_s``), the model's choice of interval
    for those slots that it came from (with the Revolve and store-all baselines), the
    states it writes to Level-2 (``transfers``; it reads as many back) and whether the codec
    compresses them (``compressed``)."""

    slots: int
    interval: int
    choice: IntervalChoice
    warm_s: float
    total_s: float
    transfers: int = 0
    compressed: bool = False

    @property
    def faults_s(self) -> float:
        """What the next run pays to fault in fresh memory: ``total_s - warm_s``."""
        return self.total_s - self.warm_s


def fastest_once_warm(plans: Sequence[Plan]) -> Plan:
    """The plan fastest once memory is warm, faults aside (then the fewest slots): a first run's
    pick, whose prices come from probes, which misjudge a disk tier and cannot tell
    it from a DRAM tier whose transfers hide behind the compute."""
    if not plans:
        raise ValueError("no plan to choose from")
    return min(plans, key=lambda plan: (plan.warm_s, plan.slots))


def cheapest_near_fastest(plans: Sequence[Plan], near: float = NEAR_TIE, *,
                          traffic_priced: bool = False) -> Plan:
    """Among the plans within ``near`` of the fastest once memory is warm, the one whose next
    run faults in least fresh memory, then one that does not compress, then (unless
    ``traffic_priced``) the one with the fewest Level-2 transfers, then the faster warm, then
    the fewest slots.

    An adjoint code evaluates many gradients, so the warm time decides; but between plans the
    model cannot tell apart, the next run's faults do, so a run keeps the plan whose memory an
    earlier run left warm instead of flipping on noise (docs/model.md). Then background work
    decides until a run has measured what a transfer takes from the compute beside it
    (``traffic_priced``): before, it is priced from a guess (docs/benchmarks.md); after, the
    prices hold it, and the fewest transfers once kept Revolve in Level-1 alone where an
    interval priced 2% below it ran 10% faster (Devito 2D at 1% of the states).
    """
    if not plans:
        raise ValueError("no plan to choose from")
    if near < 0:
        raise ValueError(f"near must be >= 0, got {near}")
    fastest = min(plan.warm_s for plan in plans)
    return min((plan for plan in plans if plan.warm_s <= fastest * (1 + near)),
               key=lambda plan: (plan.faults_s, plan.compressed,
                                 0 if traffic_priced else plan.transfers, plan.warm_s,
                                 plan.slots))


def explored(plans: Sequence[Plan], chosen: Plan, measured: Callable[[Plan], bool],
             margin: float = EXPLORE) -> Plan:
    """``chosen``, or where its kind of plan has been measured and another kind has not
    (``measured``), the fastest plan of that kind once warm if it is priced within ``margin``
    of ``chosen``."""
    if margin < 0:
        raise ValueError(f"margin must be >= 0, got {margin}")
    if not measured(chosen):
        return chosen
    untried = [plan for plan in plans if not measured(plan)]
    if not untried:
        return chosen
    best = min(untried, key=lambda plan: (plan.warm_s, plan.slots))
    return best if best.warm_s <= chosen.warm_s * (1 + margin) else chosen
