"""Runs a schedule's actions on the user's operators, the Level-1 slots and the transfer engine.

The interpreter never invents an order of work: what :func:`schedules.simulate` validates and
the model prices is what runs, but for the forward sweep's last call, which the replay check
may make two (:meth:`~.replay.ReplayCheck.splits`).
"""
from __future__ import annotations

import time
from contextlib import nullcontext
from collections.abc import Iterator
from typing import Any

import numpy as np
from threadpoolctl import threadpool_limits

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
from schedules.live import LiveRing

from .engine import TransferEngine
from .in_place import InPlaceCheck
from .replay import ReplayCheck
from .level1 import Level1
from .ranks import Ranks, SoloRanks
from .rebuild import recompute_lost
from .timing import CallFit, HostTimer
from ..checkpoint import check_arrays
from ..errors import ScheduleError
from ..stats import Stats

__all__ = ["Interpreter", "Level1"]


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
        The ranks of an MPI run. A Level-2 transfer that fails on one rank is noted, and that
        rank goes on making the schedule's operator calls without Level-2 (its peers exchange
        halos with it) until the ranks agree on the failure: at an agreement point (see
        :meth:`_boundary`) or at the end of the sweep.
    ring
        Where the state's fields are rings of time levels that the operators are proven to
        keep (:mod:`~asyncckpt._planning.devito_ring`): a load whose rows still hold the
        state copies nothing.
    """

    #: Agreement points per sweep of an MPI run, at most: a failure costs at most the steps
    #: between two of them (the reduction of one completes at the next), and their number does
    #: not grow with n.
    AGREEMENTS_PER_SWEEP = 8

    def __init__(self, checkpoint: Any, nbytes: int, dtype: np.dtype, fwd_operator: Any,
                 rev_operator: Any, engine: TransferEngine, level1: Level1,
                 group: Ranks | None = None, ring: LiveRing | None = None) -> None:
        self.checkpoint = checkpoint
        self.nbytes, self.dtype = nbytes, dtype
        self.fwd_operator, self.rev_operator = fwd_operator, rev_operator
        self.engine = engine
        self.level1 = level1
        self.group = SoloRanks() if group is None else group
        self.ring = ring
        self.link = level1.link
        # What the descriptor last returned, as it returned it: holding the objects keeps
        # their ids from being reused, so equal ids mean the same arrays.
        self._returned: list[Any] = []
        self._returned_ids: list[int] = []
        self._known: list[np.ndarray] = []  # the same, checked (device arrays adapted)
        self._known_nbytes = 0
        self._known_step = -1  # the step the descriptor was last asked for
        self.descriptor_s = 0.0  # seconds inside the descriptor's calls
        #: Level-2 stores expected in a forward sweep of an MPI run, between which it spreads
        #: its agreement points (0: none but the sweep's end, as in an online run, whose
        #: decisions agree at every pause); a reverse sweep spreads them over the states its
        #: forward sweep stored
        self.expected_stores = 0
        self._boundaries = 0  # interval boundaries passed this sweep (Level-2 stores, frees)
        self._expected = 0  # ... expected this sweep
        self.in_place = InPlaceCheck(self.link.device is None
                                     and not getattr(fwd_operator, "updates_in_place", False))
        self.replay = ReplayCheck(self.link.device is None and engine.verify)
        self._steady = True  # the descriptor has answered with the same arrays for every step

    def arrays(self, step: int, *, into: bool) -> list[np.ndarray]:
        """The descriptor's arrays for u_step (``get_data_location`` where ``into``, else
        ``get_data``), checked against its size and dtype once for as long as it keeps returning
        the same array objects; their bytes are then in ``_known_nbytes``. A forward call the
        in-place check watches is decided here, at the call for its end state."""
        method = "get_data_location" if into else "get_data"
        start = time.perf_counter()
        arrays = getattr(self.checkpoint, method)(step)
        self.descriptor_s += time.perf_counter() - start
        self._known_step = step
        if not (isinstance(arrays, (list, tuple))
                and list(map(id, arrays)) == self._returned_ids):
            self._steady = self._steady and not self._returned_ids
            where = f"checkpoint.{method}({step})"
            adapted = (self.link.adapt(arrays) if isinstance(arrays, (list, tuple))
                       else arrays)
            self._known = check_arrays(adapted, self.nbytes, self.dtype, where, exact=False,
                                       device=self.link.device)
            self._known_nbytes = sum(a.nbytes for a in self._known)
            self._returned = list(arrays)
            self._returned_ids = list(map(id, self._returned))
        if self.in_place.pending is not None:
            self.in_place.arrived(self._known, step, into)
        return self._known

    def sweep(self, actions: Iterator[Action], until: type[EndForward] | type[EndReverse],
              stats: Stats, fit: CallFit, trace: list[Action] | None = None, *,
              blas_threads: int | None = None) -> None:
        """One sweep: :meth:`run` up to ``until`` with BLAS capped at ``blas_threads``; at the
        end of the reverse sweep every transfer settled and every rank got there, or all
        raise."""
        limit = (nullcontext() if blas_threads is None
                 else threadpool_limits(limits=blas_threads, user_api="blas"))
        group = self.group
        calls = group.calls
        self._expected = self.expected_stores if until is EndForward else self._boundaries
        self._boundaries = 0
        self.replay.begin()
        if self.ring is not None:
            self.ring.forget()  # the caller may have written into the arrays between sweeps
        with limit:
            try:
                self.run(actions, until, stats, fit, trace)
                if until is EndForward:
                    # an agreement point like the others, completed at the reverse sweep's
                    # first: no rank waits here for the slowest one's forward sweep
                    group.check_in()
                else:
                    if group.failure is None:
                        self.engine.drain()
                    group.agree()  # the run's last: every reduction completed, or all raise
            except BaseException as failure:
                group.fail(failure)
                raise
            finally:
                stats.collectives += group.calls - calls

    def run(self, actions: Iterator[Action], until: type[EndForward] | type[EndReverse],
            stats: Stats, fit: CallFit, trace: list[Action] | None = None) -> None:
        """Execute ``actions`` up to and including the first of type ``until``, appending each
        to ``trace`` when given."""
        engine, level1, group, replay = self.engine, self.level1, self.group, self.replay
        ring, in_place = self.ring, self.in_place
        fwd, rev = self.fwd_operator, self.rev_operator
        # the reverse sweep compares recomputed states; the forward one may split a call
        replaying = until is EndReverse and replay.enabled
        timer = self.link.timer(stats, fit)
        begin_call, end_call = timer.begin, timer.end
        l1 = Tier.L1
        # dispatched on the action's type, the commonest first: a match tries each class
        # pattern in turn (0.4 us an action, here 0.05), and a schedule runs some six actions a
        # step; mypy narrows no type through a variable, so the actions are Any here
        action: Any
        for action in actions:
            if trace is not None:
                trace.append(action)
            kind = type(action)
            if kind is Advance:
                begin, end = action.start, action.end
                if in_place.left > 0:
                    in_place.advancing(self._known, self._known_step, begin, end)
                # every rank makes the same calls: only the checksum is the rank's own
                at = None if replaying else replay.witness_at
                if at is None or not begin < at < end:
                    mark = begin_call()
                    fwd.apply(t_start=begin, t_end=end)
                    end_call(mark, end - begin, begin)
                    stats.forward_steps += end - begin
                else:
                    self._witnessed_call(begin, at, end, stats, timer)
                # u_end's arrays are the last answer's; a rank whose failure waits for
                # the ranks to agree runs on from states it may not have loaded
                if replaying and self._steady and group.failure is None:
                    expected = replay.expected(end, engine.digests.get(end))
                    if expected is not None:
                        replay.check(self._known, begin, end, expected)
                if ring is not None:
                    if group.failure is None:
                        ring.advanced(begin, end)
                    else:
                        ring.forget()
            elif kind is Reverse:
                step = action.step
                mark = begin_call()
                rev.apply(t_start=step, t_end=step + 1)
                end_call(mark, 0)
                stats.reverse_steps += 1
            elif kind is Load:
                step = action.step
                if ring is not None and self._held(ring, step):
                    stats.loads_kept += 1  # the arrays hold u_step: a copy would change nothing
                    continue
                if action.tier is l1:
                    level1.load(step, self.arrays(step, into=True), self._known_nbytes)
                else:
                    if ring is not None:
                        ring.forget()  # a lost state is rebuilt in the arrays
                    # Level-2 is skipped on a rank that failed (under MPI): the run goes on to
                    # where the ranks agree on the failure and raise
                    if group.failure is None:
                        try:
                            if not engine.load(step, self.arrays(step, into=True),
                                               self._known_nbytes):
                                recompute_lost(self, step, stats)
                        except Exception as failure:  # noqa: BLE001 - raised where agreed
                            group.note(failure)  # one process: raised here
                if ring is not None:
                    self._holding(step)
            elif kind is Store:
                step = action.step
                if action.tier is l1:
                    level1.store(step, self.arrays(step, into=False), self._known_nbytes)
                    if len(level1.held) > stats.l1_peak_slots:
                        stats.l1_peak_slots = len(level1.held)
                else:
                    if group.failure is None:
                        try:
                            engine.store(step, self.arrays(step, into=False), self._known_nbytes)
                        except Exception as failure:  # noqa: BLE001 - as a load's
                            group.note(failure)
                    self._boundary()
                if ring is not None:
                    self._holding(step)
            elif kind is Free:
                if action.tier is l1:
                    level1.free(action.step)
                    continue
                if group.failure is None:
                    replay.freeing(action.step, engine.digests.get(action.step))
                    engine.free(action.step)
                self._boundary()
            elif kind is Prefetch:
                if group.failure is None:
                    engine.prefetch(action.step)
            elif kind is until:
                timer.settle()
                return
            elif kind is EndForward or kind is EndReverse:
                raise ScheduleError(f"the schedule reached {action!r} while running up to "
                                    f"{until.__name__}")
            else:
                raise ScheduleError(f"{action!r} is not an action (schedules.Action)")

    def _witnessed_call(self, begin: int, at: int, end: int, stats: Stats,
                        timer: HostTimer) -> None:
        """The forward call from u_begin to u_end made two, u_at checksummed between them
        (:meth:`~.replay.ReplayCheck.splits`)."""
        for start, stop in ((begin, at), (at, end)):
            mark = timer.begin()
            self.fwd_operator.apply(t_start=start, t_end=stop)
            timer.end(mark, stop - start, start)
            stats.forward_steps += stop - start
            if stop == at and self._steady and self.group.failure is None:
                self.replay.witness(at, self._known)

    def _held(self, ring: LiveRing, step: int) -> bool:
        """Whether the arrays hold u_step (a load of it is then skipped): the ring says its
        rows hold it, and the descriptor still hands out those rows for it (else the ring
        forgets, and the state is loaded)."""
        if not ring.holds(step):
            return False
        arrays = self.arrays(step, into=True)
        if sorted((int(a.ctypes.data), a.nbytes) for a in arrays) == ring.rows_of(step):
            return True
        ring.forget()
        return False

    def _holding(self, step: int) -> None:
        """The arrays hold u_step, loaded or stored: where a rank's failure skips Level-2,
        maybe not."""
        if self.ring is not None:
            if self.group.failure is None:
                self.ring.hold(step)
            else:
                self.ring.forget()

    def _boundary(self) -> None:
        """An interval's boundary (a Level-2 state stored, or freed once reversed): an
        agreement point where one is due, :attr:`AGREEMENTS_PER_SWEEP` spread evenly over the
        boundaries the sweep expects."""
        self._boundaries += 1
        done, expected = self._boundaries, self._expected
        if expected and (done * self.AGREEMENTS_PER_SWEEP // expected
                         > (done - 1) * self.AGREEMENTS_PER_SWEEP // expected):
            self.group.check_in()
