"""``interval="auto"``: the schedule the performance model predicts fastest, from costs measured
on the real run.

A forward call of k steps costs ``tcall + k tf`` (Devito's operators, for one, pay a fixed cost
per call): both are fitted by least squares over every forward call of a run. Copies and Level-2
transfers are priced as they cost inside the run (cache-cold, beside the compute), not as a quiet
probe measures them. What a run measured is remembered for the process, so the next checkpointer
of the same operators and state size (a fresh ``Revolver`` per gradient, as Devito builds it)
starts from it.

Memory a run touches for the first time costs a page fault per page, which on some machines
(virtual ones whose host backs guest memory lazily) runs 30 times slower than a copy.
Buffers are kept for the next run (:mod:`asyncckpt._pool`), so that price is paid once per
process: "auto" chooses the schedule fastest once memory is warm (an adjoint code evaluates many
gradients), and predicts each run with the faults it will pay.
"""
from __future__ import annotations

import threading
from collections.abc import Sequence
from copy import deepcopy
from dataclasses import asdict, dataclass, field, replace
from typing import Any

from schedules.model import (CodecCosts, Costs, FreshMemory, IntervalChoice, Level2Tier,
                             choose_interval, predict_async_multistage, predict_revolve,
                             predict_tiered)

__all__ = ["CallFit", "RunMean", "IntervalTuner", "Plan", "NEAR_TIE", "RUN_DECAY",
           "fastest_once_warm", "cheapest_near_fastest", "agree_costs", "CostMemory", "COSTS"]

#: Plans predicted within this share of the fastest once memory is warm count as equally fast:
#: the model's prediction of one plan moves by 2 to 3% between runs here, so a smaller
#: difference is no evidence that one plan is faster, and no reason to fault in new memory.
NEAR_TIE = 0.03

#: What a transfer cost known before a run weighs, in transfers, against the run's own: a run
#: that moved one state through a path nudges its cost (a lone read of a cold state measured
#: 6.2 ms on a DRAM tier whose 385 reads in the next run averaged 1.2 ms), one that moved
#: hundreds replaces it.
PRIOR_TRANSFERS = 4

#: The share of a sweep beyond which a Level-2 path's transfers kept the I/O thread busy: a run
#: that loaded a path so measured what it sustains, and its costs stand as a floor that lighter
#: runs lower them no further. A device may serve a light load faster than a heavy one: a disk
#: throttled to 300 MiB/s with a burst allowance wrote 80 states of a run at 2 GB/s, and the
#: plan priced so, with 470 writes, stalled 11 s of a 32 s run where the loaded run's price chose
#: one of 15 s (Devito 3D, nt = 2000, measured).
LOADED = 0.5


#: What the runs before the last weigh in the compute costs (tf, tcall, tb, tc), each run half the
#: next: on these machines a Devito step's cost moves by 15% from one gradient to the next (1.29
#: to 1.73 ms), so the last run alone mispredicts the next by as much, and its split of a call's
#: cost between tcall and tf swings more (tcall 0.06 to 0.5 ms) than a pooled fit's.
RUN_DECAY = 0.5

#: A run whose step costs this many times more in its second half than in its first (or less by
#: as much) changed its costs midway: its compute beside transfers cannot be told from that
#: change, so it teaches no contention. Devito's steps vary by 15% between runs, not within one.
DRIFT = 1.5


def _blend(known: float, seconds: float, count: int) -> float:
    """The mean cost of a transfer (or of a fresh buffer's faults) from ``known`` (worth
    :data:`PRIOR_TRANSFERS` of them) and ``count`` of them that took ``seconds`` in all."""
    return (PRIOR_TRANSFERS * known + seconds) / (PRIOR_TRANSFERS + count)


