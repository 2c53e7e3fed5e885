"""Runs a schedule's actions on the user's operators, the Level-1 slots and the transfer engine.

The interpreter never invents an order of work: what :func:`schedules.simulate` validates and
the model prices is what runs.
"""
from __future__ import annotations

import math
import time
from collections.abc import Callable, Iterator, Sequence
from typing import Any, assert_never

import numpy as np

from schedules import (
    Advance,
    EndForward,
    EndReverse,
    Free,
    Load,
    Prefetch,
    Reverse,
    Store,
    Tier,
)
from schedules.actions import Action

from ._buffers import check_size
from ._engine import TransferEngine
from ._link import HostLink
from ._mpi import Ranks, SoloRanks
from ._tuning import CallFit
from .checkpoint import check_arrays
from .errors import ScheduleError, TransferError
from .stats import Stats

__all__ = ["Interpreter", "Level1", "RunDecisions"]


class Level1:
    """The Level-1 slots: buffers made by the ``link`` when first used (never per step; on the
    host page-aligned and drawn from the process pool, on a device in its memory), each holding
    one state by its step."""

    def __init__(self, nbytes: int, link: HostLink | None = None) -> None:
        self.nbytes = nbytes
        self.link = HostLink() if link is None else link
        self.held: dict[int, np.ndarray] = {}
        self.sizes: dict[int, int] = {}  # bytes of each held state (at most ``nbytes``)
        self._free: list[np.ndarray] = []
        self.copies = 0
        self.copy_s = 0.0

    def take(self) -> np.ndarray:
        """A free slot: a released one, one a closed checkpointer left in the pool, or new."""
        return self._free.pop() if self._free else self.link.slot(self.nbytes)

    def give(self, slot: np.ndarray) -> None:
        self._free.append(slot)

    def reserve(self, count: int) -> None:
        """Make slots now, up to ``count`` made in all, for a run that will hold that many at
        once: on the host the fresh ones fault in on several threads together instead of one
        by one inside the sweep."""
        if count > self.made:
            self._free.extend(self.link.slots(self.nbytes, count - self.made))

    @property
    def made(self) -> int:
        """Slots made so far (held and free): what a run reuses without new memory."""
        return len(self._free) + len(self.held)

    def store(self, step: int, arrays: Sequence[np.ndarray], nbytes: int) -> None:
        """Copy u_step from ``arrays``, which hold ``nbytes`` bytes, into a slot."""
        slot = self.take()
        start = time.perf_counter()
        self.link.copy_out(arrays, slot)
        self.copy_s += time.perf_counter() - start
        self.copies += 1
        self.held[step] = slot
        self.sizes[step] = nbytes

    def load(self, step: int, arrays: Sequence[np.ndarray], nbytes: int) -> None:
        """Copy u_step into ``arrays``, which hold ``nbytes`` bytes."""
        if nbytes != self.sizes[step]:
            check_size(step, self.sizes[step], arrays, "Level-1")
        start = time.perf_counter()
        self.link.copy_in(self.held[step], arrays)
        self.copy_s += time.perf_counter() - start
        self.copies += 1

    def free(self, step: int) -> None:
        self._free.append(self.held.pop(step))
        del self.sizes[step]

    def abandon(self) -> None:
        """Free every held slot (a run was cut short)."""
        self._free.extend(self.held.values())
        self.held.clear()
        self.sizes.clear()

    def release(self) -> None:
        """Let every slot go (on the host, to the process pool)."""
        self.abandon()
        self.link.release(self._free)
        self._free = []


