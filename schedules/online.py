"""Two-level schedules decided while the run goes: where each interval ends, and where the run
ends.

:class:`OnlineMultistage` is :class:`~schedules.AsyncMultistage` with its two open questions
answered by a :class:`Decisions` object as the forward sweep reaches each state: whether u_t goes
to Level-2 now (the runtime's adaptive answer: once the previous Level-2 write has completed)
and, when n is not known in advance, whether the forward sweep ends at u_t. Whatever the answers,
the reverse sweep reverses each interval, however long, optimally within the Level-1 slots, and
prefetches the interval starts in reverse order. The schedule stays data: the same answers give
the same actions, and :class:`Replay` gives back the answers a run recorded.
"""
from __future__ import annotations

import bisect
from collections.abc import Callable, Iterator, Sequence
from typing import Protocol

from ._args import check_bool, check_int
from ._errors import InvalidTypeError, InvalidValueError, ScheduleError
from .actions import Action, Advance, EndForward, EndReverse, Free, Prefetch, Store, Tier
from .multistage import last_interval_then_reverse, reverse_intervals_into
from .revolve import Chunks, chained, reverse_range_into

__all__ = ["Decisions", "EveryInterval", "Replay", "OnlineMultistage"]


class Decisions(Protocol):
    """The facts an :class:`OnlineMultistage` asks for, each right after the actions before it
    have run."""

    def advance(self, t: int, last_store: int) -> int:
        """Steps to advance from u_t before the next question (>= 1; clipped to u_n when n is
        known). ``last_store`` is the latest state sent to Level-2."""

    def store(self, t: int, last_store: int) -> bool:
        """Whether u_t, just reached (t < n), goes to Level-2 now."""

    def stop(self, t: int) -> bool:
        """Whether the forward sweep ends at u_t, just reached (asked only when n is unknown)."""


class EveryInterval:
    """Every ``interval``-th state to Level-2, as :class:`~schedules.AsyncMultistage` stores
    them; with ``stop``, the run ends at the first t >= 1 where ``stop(t)`` is true."""

    def __init__(self, interval: int, stop: Callable[[int], object] | None = None) -> None:
        self.interval = check_int("interval", interval, 1)
        if stop is not None and not callable(stop):
            raise InvalidTypeError(f"stop must be callable, got {stop!r}")
        self._stop = stop

    def advance(self, t: int, last_store: int) -> int:
        """Steps to the next interval start: ``interval`` after ``last_store`` (at least 1).

        Parameters
        ----------
        t : int
            The state just reached.
        last_store : int
            The latest state sent to Level-2.

        Returns
        -------
        int
            Steps to advance before the next question.
        """
        return max(1, self.interval - (t - last_store))

    def store(self, t: int, last_store: int) -> bool:
        """Whether u_t goes to Level-2: ``interval`` steps or more after ``last_store``.

        Parameters
        ----------
        t : int
            The state just reached.
        last_store : int
            The latest state sent to Level-2.

        Returns
        -------
        bool
        """
        return t - last_store >= self.interval

    def stop(self, t: int) -> bool:
        """Whether the forward sweep ends at u_t: what ``stop(t)`` says (never, without one).

        Parameters
        ----------
        t : int
            The state just reached.

        Returns
        -------
        bool
        """
        return self._stop is not None and bool(self._stop(t))


class Replay:
    """The decisions of a run that stored ``stores`` (ascending, from 0), paused its forward
    sweep at ``pauses`` (the ends of its advances) and ended at u_n: an executed adaptive or
    online run, given back as data."""

    def __init__(self, stores: Sequence[int], n_steps: int, pauses: Sequence[int] = ()) -> None:
        self.n_steps = check_int("n_steps", n_steps, 1)
        self.stores = [check_int("stores[]", s, 0, self.n_steps - 1) for s in stores]
        if not self.stores or self.stores[0] != 0 or any(
                b <= a for a, b in zip(self.stores, self.stores[1:])):
            raise InvalidValueError(f"stores must ascend from 0, got {list(stores)[:8]}")
        self._stored = set(self.stores)
        self._pauses = sorted(self._stored.union(
            check_int("pauses[]", p, 1, self.n_steps) for p in pauses) | {self.n_steps})

    def advance(self, t: int, last_store: int) -> int:
        """Steps from u_t to the end of the run's next advance (its next pause, or u_n).

        Parameters
        ----------
        t : int
            The state just reached.
        last_store : int
            The latest state sent to Level-2 (the replay does not need it).

        Returns
        -------
        int
            Steps to advance before the next question.
        """
        return self._pauses[bisect.bisect_right(self._pauses, t)] - t

    def store(self, t: int, last_store: int) -> bool:
        """Whether the run stored u_t on Level-2.

        Parameters
        ----------
        t : int
            The state just reached.
        last_store : int
            The latest state sent to Level-2 (the replay does not need it).

        Returns
        -------
        bool
        """
        return t in self._stored

    def stop(self, t: int) -> bool:
        """Whether u_t is the run's u_n: the forward sweep ends there.

        Parameters
        ----------
        t : int
            The state just reached.

        Returns
        -------
        bool
        """
        return t >= self.n_steps


