"""What the model is asked: a checkpointer's measured costs, priced into the schedule they
call for (:class:`Pricing`); :mod:`asyncckpt._tuning.tuner` revises them from completed runs."""
from __future__ import annotations

from collections.abc import Sequence
from dataclasses import replace
from typing import Any

from schedules.model import (CodecCosts, Costs, IntervalChoice, Level2Tier,
                             choose_interval, predict_async_multistage, predict_revolve,
                             predict_tiered)

from .caller import PRIOR_TX_COPIES, CallerShare
from .costs import ComputeCosts, TransferCosts
from .fresh import FreshMemory
from .residual import Residual

__all__ = ["Pricing", "PRIOR_TX_COPIES"]


class _Kept:
    """A cost kept in one of the tuner's parts (``part``), read and set by the name the tuner
    has always given it."""

    def __init__(self, part: str, name: str) -> None:
        self.part = part
        self.name = name

    def __get__(self, tuner: Any, owner: type | None = None) -> Any:
        return getattr(getattr(tuner, self.part), self.name)

    def __set__(self, tuner: Any, value: Any) -> None:
        setattr(getattr(tuner, self.part), self.name, value)


class Pricing:
    """A checkpointer's measured costs and what the model predicts of plans at them.

    The costs live in small parts: the compute costs of runs without Level-2 transfers beside
    the compute (:attr:`quiet`) and with them (:attr:`busy`), each a
    :class:`~asyncckpt._tuning.costs.ComputeCosts`; Level-2's transfer costs with their
    floors (:attr:`transfers`); what each transfer takes from the compute beside it
    (:attr:`tx`); the codec's costs (:attr:`codec`); and the price of fresh memory
    (:attr:`fault_s`, :attr:`warm_buffers`, :attr:`in_memory`). Each is readable and settable
    by its name (``tf``, ``tf_busy``, ``tw``, ...), to ask the model what it would choose with
    other costs. ``tw`` and ``tr`` start from a probe of the runtime's own I/O path, ``tf`` and
    ``tcall`` from a probe of the first run's opening calls; every completed run revises them
    (:meth:`~asyncckpt._tuning.tuner.IntervalTuner.learn`).
    """

    slack = 0  #: the ring's slack (schedules.Costs.slack) where proven

    tf = _Kept("quiet", "tf")
    tcall = _Kept("quiet", "tcall")
    tb = _Kept("quiet", "tb")
    tc = _Kept("quiet", "tc")
    forward_calls = _Kept("quiet", "calls")
    adjoint_mean = _Kept("quiet", "adjoint_mean")
    copy_mean = _Kept("quiet", "copy_mean")
    tf_busy = _Kept("busy", "tf")
    tcall_busy = _Kept("busy", "tcall")
    tb_busy = _Kept("busy", "tb")
    tc_busy = _Kept("busy", "tc")
    busy_calls = _Kept("busy", "calls")
    busy_adjoint_mean = _Kept("busy", "adjoint_mean")
    busy_copy_mean = _Kept("busy", "copy_mean")
    tw = _Kept("transfers", "tw")
    tr = _Kept("transfers", "tr")
    tier_costs = _Kept("transfers", "tier_costs")
    loaded_costs = _Kept("transfers", "loaded_costs")
    residual = _Kept("misses", "per_step")
    missed = _Kept("misses", "missed")
    tq = _Kept("caller", "per_transfer")

    def __init__(self, n_steps: int, l1_slots: int, staging_buffers: int, inline: bool,
                 taping: bool, tw: float, tr: float, tc: float, tf: float | None = None,
                 tb: float | None = None, tcall: float = 0.0, runs: int = 0,
                 tier_costs: list[tuple[float, float]] | None = None,
                 in_memory: int | None = None, fault_s: float | None = None,
                 warm_buffers: int = 0, tx: float | None = None,
                 codec: CodecCosts | None = None,
                 loaded_costs: list[tuple[float | None, float | None]] | None = None) -> None:
        self.n_steps = n_steps
        self.l1_slots = l1_slots
        self.staging_buffers = staging_buffers
        self.inline = inline
        self.taping = taping
        self.runs = runs
        self.quiet = ComputeCosts(tf=tf, tcall=tcall, tb=tb, tc=tc)
        self.busy = ComputeCosts()
        self.transfers = TransferCosts(tw, tr, tier_costs, loaded_costs)
        #: what each Level-2 transfer takes from the compute beside it (None: not measured)
        self.tx = tx
        #: the codec in front of Level-2 per state (None: no codec, or not measured yet);
        #: ``tw``, ``tr`` and ``tier_costs`` are those of uncompressed states
        self.codec = codec
        #: the tier whose states occupy process memory (0 for an untiered one in host DRAM)
        self.in_memory = in_memory
        #: seconds to fault in one fresh state buffer (None: not measured, not priced)
        self.fault_s = fault_s
        #: state buffers already faulted in that the next run can use
        self.warm_buffers = warm_buffers
        #: what runs took beyond the model's price of their plan (``residual``: per step)
        self.misses = Residual()
        #: the runtime's own work on the caller's thread per call and per transfer (``tq``)
        self.caller = CallerShare()

    def __repr__(self) -> str:
        def ms(value: float | None) -> str:
            return "-" if value is None else f"{value * 1e3:.3g} ms"
        return (f"IntervalTuner(n_steps={self.n_steps}, tf={ms(self.tf)}, tb={ms(self.tb)}, "
                f"tcall={ms(self.tcall)}, tc={ms(self.tc)}, tw={ms(self.tw)}, "
                f"tr={ms(self.tr)}, tf_busy={ms(self.tf_busy)}, tx={ms(self.tx)}, "
                f"runs={self.runs})")

    def costs(self, *, busy: bool = False, compressed: bool = False) -> Costs:
        """The model's costs. Inline transfers run on the caller's thread: they add to the copy
        cost of a store or load instead of overlapping. ``busy``: the costs of a plan with
        Level-2 transfers, whose steps and copies run beside the I/O thread's checksums and
        reads, as runs with them measured (docs/model.md); each cost is taken from the other
        kind of run until one of this kind has measured it. Until a reverse sweep is timed, a
        reverse step (taping step included) is two forward steps. ``compressed``: transfers
        go through the codec (:attr:`codec`).

        Once a run with transfers has measured what each one takes from the compute
        (:attr:`tx`), a busy plan is priced with the quiet costs and ``tx`` per transfer
        instead, so that a plan moving fewer states is priced nearer its quiet cost, where flat
        busy costs, measured at a short interval, price it as dear as that one."""
        assert self.tf is not None
        quiet = (*self._run_step(), self.quiet.adjoint, self._run_copy_s())
        beside = (self.busy.tf, self.busy.tcall, self.busy.adjoint, self.busy.tc)
        tx = self._tx()
        split = self._split(busy)
        if split:
            # quiet costs and tx per transfer; the reverse call's contention is in tx only
            # where its quiet cost is known (see learn)
            beside = (None, None, beside[2] if quiet[2] is None else None, None)
        else:
            tx = 0.0
        beside_first = busy and not self.inline
        first = beside if beside_first else quiet
        then = quiet if beside_first else beside
        tf, tcall, adjoint, tc = (a if a is not None else b for a, b in zip(first, then))
        assert tf is not None and tcall is not None and tc is not None
        tb = tf + (adjoint if adjoint is not None else tf)
        residual, per_transfer = self.misses.of(busy, split)
        if residual:  # a forward step (and the one a taping reverse step makes) costs it
            tf = max(tf + residual, tf / 2)
            tb = max(tb + residual, tb / 2)
        tx = max((tx or 0.0) + per_transfer, 0.0) + (self.tq or 0.0 if busy else 0.0)
        tw = self.tw
        tr = self.tr
        if compressed:
            codec = self._codec()
            tw = codec.write(tw)
            tr = codec.read(tr)
        slack = self.slack
        if self.inline:  # a kept load saves no read folded in here: none is priced
            tw, tr, tc, tx, slack = 0.0, 0.0, tc + (tw + tr) / 2, 0.0, 0
        return Costs(tf=tf, tb=tb, tw=tw, tr=tr, tc=tc, tcall=tcall, tx=tx, slack=slack)

    def _tx(self) -> float | None:
        """What a transfer takes from the compute beside it (None: not known)."""
        busy = (self.busy.tf, self.busy.tcall, self.busy.adjoint, self.busy.tc)
        copy_s = self._run_copy_s()
        if self.tx is None and busy == (None,) * 4 and copy_s is not None:
            # no run beside transfers yet: each takes the memory bandwidth of its passes over
            # the state (the transfer's and its checksum's) from the compute beside it
            return PRIOR_TX_COPIES * copy_s
        return self.tx

    def _split(self, busy: bool) -> bool:
        """Whether a plan (``busy``: with Level-2) is priced at quiet costs plus ``tx`` per
        transfer (see :meth:`costs`)."""
        return busy and not self.inline and self._tx() is not None

    def beside_transfers(self, l2_writes: int) -> bool:
        """Whether a run writing ``l2_writes`` states to Level-2 runs its compute beside the
        I/O thread for most of the run: beyond the writes the staging buffers absorb (u_0's
        alone, say), and not inline (inline transfers run beside nothing)."""
        return l2_writes > self.staging_buffers and not self.inline

    def measured(self, l2_writes: int) -> bool:
        """Whether a run of the kind of a plan writing ``l2_writes`` states was learned from."""
        kind = self.busy if self.beside_transfers(l2_writes) else self.quiet
        return bool(kind.copy_mean.weight)

    def _run_step(self) -> tuple[float | None, float | None]:
        """A forward step and call as a run pays them, for plans priced at quiet costs: as
        runs without transfers measured them, else as runs with them did, else as the probe
        did. The probe's burst of calls from u_0 is cheaper (Devito 3D: 0.78 ms a step probed,
        1.03 to 1.25 ms in runs); charged to the first run's transfers, that gap priced
        interval 2 out."""
        if self.measured(0) or None in (self.busy.tf, self.busy.tcall):
            return self.quiet.tf, self.quiet.tcall
        return self.busy.tf, self.busy.tcall

    def _run_copy_s(self) -> float | None:
        """A copy within Level-1 as a run pays it, for plans without transfers: as their runs
        measured it, else as runs with transfers did, else as the probe did. The probe copies
        memory the cache holds; a run, slots it touched long before (Devito 3D, 6 MiB states:
        0.29 ms probed, 0.52 to 0.69 ms in runs), and Revolve priced with the probe's copies
        ran 1.17 times its price."""
        if self.measured(0) or self.busy.tc is None:
            return self.quiet.tc
        return self.busy.tc

    def _codec(self) -> CodecCosts:
        if self.codec is None:
            raise ValueError("compressed transfers are priced once the codec's costs are known")
        return self.codec

    def fresh(self, priced: bool = True) -> FreshMemory | None:
        """The price of fresh memory, or None where it is not priced (or ``priced`` is False)."""
        if not priced or not self.fault_s:
            return None
        return FreshMemory(self.warm_buffers, self.fault_s)

    def tiers_for_model(self, capacities: Sequence[int | None] | None, priced: bool,
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
        # one device, bounded where its room is short of what a run could write
        capacity = capacities[0] if capacities is not None else None
        if priced or capacity is not None:
            costs = self.costs(compressed=compressed)
            return [Level2Tier(capacity, costs.tw, costs.tr, in_memory=memory == 0)]
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
                               tiers=self.tiers_for_model(capacities, fresh, compressed),
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
                               tiers=self.tiers_for_model(capacities, False, compressed)).interval

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
        tiers = self.tiers_for_model(capacities, fresh, compressed)
        if tiers is None:
            total = predict_async_multistage(self.n_steps, interval, l1_slots, costs,
                                             staging_buffers=self.staging_buffers,
                                             taping=self.taping).total_s
        else:
            total = predict_tiered(self.n_steps, interval, l1_slots, costs, tiers,
                                   staging_buffers=self.staging_buffers, taping=self.taping,
                                   fresh=memory).total_s
        return max(total + self.misses.per_run(True, self._split(True)), total / 2)
