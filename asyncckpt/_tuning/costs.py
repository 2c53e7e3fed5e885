"""The costs the model prices plans with, as small objects that learn from runs: the compute
costs under one condition (:class:`ComputeCosts`: quiet, or beside Level-2 transfers) and the
transfer costs of each Level-2 path with their floors (:class:`TransferCosts`)."""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from .._execution.timing import RUN_DECAY, CallFit

__all__ = ["ComputeCosts", "DRIFT", "LOADED", "PRIOR_TRANSFERS", "RunMean", "TransferCosts",
           "blend", "fitted"]

#: What a transfer cost known before a run weighs, in transfers, against the run's own: a run
#: that moved one state through a path nudges its cost (a lone read of a cold state costs
#: several times what a run's reads do), one that moved hundreds replaces it.
PRIOR_TRANSFERS = 4

#: The share of a sweep beyond which a Level-2 path's transfers kept the I/O thread busy: a run
#: that loaded a path so measured what it sustains, and its costs stand as a floor that lighter
#: runs lower them no further. A device may serve a light load faster than a heavy one (a disk
#: throttled with a burst allowance: docs/model.md).
LOADED = 0.5

#: A run whose step costs this many times more in its second half than in its first (or less by
#: as much) changed its costs midway: its compute beside transfers cannot be told from that
#: change, so it teaches no contention. A step's cost varies between runs more than within one.
DRIFT = 1.5


def blend(known: float, seconds: float, count: int) -> float:
    """The mean cost of a transfer (or of a fresh buffer's faults) from ``known`` (worth
    :data:`PRIOR_TRANSFERS` of them) and ``count`` of them that took ``seconds`` in all."""
    return (PRIOR_TRANSFERS * known + seconds) / (PRIOR_TRANSFERS + count)


def fitted(calls: CallFit, tcall: float, tf: float | None) -> tuple[float, float]:
    """(tcall, tf) from forward ``calls`` (of at least one step): their least-squares fit, or
    where every call had the same length, the known ``tcall`` and ``tf`` rescaled to the calls'
    mean, their split kept."""
    fit = calls.fit()
    if fit is not None:
        return fit
    per_call = calls.seconds / calls.calls
    length = calls.steps / calls.calls
    old = tcall + length * (tf or 0.0)
    scale = per_call / old if old > 0 else 1.0
    return tcall * scale, max((tf or per_call / length) * scale, 1e-9)


@dataclass
class RunMean:
    """A mean over runs in which each earlier run weighs :data:`RUN_DECAY` times the next."""

    value: float = 0.0
    weight: float = 0.0

    def add(self, value: float) -> float:
        """Take one run's ``value`` in; return the mean."""
        earlier = RUN_DECAY * self.weight
        self.value = (earlier * self.value + value) / (earlier + 1)
        self.weight = earlier + 1
        return self.value


@dataclass
class ComputeCosts:
    """A forward step (``tf``), a forward call beyond its steps (``tcall``), a reverse step with
    its taping step (``tb``) and a copy within Level-1 (``tc``), as measured under one
    condition, pooled over runs (each earlier run weighing :data:`RUN_DECAY` of the next).
    None: not measured yet."""

    tf: float | None = None
    tcall: float | None = None
    tb: float | None = None
    tc: float | None = None
    #: the forward calls of the runs so far, and the means of a reverse call's and a copy's cost
    calls: CallFit = field(default_factory=CallFit)
    adjoint_mean: RunMean = field(default_factory=RunMean)
    copy_mean: RunMean = field(default_factory=RunMean)

    @property
    def adjoint(self) -> float | None:
        """The reverse call alone (``tb - tf``), or None."""
        return None if self.tb is None or self.tf is None else self.tb - self.tf

    def learn(self, stats: Any, fit: CallFit, known: "ComputeCosts") -> None:
        """Pool a run's forward calls (``fit``) and reverse calls into these costs; where these
        have none yet, a call's split starts from ``known``'s."""
        self.calls = self.calls.pooled(fit)
        if self.calls.steps:
            tcall = self.tcall if self.tcall is not None else known.tcall
            self.tcall, self.tf = fitted(self.calls, tcall or 0.0,
                                         self.tf if self.tf is not None else known.tf)
        if stats.reverse_steps and self.tf is not None:
            self.tb = self.tf + self.adjoint_mean.add(stats.reverse_compute_s
                                                      / stats.reverse_steps)

    def learn_copies(self, stats: Any) -> None:
        """Take a run's copies into ``tc`` (copies do not drift with the step)."""
        if stats.copies:
            self.tc = self.copy_mean.add(stats.copy_s / stats.copies)

    def take_run(self, tf: float, tcall: float | None, adjoint: float | None) -> None:
        """Take a drifting run's costs as they are (see :data:`DRIFT`)."""
        self.tf, self.tcall = tf, tcall
        if adjoint is not None:
            self.adjoint_mean = RunMean(adjoint, 1.0)
            self.tb = tf + adjoint


