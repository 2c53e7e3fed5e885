"""A checkpointer's runs, one after another: each run's plan chosen before it (by the model,
for "auto" and "adaptive"), handed to the interpreter as one schedule, timed sweep by sweep,
and learned from after it. :func:`asyncckpt._build.build` makes the :class:`Runs`."""
from __future__ import annotations

import time
from collections.abc import Callable, Iterator

from schedules import AsyncMultistage, EndForward, EndReverse
from schedules.actions import Action
from schedules.multistage import reverse_stored

from ._execution.bounded import Stalled
from ._execution.decisions import RunDecisions
from ._execution.engine import TransferEngine
from ._execution.interpreter import Interpreter
from ._execution.meter import RunMeter
from ._execution.ranks import Ranks
from ._execution.resume import NoRunDir, RunDir
from .costs import MeasuredCosts
from .errors import UsageError
from .stats import Stats
from ._tuning.auto import AutoPlanner
from ._tuning.view import assume, view
from ._planning.plan import Planner

__all__ = ["Runs"]


class Runs:
    """The plan of each run: chosen (by the model, for "auto" and "adaptive") before it, handed
    to the interpreter as one schedule, and learned from after it."""

    def __init__(self, planner: Planner, auto: AutoPlanner | None, engine: TransferEngine,
                 interpreter: Interpreter, meter: RunMeter, ranks: Ranks,
                 resume: RunDir | NoRunDir, *, taping: bool, taping_reason: str,
                 device: str) -> None:
        self.planner = planner
        self.auto = auto
        #: the run directory, where runs commit to one
        self.resume = resume
        self.again = False  # the last sweep was a further reverse sweep
        self.engine = engine
        self.interpreter = interpreter
        self.meter = meter
        self.ranks = ranks
        #: what each run's Stats say of it: the protocol, and where Level-1 lives
        self.taping = taping
        self.taping_reason = taping_reason
        self.device = device

    def begin(self, stop: Callable[[int], object] | None) -> tuple[Stats, Iterator[Action]]:
        """A run begins: its measurements (zeroed) and its schedule's actions (from where an
        earlier process left them, in a resumed run)."""
        planner = self.planner
        auto = self.auto
        self.ranks.settled = False  # a failure agreed on in an earlier run is over
        try:
            self.engine.sweep()  # what an earlier run's failure left on Level-2 goes first
        except Stalled as stall:
            # raised here in one process; under MPI where the ranks agree, as a stalled
            # transfer is: raised alone, it would leave the other ranks waiting for this one
            self.ranks.note(stall)
        calls = self.ranks.calls
        n = planner.n_timesteps
        stats = self._fresh_stats()
        self.again = False
        if auto is not None:
            auto.before_run(stats, self.interpreter)
        if planner.planned and (planner.adaptive or n is None):
            # an adaptive run of known n follows its own costs below the planned interval too
            reprice = (auto.interval_for if auto is not None and planner.adaptive
                       and n is not None else None)
            planner.online(RunDecisions(
                self.engine, planner.interval, adaptive=planner.adaptive, stop=stop,
                stats=stats, model_tf=(auto.tuner.tf if auto is not None else None) or 0.0,
                group=self.ranks, reprice=reprice,
                min_interval=None if reprice is None else planner.min_interval()))
        assert planner.schedule is not None
        stats.interval = planner.interval
        stats.collectives = self.ranks.calls - calls
        online = planner.adaptive or n is None
        # with taping the reverse sweep recomputes u_{n-1}, stored or not: the replay check's
        taped = planner.memory.taping and n is not None and n > 1
        self.interpreter.replay.witnessing(n - 1 if taped and n is not None else None)
        self.interpreter.expected_stores = (0 if online or n is None or not planner.interval
                                            else -(-n // planner.interval))
        return stats, self.resume.actions(planner.schedule)

    def sweep(self, actions: Iterator[Action], until: type[EndForward] | type[EndReverse],
              stats: Stats, trace: list[Action] | None, blas_threads: int | None) -> None:
        """One sweep of ``actions``, timed into ``stats``, and what the run commits at its
        end."""
        start = time.perf_counter()
        try:
            if until is EndForward:  # the plan's buffers, made before the sweep
                self.planner.fit_memory(self.interpreter.level1, self.engine)
            self.interpreter.sweep(actions, until, stats, self.meter.fit, trace,
                                   blas_threads=blas_threads)
            self.resume.ended(until)
        finally:
            elapsed = time.perf_counter() - start
            if until is EndForward:
                stats.forward_s = elapsed
            else:
                stats.reverse_s = elapsed
            self.meter.collect(stats)

    def _fresh_stats(self) -> Stats:
        """Zeroed measurements of a run (or of a further reverse sweep)."""
        planner = self.planner
        self.meter.start(planner.n_timesteps)
        return Stats(n_timesteps=planner.n_timesteps or 0, l1_slots=planner.l1_slots,
                     l1_bytes=planner.l1_bytes, taping=self.taping,
                     taping_reason=self.taping_reason, device=self.device,
                     compression_declined=planner.memory.codec_declined,
                     interval=planner.interval)

    def reverse_again(self) -> tuple[Stats, Iterator[Action]]:
        """A further reverse sweep over the forward sweep kept on Level-2
        (``keep_forward=True``): its own measurements, and the reverse sweep from the Level-2
        states alone (each interval recomputed from its start, no forward sweep)."""
        schedule = self.planner.schedule
        if not isinstance(schedule, AsyncMultistage):
            raise UsageError(f"keep_forward=True reverses again from the states on Level-2, "
                             f"but this run's plan ({schedule!r}) keeps none there: give an "
                             "interval")
        self.again = True
        n = schedule.n_steps
        return self._fresh_stats(), reverse_stored(sorted(self.engine.stored_before(n)), n,
                                                   schedule.l1_slots + 1, schedule.taping)

    def costs(self) -> MeasuredCosts | None:
        """What "auto" and "adaptive" price plans with (None for a fixed interval)."""
        return None if self.auto is None else view(self.auto.tuner)

    def assume(self, costs: MeasuredCosts) -> None:
        """Price the next plans with ``costs`` (see :func:`asyncckpt._tuning.view.assume`)."""
        if self.auto is None:
            raise UsageError("costs are set where interval is 'auto' or 'adaptive'; this "
                             "checkpointer's interval is fixed, and nothing prices its plans")
        assume(self.auto.tuner, costs)

    def learn(self, stats: Stats) -> None:
        """After a completed run: what the model learns from it (nothing from a further
        reverse sweep, which is not a run)."""
        if self.auto is not None and not self.again:
            self.auto.after_run(stats, self.meter.fit)
