"""The decisions an online run makes as it goes (``interval="adaptive"``, unknown n)."""
from __future__ import annotations

import math
from collections.abc import Callable

from ..stats import Stats
from .engine import TransferEngine
from .ranks import Ranks, SoloRanks, Ticket

__all__ = ["RunDecisions"]


def _recent(mean: float | None, value: float, spans: float) -> float:
    """An exponential mean that forgets by e every span: ``value`` measured over ``spans``."""
    if mean is None:
        return value
    weight = 1.0 - math.exp(-spans)
    return weight * value + (1.0 - weight) * mean


class RunDecisions:
    """What an online schedule (:class:`schedules.OnlineMultistage`) asks of a running
    checkpointer: whether u_t goes to Level-2 now, how far to advance before asking again, and
    whether the run ends at u_t.

    Parameters
    ----------
    engine
        The transfer engine, which knows whether the latest Level-2 write has completed.
    interval
        The planned interval: with ``adaptive``, the least one the run keeps to until
        ``reprice`` says otherwise; else the interval.
    adaptive
        Store as soon as the previous Level-2 write has completed (beyond the current
        interval).
    stop
        The user's ``stop(t)``, for a run of unknown length.
    stats
        The run's measurements: a forward step's seconds so far tell how many steps a write
        still running will take.
    model_tf
        A forward step's seconds by the model, until the run has measured one (0: unknown).
    group
        The ranks of an MPI run, which agree on every answer with one reduction per pause:
        store when every rank's write had completed, advance as far as the slowest rank's
        estimate, stop where any rank's ``stop`` says so. With n known the reduction is
        pipelined: started at one pause with what each rank measures there, completed at the
        next, where its answers are due (one pause late, so no rank waits for it); a run of
        unknown n needs ``stop`` at once, so it completes its reduction where it starts it.
    reprice
        With ``adaptive``: the interval for a step of ``tf`` seconds (what the run measures
        now, contention included) and writes of ``tw`` seconds (None: as priced). Asked at
        every candidate state, so the current interval follows the run's costs as they change,
        never below ``min_interval``; without it the current interval stays ``interval``.
    min_interval
        The shortest interval ``reprice`` may give (default ``interval``): the online
        schedule asks :meth:`store` from there on.
    """

    #: The steps and the writes over which the run's recent step and write costs forget what
    #: came before (by e): long enough that one interval's noise does not move them, short
    #: enough to follow a change within a few dozen steps.
    RECENT_STEPS = 16
    RECENT_WRITES = 4

    def __init__(self, engine: TransferEngine, interval: int, *, adaptive: bool,
                 stop: Callable[[int], object] | None,
                 stats: Stats, model_tf: float = 0.0, group: Ranks | None = None,
                 reprice: Callable[[float, float | None], int] | None = None,
                 min_interval: int | None = None) -> None:
        self.engine, self.interval, self.adaptive = engine, interval, adaptive
        self._stop, self.stats, self.model_tf = stop, stats, model_tf
        self.group = SoloRanks() if group is None else group
        self.current_interval = interval  # agreed by every rank
        self.min_interval = interval if min_interval is None else min_interval
        self._reprice = reprice
        self._seen_steps = (stats.forward_steps, stats.forward_compute_s)
        self._seen_writes = engine.completed_writes()
        self._tf: float | None = None
        self._tw: float | None = None
        # the ranks' answers: the pause they are for, the reduction under way (and its pause)
        self._answers: list[float | None] = []
        self._answered_at = self._asked_at = self._ticket_at = self._last_store = -1
        self._ticket: Ticket | None = None

    def store(self, t: int, last_store: int) -> bool:
        if not self.adaptive:
            return t - last_store >= self.interval
        busy, staging_full, interval, _ = self._agreed(t, last_store)
        if self._reprice is not None:
            self.current_interval = int(interval or self.current_interval)
            if t - last_store < self.current_interval:
                return False
            # the least interval already prices the writes' stalls at the costs the run
            # measures now: past it, a store waits only where it would wait for a buffer
            return not staging_full
        return not busy

    def advance(self, t: int, last_store: int) -> int:
        short = self.current_interval - (t - last_store)
        if short > 0 or not self.adaptive:
            return max(short, 1)
        *_, steps = self._agreed(t, last_store)
        return max(1, int(steps or 1) - (t - self._asked_at))

    def stop(self, t: int) -> bool:
        stop = self._stop is not None and bool(self._stop(t))
        if self.group.size == 1:
            return stop
        # n unknown: whether u_t ends the run is due now, so this pause's answers are too
        ticket = self.group.start(self._local(t, self._last_store, stop))
        answers = ticket.result()[0]
        self._answers, self._answered_at, self._asked_at = answers[1:], t, t
        return bool(answers[0])

    def _local(self, t: int, last_store: int, stop: bool = False) -> list[float | None]:
        """This rank's answers at pause ``t``: stop, a write still running, no staging buffer
        free, the interval for its recent costs and the steps its running write still takes."""
        engine = self.engine
        interval = self._recent_interval() if self._reprice is not None else self.interval
        return [float(stop), float(engine.writing_for() is not None),
                float(not engine.staging_free()), float(interval),
                float(self._estimate(t, last_store))]

    def _agreed(self, t: int, last_store: int) -> list[float | None]:
        """Every rank's answers (the largest of each), once per pause: under MPI those of the
        reduction started at the pause before (at a run's first pause, of its own)."""
        if self.group.size == 1:
            return self._local(t, last_store)[1:]
        # a pause asks store() then advance(), with the same last store: after a store at t,
        # advance() has a whole interval to go and asks nothing
        self._last_store = last_store
        if self._answered_at != t:
            ticket = self.group.start(self._local(t, last_store))
            due, due_at = self._ticket, self._ticket_at
            self._ticket, self._ticket_at = ticket, t
            if due is None:
                due, due_at = ticket, t
            self._answers = due.result()[0][1:]
            self._answered_at, self._asked_at = t, due_at
        return self._answers

    def _recent_interval(self) -> int:
        """The interval for the costs the run measured lately (see ``reprice``)."""
        assert self._reprice is not None
        stats = self.stats
        steps = stats.forward_steps - self._seen_steps[0]
        seconds = stats.forward_compute_s - self._seen_steps[1]
        if steps > 0 and seconds > 0:
            self._tf = _recent(self._tf, seconds / steps, steps / self.RECENT_STEPS)
            self._seen_steps = (stats.forward_steps, stats.forward_compute_s)
        done, busy_s = self.engine.completed_writes()
        writes = done - self._seen_writes[0]
        if writes > 0:
            tw = (busy_s - self._seen_writes[1]) / writes
            self._tw = _recent(self._tw, tw, writes / self.RECENT_WRITES)
            self._seen_writes = (done, busy_s)
        if self._tf is None:
            return self.current_interval
        return max(self.min_interval, self._reprice(self._tf, self._tw))

    def _estimate(self, t: int, last_store: int) -> int:
        running = self.engine.writing_for()
        done, busy_s = self.engine.completed_writes()
        expected = busy_s / done if done > 0 else None  # a write's mean so far
        stats = self.stats
        step = (stats.forward_compute_s / stats.forward_steps if stats.forward_steps
                else self.model_tf)
        if running is None or expected is None or step <= 0 or expected <= running:
            # no estimate, or the write is late: look again after an eighth of the interval
            return max(1, (t - last_store) // 8)
        return max(1, math.ceil((expected - running) / step))
