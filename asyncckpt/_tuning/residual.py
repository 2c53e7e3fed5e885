"""What runs take beyond the price of their plans: the model's residual (docs/model.md).

Every cost the model prices is measured, yet a run also pays for what it does not see (a
descriptor's calls, cold copies, the runtime's own work, contention beyond what a transfer is
measured to take). What runs of a kind of plan missed is priced into the next plans, per step;
for plans with Level-2 transfers, split between their steps and their transfers.
"""
from __future__ import annotations

from dataclasses import astuple, dataclass, field

from .._execution.timing import RUN_DECAY

__all__ = ["Missed", "Residual", "SPREAD"]


#: Runs whose transfers spread less than this share of their mean cannot tell a transfer's
#: cost from the rest of what a run misses: their sums are taken as one ratio instead.
SPREAD = 0.25


@dataclass(frozen=True)
class Missed:
    """What runs of plans with Level-2 took beyond their price, as sums over those runs in which
    each earlier run weighs :data:`RUN_DECAY` times the next: seconds, the steps the model
    prices at a step's cost and the Level-2 transfers (writes and reads), the runs' weights,
    and the transfers' products with themselves, the seconds and the steps (a weighted least
    squares fit of seconds against transfers)."""

    seconds: float = 0.0
    steps: float = 0.0
    transfers: float = 0.0
    runs: float = 0.0
    transfers_sq: float = 0.0
    seconds_x: float = 0.0
    steps_x: float = 0.0

    def add(self, seconds: float, steps: int, transfers: int) -> Missed:
        """These sums with one more run's."""
        x = float(transfers)
        return Missed(*(RUN_DECAY * old + new for old, new in zip(
            astuple(self), (seconds, steps, x, 1.0, x * x, x * seconds, x * steps))))

    def fit(self, per_step: float) -> tuple[float, float] | None:
        """Seconds a run misses whatever it moves and seconds per transfer, beyond ``per_step``
        seconds per step (None: no transfer measured). Where the runs moved numbers of states
        spread at least :data:`SPREAD` of their mean, a line through them: a run moving few
        states that ran below its price then says what such runs miss, not that transfers
        cost less. Pooled into one ratio, a light plan's run 0.3 s under its price cancelled
        what interval 2 taught, and "auto" went back and forth between the two (Devito 3D at
        3% of the states, 63x75x59). Else one ratio of sums, through no seconds at none."""
        if not self.transfers:
            return None
        beyond = self.seconds - per_step * self.steps
        if self.runs:
            mean = self.transfers / self.runs
            spread = self.transfers_sq / self.runs - mean * mean
            if spread >= (SPREAD * mean) ** 2 > 0:
                beyond_x = self.seconds_x - per_step * self.steps_x
                slope = (beyond_x / self.runs - mean * beyond / self.runs) / spread
                return beyond / self.runs - slope * mean, slope
        return 0.0, beyond / self.transfers

    def per_transfer(self, per_step: float) -> float | None:
        """Seconds per transfer beyond ``per_step`` seconds per step (None: no transfer
        measured): the slope of :meth:`fit`."""
        fit = self.fit(per_step)
        return None if fit is None else fit[1]


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

    def per_run(self, busy: bool, split: bool) -> float:
        """Seconds a run of a plan (``busy``: with Level-2; ``split``: its transfers priced
        apart) misses whatever it moves, beside what :meth:`of` charges per step and per
        transfer: the intercept of the line through the runs with Level-2 (:meth:`Missed.fit`)
        where :meth:`of` charges its slope, else nothing."""
        if not (busy and split):
            return 0.0
        fit = self.missed.fit(self.per_step[False] or 0.0)
        return fit[0] if fit is not None and fit[1] > 0 else 0.0