class Interpreter:
    """Executes actions: Advance and Reverse call the operators, Store/Load/Free move states
    between the live arrays, Level-1 and (through the engine) Level-2.

    Parameters
    ----------
    checkpoint
        The descriptor: ``get_data(t)`` to copy u_t from, ``get_data_location(t)`` to copy into.
    nbytes, dtype
        What every state's arrays must add up to, checked whenever the descriptor hands out new
        array objects.
    fwd_operator, rev_operator
        The user's operators.
    engine
        The transfer engine for Level-2.
    level1
        The Level-1 slots.
    group
        The ranks of an MPI run: after each Level-2 store and load they exchange, so that a
        failure on one rank is raised on all of them there.
    """

    def __init__(self, checkpoint: Any, nbytes: int, dtype: np.dtype, fwd_operator: Any,
                 rev_operator: Any, engine: TransferEngine, level1: Level1,
                 group: Ranks | None = None) -> None:
        self.checkpoint = checkpoint
        self.nbytes, self.dtype = nbytes, dtype
        self.fwd_operator, self.rev_operator = fwd_operator, rev_operator
        self.engine = engine
        self.level1 = level1
        self.group = SoloRanks() if group is None else group
        self.link = level1.link
        # What the descriptor last returned, as it returned it: holding the objects keeps
        # their ids from being reused, so equal ids mean the same arrays.
        self._returned: list[Any] = []
        self._returned_ids: list[int] = []
        self._known: list[np.ndarray] = []  # the same, checked (device arrays adapted)
        self._known_nbytes = 0
        self.descriptor_s = 0.0  # seconds inside the descriptor's calls

    def arrays(self, step: int, *, into: bool) -> list[np.ndarray]:
        """The descriptor's arrays for u_step (``get_data_location`` where ``into``, else
        ``get_data``), checked against its size and dtype once for as long as it keeps returning
        the same array objects; their bytes are then in ``_known_nbytes``."""
        method = "get_data_location" if into else "get_data"
        start = time.perf_counter()
        arrays = getattr(self.checkpoint, method)(step)
        self.descriptor_s += time.perf_counter() - start
        if isinstance(arrays, (list, tuple)) and list(map(id, arrays)) == self._returned_ids:
            return self._known
        where = f"checkpoint.{method}({step})"
        adapted = (self.link.adapt(arrays) if isinstance(arrays, (list, tuple))
                   else arrays)
        self._known = check_arrays(adapted, self.nbytes, self.dtype, where, exact=False,
                                   device=self.link.device)
        self._known_nbytes = sum(a.nbytes for a in self._known)
        self._returned = list(arrays)
        self._returned_ids = list(map(id, self._returned))
        return self._known

    def run(self, actions: Iterator[Action], until: type[EndForward] | type[EndReverse],
            stats: Stats, fit: CallFit, trace: list[Action] | None = None) -> None:
        """Execute ``actions`` up to and including the first of type ``until``, appending each
        to ``trace`` when given."""
        engine, level1, group = self.engine, self.level1, self.group
        fwd, rev = self.fwd_operator, self.rev_operator
        timer = self.link.timer(stats, fit)
        begin_call, end_call = timer.begin, timer.end
        for action in actions:
            if trace is not None:
                trace.append(action)
            match action:
                case Advance(start=begin, end=end):
                    mark = begin_call()
                    fwd.apply(t_start=begin, t_end=end)
                    end_call(mark, end - begin, begin)
                    stats.forward_steps += end - begin
                case Reverse(step=step):
                    mark = begin_call()
                    rev.apply(t_start=step, t_end=step + 1)
                    end_call(mark, 0)
                    stats.reverse_steps += 1
                case Load(step=step, tier=Tier.L1):
                    level1.load(step, self.arrays(step, into=True), self._known_nbytes)
                case Load(step=step):
                    if not engine.load(step, self.arrays(step, into=True)):
                        self._recompute(step, stats)
                    group.exchange()
                case Store(step=step, tier=Tier.L1):
                    level1.store(step, self.arrays(step, into=False), self._known_nbytes)
                    stats.l1_peak_slots = max(stats.l1_peak_slots, len(level1.held))
                case Store(step=step):
                    engine.store(step, self.arrays(step, into=False))
                    group.exchange()
                case Free(step=step, tier=Tier.L1):
                    level1.free(step)
                case Free(step=step):
                    engine.free(step)
                case Prefetch(step=step):
                    engine.prefetch(step)
                case EndForward() | EndReverse():
                    if type(action) is until:
                        timer.settle()
                        return
                    raise ScheduleError(f"the schedule reached {action!r} while running up to "
                                        f"{until.__name__}")
                case _:
                    assert_never(action)

    def _recompute(self, step: int, stats: Stats) -> None:
        """Rebuild the lost u_step in the live state (and its prefetch buffer): read it once
        more, else advance from the nearest earlier Level-2 state that can still be read."""
        if self.engine.reread(step, self.arrays(step, into=True)):
            return
        for start in self.engine.stored_before(step):
            if self.engine.fetch(start, self.arrays(start, into=True), via=step):
                clock = time.perf_counter()
                self.fwd_operator.apply(t_start=start, t_end=step)
                stats.forward_compute_s += time.perf_counter() - clock
                stats.forward_steps += step - start
                stats.recovery_steps += step - start
                self.engine.recovered(step, self.arrays(step, into=False))
                return
        raise TransferError(f"u_{step} is lost on Level-2 {self.engine.storage!r} and no earlier "
                            "checkpoint can be read to recompute it")


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
    min_interval
        The least interval; with ``adaptive=False``, the interval.
    adaptive
        Store as soon as the previous Level-2 write has completed (beyond the least interval).
    stop
        The user's ``stop(t)``, for a run of unknown length.
    stats
        The run's measurements: a forward step's seconds so far tell how many steps a write
        still running will take.
    model_tf
        A forward step's seconds by the model, until the run has measured one (0: unknown).
    group
        The ranks of an MPI run, which agree on every answer: store when every rank's write
        has completed, advance as far as the slowest rank's estimate, stop where any rank's
        ``stop`` says so.
    rechoose
        With ``adaptive``: the least interval for a step of ``tf`` seconds (what the run measures
        now, contention included) and writes of ``tw`` seconds (None: as priced). Asked at
        every candidate state, so the least interval follows the run's costs as they change,
        never below ``floor``; without it the least interval stays ``min_interval``.
    floor
        The least interval ``rechoose`` may give (default ``min_interval``): the online
        schedule asks :meth:`store` from there on.
    """

    #: The steps and the writes over which the run's recent step and write costs forget what
    #: came before (by e): long enough that one interval's noise does not move them, short
    #: enough to follow a change within a few dozen steps.
    RECENT_STEPS = 16
    RECENT_WRITES = 4

    def __init__(self, engine: TransferEngine, min_interval: int, *, adaptive: bool,
                 stop: Callable[[int], object] | None,
                 stats: Stats, model_tf: float = 0.0, group: Ranks | None = None,
                 rechoose: Callable[[float, float | None], int] | None = None,
                 floor: int | None = None) -> None:
        self.engine, self.min_interval, self.adaptive = engine, min_interval, adaptive
        self._stop, self.stats, self.model_tf = stop, stats, model_tf
        self.group = SoloRanks() if group is None else group
        self.least = min_interval  # agreed by every rank
        self.floor = min_interval if floor is None else floor
        self._rechoose = rechoose
        self._seen_steps = (stats.forward_steps, stats.forward_compute_s)
        self._seen_writes = engine.completed_writes()
        self._tf: float | None = None
        self._tw: float | None = None

    def store(self, t: int, last_store: int) -> bool:
        if not self.adaptive:
            return t - last_store >= self.min_interval
        if self._rechoose is not None:
            self.least = int(self.group.max(self._recent_least()))
            if t - last_store < self.least:
                return False
            # the least interval already prices the writes' stalls at the costs the run
            # measures now: past it, a store waits only where it would wait for a buffer
            return self.group.all(self.engine.staging_free())
        idle = self.engine.writing_for() is None
        return self.group.all(idle)

    def advance(self, t: int, last_store: int) -> int:
        short = self.least - (t - last_store)
        if short > 0 or not self.adaptive:
            return max(short, 1)
        steps = self._estimate(t, last_store)
        return int(self.group.max(steps))

    def _recent_least(self) -> int:
        """The least interval for the costs the run measured lately (see ``rechoose``)."""
        assert self._rechoose is not None
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
            return self.least
        return max(self.floor, self._rechoose(self._tf, self._tw))

    def _estimate(self, t: int, last_store: int) -> int:
        running = self.engine.writing_for()
        expected = self.engine.write_seconds()
        stats = self.stats
        step = (stats.forward_compute_s / stats.forward_steps if stats.forward_steps
                else self.model_tf)
        if running is None or expected is None or step <= 0 or expected <= running:
            # no estimate, or the write is late: look again after an eighth of the interval
            return max(1, (t - last_store) // 8)
        return max(1, math.ceil((expected - running) / step))

    def stop(self, t: int) -> bool:
        stop = self._stop is not None and bool(self._stop(t))
        return self.group.any(stop)