def _fitted(calls: CallFit, tcall: float, tf: float | None) -> tuple[float, float]:
    """(tcall, tf) from forward ``calls`` (of at least one step): their least-squares fit, or
    where every call had the same length, the known ``tcall`` and ``tf`` rescaled to the calls'
    mean, their split kept."""
    fitted = calls.fit()
    if fitted is not None:
        return fitted
    per_call = calls.seconds / calls.calls
    length = calls.steps / calls.calls
    old = tcall + length * (tf or 0.0)
    scale = per_call / old if old > 0 else 1.0
    return tcall * scale, max((tf or per_call / length) * scale, 1e-9)


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
    pick, whose prices come from probes, which misjudge a disk tier by 1.4 to 2x and cannot tell
    it from a DRAM tier whose transfers hide behind the compute."""
    if not plans:
        raise ValueError("no plan to choose from")
    return min(plans, key=lambda plan: (plan.warm_s, plan.slots))


def cheapest_near_fastest(plans: Sequence[Plan], near: float = NEAR_TIE) -> Plan:
    """Among the plans within ``near`` of the fastest once memory is warm, the one whose next
    run faults in least fresh memory, then one that does not compress, then the one with the
    fewest Level-2 transfers (then the faster warm, then the fewest slots).

    An adjoint code evaluates many gradients, so the warm time decides; but between plans the
    model cannot tell apart, the next run's faults do, so a run keeps the plan whose memory an
    earlier run left warm instead of flipping on noise (a run once paid 7.6 s of faults for a
    predicted 0.2 s). Then background work decides: the model does not price what a codec or a
    transfer takes from the compute beside it (on two cores a Devito forward step ran 20%
    slower beside one transfer per step: docs/benchmarks.md).
    """
    if not plans:
        raise ValueError("no plan to choose from")
    if near < 0:
        raise ValueError(f"near must be >= 0, got {near}")
    fastest = min(plan.warm_s for plan in plans)
    return min((plan for plan in plans if plan.warm_s <= fastest * (1 + near)),
               key=lambda plan: (plan.faults_s, plan.compressed, plan.transfers, plan.warm_s,
                                 plan.slots))


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
class CallFit:
    """Least-squares fit of ``seconds = tcall + steps * tf`` over forward calls (weighted: see
    :meth:`pooled`)."""

    calls: float = 0.0
    steps: float = 0.0
    steps2: float = 0.0
    seconds: float = 0.0
    cross: float = 0.0
    lengths: set[int] = field(default_factory=set)
    #: where a run's second half begins (None: not split); ``halves`` holds the calls, steps
    #: and seconds of the calls that start before it and from it on
    midpoint: int | None = None
    halves: list[list[float]] = field(default_factory=lambda: [[0.0] * 3, [0.0] * 3])

    def add(self, steps: int, seconds: float, start: int | None = None) -> None:
        """Record one call of ``steps`` steps from u_``start`` that took ``seconds``."""
        self.calls += 1
        self.steps += steps
        self.steps2 += steps * steps
        self.seconds += seconds
        self.cross += steps * seconds
        if len(self.lengths) < 2:
            self.lengths.add(steps)
        if self.midpoint is not None and start is not None:
            half = self.halves[start >= self.midpoint]
            half[0] += 1
            half[1] += steps
            half[2] += seconds

    def drift(self, tcall: float) -> float | None:
        """A step's seconds in the run's second half over its first, each half's calls less
        ``tcall`` each (a half of shorter calls is no dearer per step for it: the cost of a
        call as known before the run, since a fit over a run whose step cost changed is no
        measure of it); None where a half has no calls or the run was not split."""
        (early_calls, early_steps, early_s), (late_calls, late_steps, late_s) = self.halves
        if not early_steps or not late_steps:
            return None
        early = (early_s - early_calls * tcall) / early_steps
        late = (late_s - late_calls * tcall) / late_steps
        return late / early if early > 0 and late > 0 else None

    def pooled(self, run: "CallFit") -> "CallFit":
        """This fit's calls, each weighing :data:`RUN_DECAY` of what it did, with ``run``'s."""
        return CallFit(RUN_DECAY * self.calls + run.calls, RUN_DECAY * self.steps + run.steps,
                       RUN_DECAY * self.steps2 + run.steps2,
                       RUN_DECAY * self.seconds + run.seconds, RUN_DECAY * self.cross + run.cross,
                       set(sorted(self.lengths | run.lengths)[:2]))

    def fit(self) -> tuple[float, float] | None:
        """(tcall, tf), or None when every call had the same length (no way to tell them apart).

        tcall is clamped at 0 and tf kept positive: noise must not make a call cost negative."""
        if len(self.lengths) < 2:
            return None
        n, sx, sxx, sy, sxy = self.calls, self.steps, self.steps2, self.seconds, self.cross
        denominator = n * sxx - sx * sx
        if denominator <= 0:
            return None
        tf = (n * sxy - sx * sy) / denominator
        tcall = (sy - tf * sx) / n
        if tf <= 0 or tcall < 0:
            return 0.0, max(sy / sx, 1e-9)
        return tcall, tf


@dataclass
class IntervalTuner:
    """Measured costs of a checkpointer's runs and the schedule they call for.

    ``tw`` and ``tr`` start from a probe through the runtime's own I/O path at construction, ``tf``
    and ``tcall`` from a probe of the first run's opening calls; every completed run revises them
    with what it measured (see :meth:`learn`).
    """

    n_steps: int
    l1_slots: int
    staging_buffers: int
    inline: bool
    taping: bool
    tw: float
    tr: float
    tc: float
    tf: float | None = None
    tb: float | None = None
    tcall: float = 0.0
    runs: int = 0
    #: (tw, tr) of each tier of a tiered Level-2, fastest first, probed at construction
    tier_costs: list[tuple[float, float]] | None = None
    #: the tier whose states occupy process memory (0 for an untiered one in host DRAM)
    in_memory: int | None = None
    #: seconds to fault in one fresh state buffer (None: not measured, not priced)
    fault_s: float | None = None
    #: state buffers already faulted in that the next run can use
    warm_buffers: int = 0
    #: the forward calls of the runs so far, and the means over runs of a reverse call's and a
    #: copy's cost (see :data:`RUN_DECAY`)
    forward_calls: CallFit = field(default_factory=CallFit)
    adjoint_mean: RunMean = field(default_factory=RunMean)
    copy_mean: RunMean = field(default_factory=RunMean)
    #: the same costs (tf, tcall, tb, tc) in runs whose Level-2 transfers ran on the I/O
    #: thread beside the compute (None: none measured yet), and the forward calls and means
    #: they come from
    tf_busy: float | None = None
    tcall_busy: float | None = None
    tb_busy: float | None = None
    tc_busy: float | None = None
    busy_calls: CallFit = field(default_factory=CallFit)
    busy_adjoint_mean: RunMean = field(default_factory=RunMean)
    busy_copy_mean: RunMean = field(default_factory=RunMean)
    #: what each Level-2 transfer takes from the compute beside it (None: not measured yet;
    #: see :meth:`learn`)
    tx: float | None = None
    #: what the codec in front of Level-2 costs per state (None: no codec, or not measured yet);
    #: ``tw``, ``tr`` and ``tier_costs`` are those of uncompressed states
    codec: CodecCosts | None = None
    #: for each Level-2 path (each tier, or the one storage) the (tw, tr) of the last run that
    #: loaded it (see :data:`LOADED`; None: none has yet)
    loaded_costs: list[tuple[float | None, float | None]] | None = None

    def costs(self, *, busy: bool = False, compressed: bool = False) -> Costs:
        """The model's costs. Inline transfers run on the caller's thread: they add to the copy
        cost of a store or load instead of overlapping. ``busy``: the costs of a plan with
        Level-2 transfers, whose steps and copies run beside the I/O thread's checksums and
        reads, as runs with them measured (on Devito 3D, twice as long a copy and a 20% longer
        forward step than in Level-1 alone); each cost is
        taken from the other kind of run until one of this kind has measured it. Until a
        reverse sweep has been timed, a reverse step (taping step included) is taken as two
        forward steps. ``compressed``: transfers go through the codec (:attr:`codec`).

        Once a run with transfers has measured what each one takes from the compute
        (:attr:`tx`), a busy plan is priced with the quiet costs and ``tx`` per transfer
        instead, so that a plan moving fewer states is priced nearer its quiet cost (on Devito
        3D under a 2% budget, I = 5 with 4 slots ran 12% faster than I = 2 with one, which the
        flat busy costs, measured at I = 2, had priced slower)."""
        assert self.tf is not None
        quiet = (self.tf, self.tcall, None if self.tb is None else self.tb - self.tf, self.tc)
        beside = (self.tf_busy, self.tcall_busy,
                  None if self.tb_busy is None or self.tf_busy is None
                  else self.tb_busy - self.tf_busy, self.tc_busy)
        tx = 0.0
        if busy and not self.inline and self.tx is not None:
            # quiet costs and tx per transfer; the reverse call's contention is in tx only
            # where its quiet cost is known (see learn)
            tx, beside = self.tx, (None, None, beside[2] if quiet[2] is None else None, None)
        first, then = (beside, quiet) if busy and not self.inline else (quiet, beside)
        tf, tcall, adjoint, tc = (a if a is not None else b for a, b in zip(first, then))
        assert tf is not None and tcall is not None and tc is not None
        tb = tf + (adjoint if adjoint is not None else tf)
        tw, tr = self.tw, self.tr
        if compressed:
            codec = self._codec()
            tw, tr = codec.write(tw), codec.read(tr)
        if self.inline:
            return Costs(tf=tf, tb=tb, tw=0.0, tr=0.0, tc=tc + (tw + tr) / 2, tcall=tcall)
        return Costs(tf=tf, tb=tb, tw=tw, tr=tr, tc=tc, tcall=tcall, tx=tx)

    def _codec(self) -> CodecCosts:
        if self.codec is None:
            raise ValueError("compressed transfers are priced once the codec's costs are known")
        return self.codec

    def fresh(self, priced: bool = True) -> FreshMemory | None:
        """The price of fresh memory, or None where it is not priced (or ``priced`` is False)."""
        if not priced or not self.fault_s:
            return None
        return FreshMemory(self.warm_buffers, self.fault_s)

    def _tiers(self, capacities: Sequence[int | None] | None, priced: bool,
               compressed: bool = False) -> list[Level2Tier] | None:
        """Level-2's tiers for the model (None: one tier, priced by the closed form alone);
        ``compressed``: holding the codec's output."""
        priced = self.fresh(priced) is not None
        memory = self.in_memory if priced else None
        if self.tier_costs is not None and capacities is not None:
            tiers = [Level2Tier(capacity, tw, tr, in_memory=index == memory)
                     for index, (capacity, (tw, tr)) in enumerate(zip(capacities,
                                                                      self.tier_costs))]
            return [self._codec().tier(tier) for tier in tiers] if compressed else tiers
        if priced:
            costs = self.costs(compressed=compressed)
            return [Level2Tier(None, costs.tw, costs.tr, in_memory=memory == 0)]
        return None

    def choose(self, l1_slots: int | None = None,
               capacities: Sequence[int | None] | None = None, *,
               max_candidates: int = 4096, fresh: bool = True,
               compressed: bool = False) -> IntervalChoice:
        """The interval with the least predicted time with ``l1_slots`` slots (default: the
        checkpointer's), with the baselines' predictions. ``capacities`` bound each tier of a
        tiered Level-2 (priced with its own probed tw and tr). ``fresh``: price the first touch
        of memory beyond the warm buffers. ``compressed``: states go through the codec."""
        return choose_interval(self.n_steps, l1_slots or self.l1_slots,
                               self.costs(busy=True, compressed=compressed),
                               staging_buffers=self.staging_buffers, taping=self.taping,
                               max_candidates=max_candidates,
                               tiers=self._tiers(capacities, fresh, compressed),
                               fresh=self.fresh(fresh))

    def interval_at(self, tf: float, tw: float | None, l1_slots: int,
                    capacities: Sequence[int | None] | None = None, *,
                    compressed: bool = False, max_candidates: int = 32) -> int:
        """The interval with the least predicted time were a step to cost ``tf`` seconds,
        contention included (as a run measures it beside its transfers), and a Level-2 write
        ``tw`` (None: as known; a read then scales with it, as a slower device's does)."""
        costs = self.costs(busy=True, compressed=compressed)
        scale = 1.0 if tw is None or costs.tw <= 0 else tw / costs.tw
        costs = replace(costs, tf=tf, tb=tf + (costs.tb - costs.tf), tx=0.0,
                        tw=costs.tw * scale, tr=costs.tr * scale)
        return choose_interval(self.n_steps, l1_slots, costs,
                               staging_buffers=self.staging_buffers, taping=self.taping,
                               max_candidates=max_candidates,
                               tiers=self._tiers(capacities, False, compressed)).interval

    def price(self, l1_slots: int, interval: int,
              capacities: Sequence[int | None] | None = None, *, fresh: bool = True,
              compressed: bool = False) -> float:
        """Predicted seconds of one plan: ``interval`` with ``l1_slots`` slots, or with
        ``interval`` 0 Revolve in the Level-1 slots alone; ``compressed``: its Level-2 states
        go through the codec."""
        compressed = compressed and interval > 0
        costs = self.costs(busy=interval > 0, compressed=compressed)
        memory = self.fresh(fresh)
        if interval == 0:
            return predict_revolve(self.n_steps, l1_slots, costs, taping=self.taping,
                                   fresh=memory).total_s
        tiers = self._tiers(capacities, fresh, compressed)
        if tiers is None:
            return predict_async_multistage(self.n_steps, interval, l1_slots, costs,
                                            staging_buffers=self.staging_buffers,
                                            taping=self.taping).total_s
        return predict_tiered(self.n_steps, interval, l1_slots, costs, tiers,
                              staging_buffers=self.staging_buffers, taping=self.taping,
                              fresh=memory).total_s

    def probed(self, short: float, long: float, steps: int) -> None:
        """Take tcall and tf from a call of one step (``short`` seconds) and one of ``steps``."""
        tf = (long - short) / (steps - 1)
        if tf <= 0:
            self.tf, self.tcall = max(long / steps, 1e-9), 0.0
        else:
            self.tf, self.tcall = tf, max(short - tf, 0.0)

    def learn(self, stats: Any, fit: CallFit) -> None:
        """Take tf and tcall (fitted over the forward calls of this run and the earlier ones),
        tb (time inside the reverse operator), tc (copies) and tw and tr (time on the Level-2
        path, contention included, less the first touch of fresh pages) from a completed run's
        :class:`Stats`. The compute costs pool this run with the earlier ones of its kind (with
        or without Level-2 transfers beside the compute: see :meth:`costs`), each weighing
        :data:`RUN_DECAY` of the next. A tiered Level-2 learns each tier's tw and tr from its own
        transfers in the run. Transfer costs are means over the run's transfers and what was
        known before (:data:`PRIOR_TRANSFERS`), so a run that moved few states does not
        overturn them. The price of fresh memory (``fault_s``) is revised the same way from the
        buffers the run faulted in: the quiet probe at construction may find pages the process
        just freed, which fault in several times faster than the memory a long run goes on to
        touch. Where a codec ran, its seconds per state and the share of bytes it stored are
        learned the same way (:attr:`codec`), and the transfers' costs are taken back to
        uncompressed states (less the codec's seconds, over the share of bytes stored); from a
        run that compressed every state, only where that raises them."""
        drift = fit.drift(self.tcall)
        # beyond the writes the staging buffers absorb (u_0's alone, say), the I/O thread works
        # beside the compute and the copies for most of the run
        busy = stats.l2_writes > self.staging_buffers and not self.inline
        if drift is not None and not 1 / DRIFT <= drift <= DRIFT:
            self._learn_drifting(stats, fit)
        elif busy:
            self._learn_contention(stats, fit)
            self.busy_calls = self.busy_calls.pooled(fit)
            if self.busy_calls.steps:
                self.tcall_busy, self.tf_busy = _fitted(
                    self.busy_calls, self.tcall if self.tcall_busy is None else self.tcall_busy,
                    self.tf if self.tf_busy is None else self.tf_busy)
            if stats.reverse_steps and self.tf_busy is not None:
                self.tb_busy = self.tf_busy + self.busy_adjoint_mean.add(
                    stats.reverse_compute_s / stats.reverse_steps)
        else:
            self.forward_calls = self.forward_calls.pooled(fit)
            if self.forward_calls.steps:
                self.tcall, self.tf = _fitted(self.forward_calls, self.tcall, self.tf)
            if stats.reverse_steps and self.tf is not None:
                self.tb = self.tf + self.adjoint_mean.add(
                    stats.reverse_compute_s / stats.reverse_steps)
        if stats.copies:  # copies do not drift with the step: each kind of run learns its own
            if busy:
                self.tc_busy = self.busy_copy_mean.add(stats.copy_s / stats.copies)
            else:
                self.tc = self.copy_mean.add(stats.copy_s / stats.copies)
        self._learn_codec(stats)
        # the share of the bytes written that Level-2 stored (1 without a codec)
        stored = (stats.l2_stored_bytes / stats.bytes_written
                  if stats.bytes_written and stats.l2_stored_bytes else 1.0)
        # A run whose every write went through the codec loaded the device with its compressed
        # share of the bytes. Taken back to uncompressed states its costs may only rise: a
        # device faster under a lighter load (a throttled disk with a burst allowance: at a
        # tenth of the load it wrote at 1.9 GB/s, at full load at 0.3) would otherwise price
        # the uncompressed plans, which load it fully, at the compressed ones' speed.
        packed = 0 < stats.l2_writes <= stats.encoded_states

        def revised(known: float, blended: float) -> float:
            return max(known, blended) if packed else blended
        if self.tier_costs is not None and stats.l2_tiers:
            # each tier's transfers as they cost inside the run (a disk's sustained speed, not
            # the one state the probe wrote and read back at once), taken back to uncompressed
            # states by the share of bytes that tier stored: a wavefield's early states, which
            # compress most, fill the fast tier first
            raw = stats.bytes_written / stats.l2_writes if stats.l2_writes else 0.0

            def share(tier: dict[str, float]) -> float:
                written = tier.get("written_bytes", 0)
                if not raw or not tier["writes"] or not written:
                    return stored
                return min(1.0, written / (tier["writes"] * raw))

            self.tier_costs = [
                (revised(tw, _blend(tw, tier["write_s"] / share(tier), tier["writes"])),
                 revised(tr, _blend(tr, tier["read_s"] / share(tier), tier["reads"])))
                for (tw, tr), tier in zip(self.tier_costs, stats.l2_tiers)]
        if self.tier_costs is None:
            # fresh pages are faulted in once: the pool keeps them for the next run
            written = stats.write_busy_s - stats.write_fresh_s - stats.compress_s
            self.tw = revised(self.tw, _blend(self.tw, max(written, 0.0) / stored,
                                              stats.l2_writes))
            self.tr = revised(self.tr, _blend(
                self.tr, max(stats.read_busy_s - stats.decompress_s, 0.0) / stored,
                stats.l2_reads))
        if self.tier_costs is not None:
            if stats.l2_tiers:
                self.tier_costs = self._floored(
                    self.tier_costs, [(tier["write_s"], tier["read_s"]) for tier in stats.l2_tiers],
                    stats)
        else:
            [(self.tw, self.tr)] = self._floored(
                [(self.tw, self.tr)], [(stats.write_busy_s, stats.read_busy_s)], stats)
        if self.fault_s is not None and stats.fresh_buffers:
            self.fault_s = _blend(self.fault_s, stats.fresh_s, stats.fresh_buffers)
        self.runs += 1

    def _floored(self, costs: list[tuple[float, float]], busy: list[tuple[float, float]],
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

    def _learn_drifting(self, stats: Any, fit: CallFit) -> None:
        """Take the compute costs of a run whose step cost changed midway (see :data:`DRIFT`)
        from that run alone, for plans with transfers and without alike: the run's mean step is
        the best guess of the next run's, and pricing one kind of plan from runs that measured
        other costs would decide between them on the change, not on the plans."""
        # a fit over calls whose step cost changed is no measure of a call's own cost: that
        # stays as known, and the run's calls are pooled into neither fit
        self.tf = max((fit.seconds - fit.calls * self.tcall) / fit.steps, 1e-9)
        self.tcall_busy, self.tf_busy = self.tcall, self.tf
        if stats.reverse_steps:
            adjoint = stats.reverse_compute_s / stats.reverse_steps
            self.adjoint_mean, self.busy_adjoint_mean = RunMean(adjoint, 1.0), RunMean(adjoint, 1.0)
            self.tb = self.tb_busy = self.tf + adjoint

    def _learn_contention(self, stats: Any, fit: CallFit) -> None:
        """Revise :attr:`tx` from a run with transfers: its forward calls, copies and (where
        their quiet cost is known) reverse calls beyond their quiet costs, per transfer, blended
        as transfer costs are (:data:`PRIOR_TRANSFERS`; at first with none): the noise of a
        run's compute divided by a few transfers must not price them as dear as a disk
        write."""
        transfers = stats.l2_writes + stats.l2_reads
        if self.tf is None or not transfers or not fit.calls:
            return
        extra = fit.seconds - fit.calls * self.tcall - fit.steps * self.tf
        extra += stats.copy_s - stats.copies * self.tc
        if self.tb is not None:
            extra += stats.reverse_compute_s - stats.reverse_steps * (self.tb - self.tf)
        self.tx = _blend(self.tx or 0.0, max(extra, 0.0), transfers)

    def _learn_codec(self, stats: Any) -> None:
        """Revise :attr:`codec` from the states the codec compressed and decompressed in a run."""
        encoded, decoded = stats.encoded_states, stats.decoded_states
        if not encoded:
            return
        stored = max(stats.encoded_stored_bytes, 1) / max(stats.encoded_bytes, 1)
        known = self.codec
        if known is None:  # a read is priced as a write until one is measured
            compress = stats.compress_s / encoded
            self.codec = CodecCosts(compress, stats.decompress_s / decoded if decoded
                                    else compress, min(stored, 1.0))
            return
        self.codec = CodecCosts(
            compress_s=_blend(known.compress_s, stats.compress_s, encoded),
            decompress_s=_blend(known.decompress_s, stats.decompress_s, decoded),
            stored=min(1.0, _blend(known.stored, stored * encoded, encoded)))

    def record(self, choice: IntervalChoice) -> dict[str, Any]:
        """What goes into ``Stats.calibration``."""
        costs = self.costs()
        return {
            "tf_s": costs.tf, "tb_s": costs.tb, "tcall_s": costs.tcall, "tw_s": self.tw,
            "tr_s": self.tr, "tc_s": self.tc, "tf_busy_s": self.tf_busy,
            "tcall_busy_s": self.tcall_busy, "tb_busy_s": self.tb_busy, "tc_busy_s": self.tc_busy,
            "tx_s": self.tx,
            "tb_measured": self.tb is not None,
            "learned_runs": self.runs, "transfers": "inline" if self.inline else "background",
            "taping": self.taping, "interval": choice.interval,
            "fault_s": self.fault_s, "warm_buffers": self.warm_buffers,
            "codec": None if self.codec is None else asdict(self.codec),
            "predicted_total_s": choice.prediction.total_s,
            "predicted_revolve_s": choice.revolve.total_s,
            "predicted_store_all_s": choice.store_all.total_s,
        }


class CostMemory:
    """The costs measured in this process, by what they depend on (:func:`cost_key`), so the
    next checkpointer of the same operators and state size (a fresh ``Revolver`` per gradient,
    as Devito builds it) starts from them instead of probing. Thread-safe; what it holds and
    hands out are copies."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._tuners: dict[tuple[object, ...], IntervalTuner] = {}

    def __len__(self) -> int:
        with self._lock:
            return len(self._tuners)

    def recall(self, key: tuple[object, ...], tuner: IntervalTuner, *,
               otherwise: tuple[object, ...] | None = None) -> IntervalTuner:
        """``tuner`` with the costs the last run under ``key`` measured, else those under
        ``otherwise`` (the other protocol's: a first taping-free run after taping ones starts
        from their reverse call's cost instead of guessing it), if any."""
        with self._lock:
            known = self._tuners.get(key)
            if known is None and otherwise is not None:
                known = self._tuners.get(otherwise)
            known = deepcopy(known)
        if known is None:
            return tuner
        same_tiers = (known.tier_costs is not None and tuner.tier_costs is not None
                      and len(known.tier_costs) == len(tuner.tier_costs))
        same_paths = same_tiers or (known.tier_costs is None and tuner.tier_costs is None)
        return replace(tuner, tw=known.tw, tr=known.tr, tc=known.tc, tf=known.tf, tb=known.tb,
                       tcall=known.tcall, runs=known.runs, fault_s=known.fault_s,
                       forward_calls=known.forward_calls, adjoint_mean=known.adjoint_mean,
                       copy_mean=known.copy_mean, tf_busy=known.tf_busy,
                       tcall_busy=known.tcall_busy, tb_busy=known.tb_busy,
                       tc_busy=known.tc_busy, busy_calls=known.busy_calls,
                       busy_adjoint_mean=known.busy_adjoint_mean,
                       busy_copy_mean=known.busy_copy_mean,
                       codec=tuner.codec if known.codec is None else known.codec,
                       tx=known.tx,
                       tier_costs=known.tier_costs if same_tiers else tuner.tier_costs,
                       loaded_costs=known.loaded_costs if same_paths and known.loaded_costs
                       is not None else tuner.loaded_costs)

    def keep(self, key: tuple[object, ...], tuner: IntervalTuner) -> None:
        """Keep ``tuner``'s measured costs for the next checkpointer under ``key``."""
        with self._lock:
            self._tuners[key] = deepcopy(tuner)

    def forget(self) -> None:
        """Forget every cost measured in this process: the next "auto" checkpointer probes
        anew."""
        with self._lock:
            self._tuners.clear()


#: The process's cost memory (``asyncckpt.cost_memory``).
COSTS = CostMemory()


#: The tuner's costs on which every rank takes the largest: the slowest rank sets the pace of
#: all, since every operator call waits for it (and every rank waits for the one paying most
#: to fault memory in).
AGREED_LARGEST = ("tf", "tb", "tcall", "tw", "tr", "tc", "fault_s", "tf_busy", "tcall_busy",
                  "tb_busy", "tc_busy", "tx")


def agree_costs(tuner: IntervalTuner, group: Any) -> None:
    """Give ``tuner`` the largest of every rank's costs (:data:`AGREED_LARGEST`, each tier's
    and the codec's too), the fewest warm buffers and the first tier any rank holds in process
    memory (``group``: the ranks, :mod:`asyncckpt._mpi`)."""
    mine = {name: getattr(tuner, name) for name in (*AGREED_LARGEST, "warm_buffers",
                                                    "tier_costs", "codec", "in_memory")}
    every = group.exchange(mine)
    # Level-2 in process memory on any rank prices its states' faults on all: a rank whose
    # Level-2 is a directory and one whose is DRAM would otherwise price plans differently
    held = [costs["in_memory"] for costs in every if costs["in_memory"] is not None]
    tuner.in_memory = min(held) if held else None
    for name in AGREED_LARGEST:
        known = [costs[name] for costs in every if costs[name] is not None]
        setattr(tuner, name, max(known) if known else None)
    tuner.warm_buffers = min(costs["warm_buffers"] for costs in every)
    codecs = [costs["codec"] for costs in every]
    tuner.codec = (None if None in codecs else
                   CodecCosts(*(max(getattr(codec, name) for codec in codecs)
                                for name in ("compress_s", "decompress_s", "stored"))))
    if tuner.tier_costs is not None:
        tuner.tier_costs = [
            (max(costs["tier_costs"][i][0] for costs in every),
             max(costs["tier_costs"][i][1] for costs in every))
            for i in range(len(tuner.tier_costs))]