@dataclass
class TransferCosts:
    """Seconds to write (``tw``) and read back (``tr``) one uncompressed state through Level-2,
    and through each tier of a tiered one (``tier_costs``, fastest first), with the floor of
    each path that the last run that loaded it set (``loaded_costs``, see :data:`LOADED`)."""

    tw: float
    tr: float
    tier_costs: list[tuple[float, float]] | None = None
    loaded_costs: list[tuple[float | None, float | None]] | None = None

    def floored(self, costs: list[tuple[float, float]], busy: list[tuple[float, float]],
                stats: Any) -> list[tuple[float, float]]:
        """``costs`` (tw, tr of each Level-2 path, as learned from the run) raised to what the
        last run that loaded the path measured; a path this run loaded (``busy``: its seconds of
        writes and reads) sets that floor instead."""
        if self.loaded_costs is None or len(self.loaded_costs) != len(costs):
            self.loaded_costs = [(None, None)] * len(costs)
        floored = []
        for i, ((tw, tr), (write_s, read_s)) in enumerate(zip(costs, busy)):
            floor_w, floor_r = self.loaded_costs[i]
            if stats.forward_s > 0 and write_s >= LOADED * stats.forward_s:
                floor_w = tw
            elif floor_w is not None:
                tw = max(tw, floor_w)
            if stats.reverse_s > 0 and read_s >= LOADED * stats.reverse_s:
                floor_r = tr
            elif floor_r is not None:
                tr = max(tr, floor_r)
            self.loaded_costs[i] = (floor_w, floor_r)
            floored.append((tw, tr))
        return floored

    def learn(self, stats: Any, stored: float, packed: bool) -> None:
        """Take a run's transfers in: ``stored`` is the share of the bytes written that Level-2
        stored (1 without a codec); ``packed``: every write went through the codec, so the
        device carried its compressed share and the costs taken back to uncompressed states may
        only rise (a device may be faster under a lighter load)."""
        def revised(known: float, blended: float) -> float:
            return max(known, blended) if packed else blended
        if self.tier_costs is not None and stats.l2_tiers:
            # each tier's transfers as they cost inside the run, taken back to uncompressed
            # states by the share of bytes that tier stored: a wavefield's early states, which
            # compress most, fill the fast tier first
            raw = stats.bytes_written / stats.l2_writes if stats.l2_writes else 0.0

            def share(tier: dict[str, float]) -> float:
                written = tier.get("written_bytes", 0)
                if not raw or not tier["writes"] or not written:
                    return stored
                return min(1.0, written / (tier["writes"] * raw))

            self.tier_costs = [
                (revised(tw, blend(tw, tier["write_s"] / share(tier), tier["writes"])),
                 revised(tr, blend(tr, tier["read_s"] / share(tier), tier["reads"])))
                for (tw, tr), tier in zip(self.tier_costs, stats.l2_tiers)]
            self.tier_costs = self.floored(
                self.tier_costs, [(tier["write_s"], tier["read_s"]) for tier in stats.l2_tiers],
                stats)
        elif self.tier_costs is None:
            # fresh pages are faulted in once: the pool keeps them for the next run
            written = stats.write_busy_s - stats.write_fresh_s - stats.compress_s
            self.tw = revised(self.tw, blend(self.tw, max(written, 0.0) / stored,
                                             stats.l2_writes))
            self.tr = revised(self.tr, blend(
                self.tr, max(stats.read_busy_s - stats.decompress_s, 0.0) / stored,
                stats.l2_reads))
            [(self.tw, self.tr)] = self.floored(
                [(self.tw, self.tr)], [(stats.write_busy_s, stats.read_busy_s)], stats)
