"""``interval="auto"`` and ``"adaptive"`` for one checkpointer: the tuner of its costs, the probe
of a first run, the choice of each run's plan and what a completed run teaches.

The model and the tuner live in :mod:`schedules.model` and :mod:`asyncckpt._tuning.tuner`;
this module joins them to the checkpointer's planner, Level-1, Level-2 and ranks.
"""
from __future__ import annotations

import logging
import math
import time
from typing import Any

from schedules.model import CodecCosts, adaptive_interval, predict_adaptive

from .._memory.buffers import padded
from .calibrate import measure_fault, probe_forward
from .._execution.engine import TransferEngine
from .._execution.interpreter import Interpreter, Level1
from .._execution.link import HostLink
from .._execution.ranks import Ranks
from .._planning.plan import Planner
from .._memory.pool import POOL
from .choice import Plan, cheapest_near_fastest, explored, fastest_once_warm
from .cost_memory import COSTS, agree_costs
from .fresh import probe_buffers
from .plans import PRICED_INTERVALS, candidate_plans, codec_choices, log_plans
from .tuner import CallFit, Completed, IntervalTuner
from ..stats import Stats
from ..storage import CompressedStorage, Storage, memory_tier, tiers_of

__all__ = ["AutoPlanner", "cost_key", "PRICED_INTERVALS"]

log = logging.getLogger(__name__)


def cost_key(fwd: object, rev: object, nbytes: int, storage: Storage, transfers: str,
             taping: bool, codec: object = None) -> tuple[object, ...]:
    """What the measured unit costs depend on: the operators' kinds, the state size, the
    Level-2 device, its codec and the protocol: taping runs a forward and a reverse call by
    turns at every reverse step, and their steps cost more than taping-free runs' do
    (docs/measurements.md). The first checkpointer of one protocol starts from what runs of
    the other measured (:meth:`~asyncckpt._tuning.cost_memory.CostMemory.recall`)."""
    def describe(tier: Storage) -> str:
        config = tier.get_config()
        return str(sorted(config.items())) if config else type(tier).__qualname__

    device = " then ".join(describe(tier) for tier in tiers_of(storage))
    return (type(fwd).__module__, type(fwd).__qualname__, type(rev).__module__,
            type(rev).__qualname__, nbytes, device, transfers, taping, repr(codec))


#: Step and write costs an adaptive run prices its least interval at: each within 25% (log
#: scale) of one priced before takes that one's interval (a pricing costs milliseconds).
LEAST_GRAIN = math.log(1.25)


