"""What runs take beyond the price of their plans: the model's residual (docs/model.md).

Every cost the model prices is measured, yet a run also pays for what it does not see (a
descriptor's calls, cold copies, the runtime's own work, contention beyond what a transfer is
measured to take). What runs of a kind of plan missed is priced into the next plans, per step;
for plans with Level-2 transfers, split between their steps and their transfers.
"""
from __future__ import annotations

from dataclasses import dataclass, field

from .._execution.timing import RUN_DECAY

__all__ = ["Missed", "Residual"]


@dataclass(frozen=True)
class Missed:
    """What runs of plans with Level-2 took beyond their price, as sums over those runs in which
    each earlier run weighs :data:`RUN_DECAY` times the next: seconds, the steps the model
    prices at a step's cost and the Level-2 transfers (writes and reads)."""

    seconds: float = 0.0
    steps: float = 0.0
    transfers: float = 0.0

    def add(self, seconds: float, steps: int, transfers: int) -> Missed:
        """These sums with one more run's."""
        return Missed(RUN_DECAY * self.seconds + seconds, RUN_DECAY * self.steps + steps,
                      RUN_DECAY * self.transfers + transfers)

    def per_transfer(self, per_step: float) -> float | None:
        """Seconds per transfer beyond ``per_step`` seconds per step (None: no transfer
        measured)."""
        if not self.transfers:
            return None
        return (self.seconds - per_step * self.steps) / self.transfers


@dataclass
class Residual:
    """What runs missed: seconds per step of plans without Level-2 (``per_step[False]``) and
    with it (``per_step[True]``), each a mean over runs in which each earlier run weighs
    :data:`RUN_DECAY` times the next (None: no such run measured), and the sums of the runs
    with Level-2 (:attr:`missed`) that split theirs between steps and transfers.

    Charged per step alone, the unexplained seconds of a transfer-bound plan priced every plan
    with Level-2 as dear per step, whatever it moved: on Devito 3D at 4% of the states, once
    interval 2 (hundreds of writes) had run 1.3 times its price, intervals writing 30 states
    were priced above Revolve in Level-1 and "auto" ran interval 2 again, where interval 8 was
    15% faster.
    """

    per_step: dict[bool, float | None] = field(
        default_factory=lambda: {False: None, True: None})
    missed: Missed = field(default_factory=Missed)

    def learn(self, level2: bool, seconds: float, steps: int, transfers: int) -> None:
        """Take in a run (``level2``: of a plan with Level-2) that took ``seconds`` beyond its
        price over ``steps`` steps priced at a step's cost and ``transfers`` transfers."""
        gap, before = seconds / steps, self.per_step[level2]
        self.per_step[level2] = gap if before is None else \
            RUN_DECAY * before + (1 - RUN_DECAY) * gap
        if level2:
            self.missed = self.missed.add(seconds, steps, transfers)

    def of(self, busy: bool, split: bool) -> tuple[float, float]:
        """Seconds per step and per Level-2 transfer a plan (``busy``: with Level-2) misses
        beyond the model's costs. It misses per step what runs of its kind missed, or else
        what the other kind's did; with ``split`` (its transfers priced apart from its
        steps), a plan with Level-2 misses per step what one without did (nothing until one
        is measured) and the rest of what its kind missed per transfer, where that is more
        than nothing: a transfer taking less than ``tx`` says more of the noise of a run that
        moved few states (an interval of 38 moving 58, 0.06 s off its price) than of the
        transfers of one moving a thousand, and would price those a second too cheap.

        Until a plan without Level-2 has run, what plans with it missed is charged to their
        transfers alone: a run of interval 2 (1500 transfers) cannot tell its steps' share
        from its transfers', and charged per step it priced interval 16 (125 transfers, 15
        slots) above interval 2 where it ran 5% faster (Devito 3D at 2% of the states)."""
        quiet = self.per_step[False]
        per_transfer = self.missed.per_transfer(quiet or 0.0) if split else None
        if per_transfer is not None and per_transfer > 0:
            return quiet or 0.0, per_transfer
        residual = self.per_step[busy]
        if residual is None:  # what one kind of plan missed, the other most likely misses too
            residual = self.per_step[not busy]
        return residual or 0.0, 0.0
