"""``interval="auto"``: the schedule the performance model predicts fastest, from costs measured
on the real run (docs/model.md says what each cost is and how it is measured).

A forward call of k steps costs ``tcall + k tf``: both are fitted by least squares over every
forward call of a run. Copies and Level-2 transfers are priced as they cost inside the run
(cache-cold, beside the compute), not as a quiet probe measures them. Memory a run touches for
the first time costs a page fault per page; buffers are kept for the next run
(:mod:`asyncckpt._memory.pool`), so "auto" chooses the schedule fastest once memory is warm (an
adjoint code evaluates many gradients) and predicts each run with the faults it will pay.
"""
from __future__ import annotations

from collections.abc import Sequence
from copy import deepcopy
from dataclasses import asdict, dataclass, replace
from typing import Any

from schedules.model import CodecCosts, IntervalChoice

from .._execution.timing import RUN_DECAY, CallFit
from .choice import NEAR_TIE, Plan, cheapest_near_fastest, fastest_once_warm
from .costs import DRIFT, LOADED, PRIOR_TRANSFERS, RunMean, blend
from .pricing import PRIOR_TX_COPIES, Pricing
from .residual import Residual

__all__ = ["CallFit", "RunMean", "IntervalTuner", "Plan", "NEAR_TIE", "RUN_DECAY", "LOADED",
           "PRIOR_TRANSFERS", "PRIOR_TX_COPIES", "fastest_once_warm", "cheapest_near_fastest",
           "DOUBT", "Completed"]

#: A run that took more than this many times its prediction teaches nothing alone: it waits for
#: the next run to take as much beyond its own (then both are learned) or not (then it is
#: dropped). A plan priced too dear is not run again to correct it, where one priced too cheap
#: is: one run of interval 6 slowed by the shared machine to 1.49 times its price priced every
#: plan with Level-2 above Revolve for the rest of the gradients, 15% slower (Devito 3D,
#: 79x57x67 at 1% of the states). 1.3 is beyond 96% of the runs after the first that
#: bench_devito recorded (282 runs, median 1.05).
DOUBT = 1.3


@dataclass(frozen=True)
class Completed:
    """A completed run as the tuner learns from it: its :class:`Stats`, its forward calls
    (``fit``), the seconds it took over its prediction (``over``: the largest over the ranks;
    None: not predicted), and for a plan of known n priced whole (not adaptive) the Level-2
    capacities and codec its price is taken at (``priced``)."""

    stats: Any
    fit: CallFit
    over: float | None
    priced: bool
    capacities: Sequence[int | None] | None = None
    compressed: bool = False

    @property
    def doubtful(self) -> bool:
        """Whether the run took more than :data:`DOUBT` times its prediction (a run that
        probed, priced from the probes, is never doubted)."""
        return self.over is not None and self.over > DOUBT and not self.stats.probe_steps