class AutoPlanner:
    """Chooses each run's plan from costs measured on this process's runs.

    Parameters
    ----------
    planner : Planner
        Where the chosen slots and interval go.
    tuner : IntervalTuner
        The costs known at construction (probed Level-2 transfers, and what earlier
        checkpointers of the same key measured).
    key : tuple
        The key the costs are remembered under (:func:`cost_key`).
    slots_fixed : bool
        Whether the user gave ``l1_slots`` (else a budget's split is chosen too).
    compressor : CompressedStorage or None
        Level-2's codec, if any: it compresses every run's states, or with ``compress_auto``
        those of runs whose plan is priced faster compressed (and samples the others').
    """

    #: with ``compression="auto"``, the codec runs on some states of a run that does not
    #: compress (their cost and ratio on the run's own states, for the next plan): every
    #: SAMPLE_EVERY-th, or fewer, SAMPLES_PER_RUN spread over the run, where it moves more
    #: states. Each sample costs a compression on a core the compute shares and a larger
    #: write (docs/compression.md)
    SAMPLE_EVERY = 8
    SAMPLES_PER_RUN = 8

    def __init__(self, planner: Planner, tuner: IntervalTuner, key: tuple[object, ...], *,
                 slots_fixed: bool, level1: Level1, engine: TransferEngine, link: HostLink,
                 ranks: Ranks,
                 on_host: bool, compressor: CompressedStorage | None = None,
                 compress_auto: bool = False, level2_required: bool = False) -> None:
        self.planner = planner
        self.tuner = tuner
        self.key = key
        self.slots_fixed = slots_fixed
        self.level1 = level1
        self.engine = engine
        self.link = link
        self.ranks = ranks
        self.compressor = compressor
        self.compress_auto = compress_auto and compressor is not None
        #: a run directory's run: only plans that store states on Level-2 (they are what it
        #: commits; Revolve in Level-1 alone would leave nothing to resume from)
        self.level2_required = level2_required
        if self.compress_auto:
            assert compressor is not None
            compressor.compress_every = self.SAMPLE_EVERY  # until a run's plan compresses
        if on_host and tuner.fault_s is None:
            most = probe_buffers(planner, level1.made, engine, slots_fixed)
            tuner.fault_s = measure_fault(planner.memory.nbytes, most=most)
        self._compressed = False  # whether the run's plan compresses its Level-2 states
        self._intervals: dict[tuple[int, int | None], int] = {}

    @classmethod
    def make(cls, planner: Planner, *, fwd: object, rev: object, transfers: str,
             transfer_costs: tuple[float, float], tier_costs: list[tuple[float, float]] | None,
             copy_s: float, staging_buffers: int, codec_costs: CodecCosts | None = None,
             **parts: Any) -> "AutoPlanner":
        """The planner for a new checkpointer, its tuner starting from the costs remembered
        under its key (or the other protocol's); ``codec_costs``: the codec's, as probed."""
        memory = planner.memory
        storage = planner.storage
        compressor = parts.get("compressor")
        codec = None if compressor is None else compressor.codec
        device = storage if compressor is None else compressor.inner  # what the codec writes to
        key = cost_key(fwd, rev, memory.nbytes, device, transfers, memory.taping, codec)
        other = cost_key(fwd, rev, memory.nbytes, device, transfers, not memory.taping, codec)
        tw, tr = transfer_costs
        # a device outside process memory was probed with a burst of states in a row: a light
        # run is not to price it below that (see LOADED)
        paths = zip(tiers_of(storage), tier_costs or [transfer_costs])
        loaded: list[tuple[float | None, float | None]] = [
            (None, None) if tier.holds_process_memory else costs for tier, costs in paths]
        fresh = IntervalTuner(
            memory.n_timesteps or 100 * (planner.l1_slots + 1), planner.l1_slots,
            staging_buffers, transfers == "inline", memory.taping, tw=tw, tr=tr, tc=copy_s,
            tier_costs=tier_costs, in_memory=memory_tier(storage), codec=codec_costs,
            loaded_costs=loaded)
        return cls(planner, COSTS.recall(key, fresh, otherwise=other), key, **parts)

    def nominal_n(self) -> int:
        """n for the model: the run's, or for runs of unknown length the last one's (at first,
        long enough for intervals of any length the slots favour)."""
        n = self.planner.n_timesteps
        if n is not None:
            return n
        return self.tuner.n_steps if self.tuner.runs else 100 * (self.planner.l1_slots + 1)

    def warm_buffers(self) -> int:
        """State buffers already faulted in that the next run can use: its slots, the
        engine's, the process pool's, and the spares of a DRAM Level-2."""
        nbytes = self.planner.memory.nbytes
        return (self.level1.made + self.engine.buffers_held + POOL.count(padded(nbytes))
                + self.planner.storage.spares(nbytes))

    def before_run(self, stats: Stats, interpreter: Interpreter) -> None:
        """Probe (a first run of known n), then choose the run's plan; a first run of unknown
        length starts from interval 1."""
        tuner = self.tuner
        n = self.planner.n_timesteps
        if n is not None and n <= 1:
            return
        try:
            if tuner.tf is None and n is not None:
                self._probe(stats, interpreter)
            if tuner.tf is not None:
                self._choose(stats)
            else:
                self.planner.with_interval(1)
        except BaseException as failure:
            self.ranks.fail(failure)  # the other ranks must not wait for this one
            raise

    def after_run(self, stats: Stats, fit: CallFit) -> None:
        """Learn the completed run's costs (or hold a doubtful run's: see
        :meth:`~asyncckpt._tuning.tuner.IntervalTuner.take`) and remember them."""
        predicted = stats.calibration.get("predicted_total_s")
        over = None
        if predicted:
            over = stats.calibration["measured_over_predicted"] = stats.total_s / predicted
            # the slowest rank's: every rank holds or learns the same runs, so prices agree
            over = self.ranks.max(over)
        # a step's cost in the run's second half over its first (see costs.DRIFT)
        stats.calibration["step_drift"] = fit.drift(self.tuner.tcall)
        planner = self.planner
        priced = planner.n_timesteps is not None and not planner.adaptive
        run = Completed(stats, fit, over, priced, planner.capacities(stats.l1_slots) if priced
                        else None, self._compressed)
        stats.calibration["doubted"] = not self.tuner.take(run)
        if self.planner.n_timesteps is None:
            self.tuner.n_steps = stats.n_timesteps  # the next run's best guess of n
        COSTS.keep(self.key, self.tuner)

    def _probe(self, stats: Stats, interpreter: Interpreter) -> None:
        """Time the opening forward calls (see
        :func:`~asyncckpt._tuning.calibrate.probe_forward`). u_0 is kept in a Level-1 slot and
        restored, so the schedule then runs from u_0 as it is."""
        n = self.planner.n_timesteps
        arrays = interpreter.arrays
        link = self.link
        tuner = self.tuner
        assert n is not None  # runs of unknown length are not probed
        held = self.level1.take()
        try:
            link.copy_out(arrays(0, into=False), held)
            lengths, seconds = probe_forward(interpreter.fwd_operator, n, settle=link.settle)
            stats.forward_compute_s += sum(seconds)
            stats.forward_steps += sum(lengths)
            stats.probe_steps = sum(lengths)
            if len(lengths) == 3:
                tuner.probed(seconds[1], seconds[2], lengths[2])
            else:
                tuner.tf = max(seconds[0], 1e-9)
                tuner.tcall = 0.0
            link.copy_in(held, arrays(0, into=True))
        finally:
            self.level1.give(held)

    def _plans(self) -> list[Plan]:
        """The plans this run may take (:func:`~asyncckpt._tuning.plans.candidate_plans`)."""
        codecs = codec_choices(self.tuner, self.compressor is not None, self.compress_auto)
        return candidate_plans(self.tuner, self.planner, codecs, slots_fixed=self.slots_fixed,
                               compress_auto=self.compress_auto,
                               level2_required=self.level2_required)

    def _choose(self, stats: Stats) -> None:
        """Take the schedule the model predicts fastest once memory is warm, or after a first
        run one within :data:`~asyncckpt._tuning.tuner.NEAR_TIE` of it that faults in less fresh
        memory: an interval, or Revolve in Level-1 alone; under a budget without fixed slots,
        the budget's split between Level-1 slots and the DRAM tier too. A kind of plan no run
        has measured, priced within :data:`~asyncckpt._tuning.choice.EXPLORE` of that, runs
        once instead (:func:`~asyncckpt._tuning.choice.explored`). The prediction adds the
        faults of memory no earlier run left (:mod:`asyncckpt._tuning.tuner`)."""
        began = time.perf_counter()
        tuner = self.tuner
        planner = self.planner
        tuner.n_steps = self.nominal_n()
        tuner.warm_buffers = self.warm_buffers()
        agree_costs(tuner, self.ranks)
        plans = self._plans()
        plan = (cheapest_near_fastest(plans, traffic_priced=tuner.tx is not None)
                if tuner.runs else fastest_once_warm(plans))
        chosen = plan
        if tuner.runs and not planner.adaptive:  # the runs whose residual is learned
            plan = explored(plans, plan, lambda plan: tuner.measured(plan.transfers))
        if log.isEnabledFor(logging.DEBUG):
            log_plans(log, tuner, plans, plan)
        interval = plan.interval
        planner.use_slots(plan.slots)
        if self.compress_auto:
            assert self.compressor is not None
            self.compressor.compress_every = 1 if plan.compressed else max(
                self.SAMPLE_EVERY, -(-plan.transfers // self.SAMPLES_PER_RUN))
        self._compressed = plan.compressed
        self._intervals.clear()
        stats.calibration = tuner.record(plan.choice)
        stats.calibration.update(interval=interval, predicted_total_s=plan.total_s,
                                 predicted_faults_s=plan.faults_s, compressed=plan.compressed,
                                 explored=plan is not chosen,
                                 planning_s=time.perf_counter() - began)
        # every input is agreed, so one plan is expected; where not, the error says from what
        self.ranks.same("the plan (l1_slots, interval; 0: Level-1 alone)",
                        (planner.l1_slots, interval),
                        context=lambda: {
                            "costs": tuner.costs(), "n": tuner.n_steps, "runs": tuner.runs,
                            "inline": tuner.inline, "warm_buffers": tuner.warm_buffers,
                            "plans": [(p.slots, p.interval, p.warm_s) for p in plans]})
        if interval == 0:
            planner.level1_only()  # Revolve in the Level-1 slots alone: no Level-2 at all
        else:
            # the slots the last plan made beyond this one's go before Level-2 reserves its
            # room (a tmpfs file is backed at once: 40 MiB of slots beside 30 MiB of it)
            self.level1.shed(planner.l1_slots)
            planner.with_interval(interval)
            n = planner.n_timesteps
            if planner.adaptive and n is not None:
                costs = tuner.costs(compressed=plan.compressed)
                adaptive = predict_adaptive(n, planner.l1_slots, costs, min_interval=interval,
                                            staging_buffers=tuner.staging_buffers,
                                            taping=planner.memory.taping)
                stats.calibration.update(predicted_total_s=adaptive.total_s,
                                         adaptive_interval=adaptive_interval(costs, interval))
        planner.predicted_s = stats.calibration["predicted_total_s"]
        stats.l1_slots = planner.l1_slots
        stats.l1_bytes = planner.l1_bytes

    def interval_for(self, tf: float, tw: float | None) -> int:
        """The interval the model finds fastest for the run's slots were its steps to cost
        ``tf`` seconds each and its writes ``tw`` (as an adaptive run measures them); kept per
        quarter of a step's and a write's cost, so a run prices a few."""
        key = (round(math.log(tf) / LEAST_GRAIN), None if tw is None or tw <= 0
               else round(math.log(tw) / LEAST_GRAIN))
        least = self._intervals.get(key)
        if least is None:
            planner = self.planner
            least = self.tuner.interval_at(tf, tw, planner.l1_slots,
                                           planner.capacities(planner.l1_slots),
                                           compressed=self._compressed)
            self._intervals[key] = least
        return least
