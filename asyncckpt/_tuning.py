"""``interval="auto"``: the interval the performance model predicts fastest, from costs measured
on the real run."""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from schedules.model import Costs, IntervalChoice, choose_interval

__all__ = ["IntervalTuner"]


@dataclass
class IntervalTuner:
    """Measured costs of a checkpointer's run and the interval they call for.

    ``tw``, ``tr`` and ``tc`` are measured at construction through the runtime's own I/O path;
    ``tf`` comes from the first forward step of the first run; every completed run then updates
    ``tf``, ``tb``, ``tw`` and ``tr`` from what it measured.
    """

    n_steps: int
    l1_slots: int
    staging_buffers: int
    inline: bool
    tw: float
    tr: float
    tc: float
    tf: float | None = None
    tb: float | None = None

    def costs(self) -> Costs:
        """The model's costs. Inline transfers run on the caller's thread: they add to the copy
        cost of a store or load instead of overlapping. Until a reverse sweep has been timed, a
        reverse step (taping step included) is taken as two forward steps."""
        assert self.tf is not None
        tb = self.tb if self.tb is not None else 2 * self.tf
        if self.inline:
            return Costs(tf=self.tf, tb=tb, tw=0.0, tr=0.0, tc=self.tc + (self.tw + self.tr) / 2)
        return Costs(tf=self.tf, tb=tb, tw=self.tw, tr=self.tr, tc=self.tc)

    def choose(self) -> IntervalChoice:
        """The interval with the least predicted time, with the baselines' predictions."""
        return choose_interval(self.n_steps, self.l1_slots, self.costs(),
                               staging_buffers=self.staging_buffers)

    def learn(self, stats: Any) -> None:
        """Take tf and tb (time inside the user's operators) and tw and tr (time on the Level-2
        path, fresh pages and contention included) from a completed run's :class:`Stats`."""
        if stats.forward_steps:
            self.tf = max(stats.forward_compute_s / stats.forward_steps, 1e-9)
        if stats.reverse_steps and self.tf is not None:
            self.tb = self.tf + stats.reverse_compute_s / stats.reverse_steps
        if stats.l2_writes:
            self.tw = stats.write_busy_s / stats.l2_writes
        if stats.l2_reads:
            self.tr = stats.read_busy_s / stats.l2_reads

    def record(self, choice: IntervalChoice) -> dict[str, Any]:
        """What goes into ``Stats.calibration``."""
        costs = self.costs()
        return {
            "tf_s": costs.tf, "tb_s": costs.tb, "tw_s": self.tw, "tr_s": self.tr, "tc_s": self.tc,
            "tb_measured": self.tb is not None, "transfers": "inline" if self.inline else "background",
            "interval": choice.interval,
            "predicted_total_s": choice.prediction.total_s,
            "predicted_revolve_s": choice.revolve.total_s,
            "predicted_store_all_s": choice.store_all.total_s,
        }