class IntervalTuner(Pricing):
    """Measured costs of a checkpointer's runs and the schedule they call for: the costs and
    what the model is asked of them are :class:`~asyncckpt._tuning.pricing.Pricing`'s; the
    tuner takes them from the probes of a first run (:meth:`probed`) and revises them from
    every completed run (:meth:`learn`, :meth:`learn_residual`).
    """

    #: a run beyond :data:`DOUBT` of its prediction that waits for the next to confirm it
    doubted: Completed | None = None

    def take(self, run: Completed) -> bool:
        """Learn from ``run`` (:meth:`learn`, and :meth:`learn_residual` where it was priced)
        unless it is the first in a row beyond :data:`DOUBT` of its prediction: that one is
        held until the next run, which learns it too where it also went beyond, else drops
        it. Returns whether ``run`` was learned."""
        held, self.doubted = self.doubted, None
        if not run.doubtful:
            held = None  # not confirmed: dropped
        elif held is None:
            self.doubted = replace(run, stats=deepcopy(run.stats))
            return False
        for taken in (run,) if held is None else (held, run):
            self.learn(taken.stats, taken.fit)
            if taken.priced:
                self.learn_residual(taken.stats, taken.capacities,
                                    compressed=taken.compressed)
        return True

    def probed(self, short: float, long: float, steps: int) -> None:
        """Take tcall and tf from a call of one step (``short`` seconds) and one of ``steps``."""
        tf = (long - short) / (steps - 1)
        if tf <= 0:
            self.tf = max(long / steps, 1e-9)
            self.tcall = 0.0
        else:
            self.tf = tf
            self.tcall = max(short - tf, 0.0)

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
        just freed, which fault in faster than the memory a long run goes on to touch. Where a
        codec ran, its seconds per state and the share of bytes it stored are learned the same
        way (:attr:`codec`), and the transfers' costs are taken back to
        uncompressed states (less the codec's seconds, over the share of bytes stored); from a
        run that compressed every state, only where that raises them."""
        drift = fit.drift(self.tcall)
        busy = self.beside_transfers(stats.l2_writes)
        if drift is not None and not 1 / DRIFT <= drift <= DRIFT:
            self._learn_drifting(stats, fit)
        elif busy:
            self.busy.learn(stats, fit, self.quiet)
            self._learn_contention(stats, fit)
        else:
            self.quiet.learn(stats, fit, self.quiet)
        (self.busy if busy else self.quiet).learn_copies(stats)
        if not self.inline:
            self.caller.learn(stats, busy)
        self._learn_codec(stats)
        # the share of the bytes written that Level-2 stored (1 without a codec)
        stored = (stats.l2_stored_bytes / stats.bytes_written
                  if stats.bytes_written and stats.l2_stored_bytes else 1.0)
        self.transfers.learn(stats, stored, packed=0 < stats.l2_writes <= stats.encoded_states)
        if self.fault_s is not None and stats.fresh_buffers:
            self.fault_s = blend(self.fault_s, stats.fresh_s, stats.fresh_buffers)
        self.runs += 1

    def learn_residual(self, stats: Any, capacities: Sequence[int | None] | None, *,
                       compressed: bool = False) -> None:
        """After :meth:`learn`: what the completed run (``stats``) took beyond the price of its
        plan at the costs just learned, faults aside, pooled with earlier runs (:attr:`misses`).
        A run far off its prediction thus corrects the price of the next plans. A first run,
        which probed the operator, is not learned from."""
        if not stats.forward_steps or stats.probe_steps:
            # a probed first run was priced from probes and pays for cold caches and compiled
            # operators besides: what it missed would price its kind of plan out for good
            return
        known, n_steps = self.misses, self.n_steps
        # at the run's own n: a held run (see take) may be learned by a checkpointer of another
        self.misses, self.n_steps = Residual(), stats.n_timesteps
        try:
            predicted = self.price(stats.l1_slots, stats.interval, capacities, fresh=False,
                                   compressed=compressed)
        finally:
            self.misses, self.n_steps = known, n_steps
        # the steps the model prices at tf or tb: a taping reverse step's forward call is
        # counted in forward_steps and priced in tb
        steps = stats.forward_steps + (0 if self.taping else stats.reverse_steps)
        known.learn(stats.interval > 0, stats.total_s - stats.fresh_s - predicted, steps,
                    stats.l2_writes + stats.l2_reads)

    def _learn_drifting(self, stats: Any, fit: CallFit) -> None:
        """Take the compute costs of a run whose step cost changed midway (see :data:`DRIFT`)
        from that run alone, for plans with transfers and without alike: the run's mean step is
        the best guess of the next run's, and pricing one kind of plan from runs that measured
        other costs would decide between them on the change, not on the plans."""
        # a fit over calls whose step cost changed is no measure of a call's own cost: that
        # stays as known, and the run's calls are pooled into neither fit
        tcall = self.quiet.tcall or 0.0
        tf = max((fit.seconds - fit.calls * tcall) / fit.steps, 1e-9)
        adjoint = (stats.reverse_compute_s / stats.reverse_steps if stats.reverse_steps
                   else None)
        self.quiet.take_run(tf, self.quiet.tcall, adjoint)
        self.busy.take_run(tf, self.quiet.tcall, adjoint)

    def _learn_contention(self, stats: Any, fit: CallFit) -> None:
        """Revise :attr:`tx` from a run with transfers: its forward calls, copies and (where
        their quiet cost is known) reverse calls beyond their quiet costs, per transfer, blended
        as transfer costs are (:data:`PRIOR_TRANSFERS`; at first with none): the noise of a
        run's compute divided by a few transfers must not price them as dear as a disk
        write."""
        transfers = stats.l2_writes + stats.l2_reads
        tf, tcall = self._run_step()  # (the run's own, until a run without transfers)
        if tf is None or not transfers or not fit.calls:
            return
        extra = fit.seconds - fit.calls * (tcall or 0.0) - fit.steps * tf
        if self.measured(0):
            # beyond what copies cost in a run without transfers; the probe's copy, which the
            # cache holds, would charge the transfers for every copy's cold memory
            extra += stats.copy_s - stats.copies * self.tc
        if self.tb is not None:
            extra += stats.reverse_compute_s - stats.reverse_steps * (self.tb - self.tf)
        self.tx = blend(self.tx or 0.0, max(extra, 0.0), transfers)

    def _learn_codec(self, stats: Any) -> None:
        """Revise :attr:`codec` from the states the codec compressed and decompressed in a run."""
        encoded = stats.encoded_states
        decoded = stats.decoded_states
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
            compress_s=blend(known.compress_s, stats.compress_s, encoded),
            decompress_s=blend(known.decompress_s, stats.decompress_s, decoded),
            stored=min(1.0, blend(known.stored, stored * encoded, encoded)))

    def record(self, choice: IntervalChoice) -> dict[str, Any]:
        """What goes into ``Stats.calibration``."""
        costs = self.costs()
        return {
            "tf_s": costs.tf, "tb_s": costs.tb, "tcall_s": costs.tcall, "tw_s": self.tw,
            "tr_s": self.tr, "tc_s": self.tc, "tf_busy_s": self.tf_busy,
            "tcall_busy_s": self.tcall_busy, "tb_busy_s": self.tb_busy, "tc_busy_s": self.tc_busy,
            "tx_s": self.tx, "tq_s": self.tq, "residual_s": dict(self.residual),
            "residual_per_transfer_s": self.misses.of(True, not self.inline)[1],
            "tb_measured": self.tb is not None,
            "learned_runs": self.runs, "transfers": "inline" if self.inline else "background",
            "taping": self.taping, "interval": choice.interval,
            "fault_s": self.fault_s, "warm_buffers": self.warm_buffers,
            "codec": None if self.codec is None else asdict(self.codec),
            "predicted_total_s": choice.prediction.total_s,
            "predicted_revolve_s": choice.revolve.total_s,
            "predicted_store_all_s": choice.store_all.total_s,
        }