class OnlineMultistage:
    """Asynchronous multistage checkpointing whose intervals, and n, are decided during the run.

    Parameters
    ----------
    l1_slots : int
        Level-1 slots s (>= 1) for Revolve inside an interval; its start, prefetched from Level-2,
        acts as one more.
    decisions : Decisions
        Answers where intervals end (and, with ``n_steps=None``, where the run ends).
    n_steps : int or None
        n, when known. None: the forward sweep advances one step at a time and asks
        ``decisions.stop(t)`` after each; n is the t it stops at (``n_reached``).
    min_interval : int
        No two Level-2 states closer than this (>= 1): ``decisions.store`` is only asked beyond
        it. With n known, a state stored within ``min_interval`` of u_n starts the last interval,
        whose forward sweep then also lays its Level-1 checkpoints (as AsyncMultistage does).
    taping : bool
        True (default): pyrevolve's protocol; False: each ``Reverse(t)`` while the live state is
        u_t.

    Notes
    -----
    Iterating it asks the decisions as the actions are consumed, so it can be iterated once per
    run. ``stores`` (the interval starts, every one of which goes to Level-2 but a last one of a
    single step under taping), ``pauses`` and ``n_reached`` record the answers;
    ``Replay(stores, n_reached, pauses)`` with the same ``min_interval`` gives the same actions
    again.
    """

    #: Prefetch buffers the schedule holds at once.
    prefetch_slots = 2

    def __init__(self, l1_slots: int, decisions: Decisions, *, n_steps: int | None = None,
                 min_interval: int = 1, taping: bool = True) -> None:
        self.l1_slots = check_int("l1_slots", l1_slots, 1)
        missing = [m for m in ("advance", "store", "stop") if not callable(
            getattr(decisions, m, None))]
        if missing:
            raise InvalidTypeError(f"decisions {type(decisions).__name__} lacks "
                                   f"{', '.join(missing)}: see schedules.online.Decisions")
        self.decisions = decisions
        self.n_steps = None if n_steps is None else check_int("n_steps", n_steps, 1)
        self.min_interval = check_int("min_interval", min_interval, 1)
        self.taping = check_bool("taping", taping)
        self.stores: list[int] = []
        self.pauses: list[int] = []
        self.n_reached: int | None = None

    def __repr__(self) -> str:
        taping = "" if self.taping else ", taping=False"
        return (f"OnlineMultistage(l1_slots={self.l1_slots}, n_steps={self.n_steps}, "
                f"min_interval={self.min_interval}{taping})")

    def replay(self) -> "OnlineMultistage":
        """A fresh schedule that gives the same actions as this one's finished iteration (for
        :func:`~schedules.simulate` or the model, after the run)."""
        if self.n_reached is None:
            raise ScheduleError(f"{self!r} has not reached its end yet: nothing to replay")
        return OnlineMultistage(self.l1_slots, Replay(self.stores, self.n_reached, self.pauses),
                                n_steps=self.n_steps, min_interval=self.min_interval,
                                taping=self.taping)

    def _length(self, t: int) -> int:
        if self.n_steps is None:
            return 1  # stop() is asked at every state
        steps = self.decisions.advance(t, self.stores[-1])
        if isinstance(steps, bool) or not isinstance(steps, int) or steps < 1:
            raise ScheduleError(f"decisions.advance({t}, {self.stores[-1]}) returned {steps!r}, "
                                "expected an int >= 1")
        return min(steps, self.n_steps - t)

    def __iter__(self) -> Iterator[Action]:
        if self.stores:
            raise ScheduleError(f"{self!r} was already iterated: it asks its decisions as the "
                                "run goes, so build one per run")
        n, snaps, taping, stores = self.n_steps, self.l1_slots + 1, self.taping, self.stores
        t, store = 0, True
        while True:
            if store:
                if n is not None and n - t <= self.min_interval:
                    yield from self._known_end(t)
                    return
                yield Store(t, Tier.L2)
                stores.append(t)
            steps = self._length(t)
            yield Advance(t, t + steps)
            t += steps
            self.pauses.append(t)
            if t == n or (n is None and self.decisions.stop(t)):
                break
            store = t - stores[-1] >= self.min_interval and bool(
                self.decisions.store(t, stores[-1]))
        self.n_reached = t
        yield from chained(self._reverse(t, snaps, taping))

    def _reverse(self, n: int, snaps: int, taping: bool) -> Chunks:
        """The reverse sweep, from u_n: the last interval ran without Level-1 checkpoints, so it
        is reversed from its stored start, then every earlier interval."""
        stores = self.stores
        last = stores[-1]
        out: list[Action] = [EndForward(), Prefetch(last)]
        if len(stores) > 1:
            out.append(Prefetch(stores[-2]))
        out = yield from reverse_range_into(out, last, n, snaps, {last: Tier.L2}, n, taping)
        out.append(Free(last, Tier.L2))
        out = yield from reverse_intervals_into(out, stores, snaps, taping)
        out.append(EndReverse())
        return out

    def _known_end(self, last: int) -> Iterator[Action]:
        """The last interval, from ``last`` to a known u_n: its forward sweep lays the Level-1
        checkpoints its reversal needs, as AsyncMultistage's last interval does."""
        assert self.n_steps is not None
        self.n_reached = self.n_steps
        self.stores.append(last)
        yield from last_interval_then_reverse(self.stores, self.n_steps, self.l1_slots + 1,
                                              self.taping)
