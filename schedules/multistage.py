"""Two-level schedules: every I-th state is kept on an outer tier, each interval is reversed inside.

:class:`AsyncMultistage` is the strategy of Kukreja et al. (2018): interval starts stream to
Level-2 during the forward sweep, come back by prefetch one interval ahead of need, and each
interval is reversed by Revolve in the Level-1 slots. :class:`Chen` is the sqrt(n) segment
schedule of Chen et al. (2016), all in Level-1. docs/model.md lists the references.
"""
from __future__ import annotations

import itertools
import math
from collections.abc import Iterator, Sequence

from ._args import check_bool, check_int
from .actions import Action, Advance, EndReverse, Free, Load, Prefetch, Reverse, Store, Tier
from .revolve import (CHUNK, Chunks, chained, forward_then_reverse_into,
                      optimal_recomputations, reverse_range_into)

__all__ = ["AsyncMultistage", "Chen", "last_interval_then_reverse", "reverse_intervals",
           "reverse_stored",
           "two_level_forward_steps"]


def two_level_forward_steps(n_steps: int, interval: int, l1_slots: int) -> float:
    """Return the synchronous two-level total F = n + (n / I) (I + p(I, s + 1)) (docs/model.md).

    :class:`AsyncMultistage` never exceeds it and beats it by reusing the forward sweep's last
    interval.
    """
    n_steps = check_int("n_steps", n_steps, 1)
    interval = check_int("interval", interval, 1, n_steps)
    l1_slots = check_int("l1_slots", l1_slots, 1)
    return n_steps + n_steps / interval * (interval + optimal_recomputations(interval, l1_slots + 1))


def reverse_intervals(starts: Sequence[int], snaps: int, taping: bool) -> Iterator[Action]:
    """Yield the reversal of every interval but the last, newest first: ``starts[k]`` to
    ``starts[k + 1]``, each start on Level-2 and already prefetched (the newest one) or
    prefetched one interval ahead of need, then freed."""
    return chained(reverse_intervals_into([], starts, snaps, taping))


def reverse_intervals_into(out: list[Action], starts: Sequence[int], snaps: int,
                           taping: bool) -> Chunks:
    """:func:`reverse_intervals` appended to ``out`` in chunks (see ``schedules.revolve``)."""
    l2 = Tier.L2
    for k in range(len(starts) - 2, -1, -1):
        start, end = starts[k], starts[k + 1]
        if k > 0:
            out.append(Prefetch(starts[k - 1]))
        if end - start == 1:
            # reverse_range of one step, as it walks it: its start loaded, the step taped
            out.append(Load(start, l2))
            if taping:
                out.append(Advance(start, end))
            out.append(Reverse(start))
            if len(out) >= CHUNK:
                yield out
                out = []
        else:
            out = yield from reverse_range_into(out, start, end, snaps, {start: l2}, None, taping)
        out.append(Free(start, l2))
    return out


def reverse_stored(starts: Sequence[int], n_steps: int, snaps: int,
                   taping: bool) -> Iterator[Action]:
    """Yield a reverse sweep of steps ``n_steps - 1`` down to 0 from states on Level-2 alone:
    ``starts`` (u_0 first, ascending, all below ``n_steps``), each interval from one start to
    the next (the last to u_n) reversed in ``snaps`` slots, the newest prefetched first and
    each earlier one an interval ahead of need. A second reverse sweep over one forward sweep,
    or one resumed in a later process, runs this."""
    bounds = [*starts, n_steps]
    head: list[Action] = [Prefetch(bounds[-2])] if len(bounds) > 1 else []
    return itertools.chain(head, reverse_intervals(bounds, snaps, taping), (EndReverse(),))


def last_interval_then_reverse(starts: Sequence[int], n_steps: int, snaps: int,
                               taping: bool) -> Iterator[Action]:
    """Yield the last interval, from the live ``u_starts[-1]`` to u_n, laying the Level-1
    checkpoints its reversal needs, then its reversal and every earlier interval's, newest
    first, prefetched one interval ahead."""
    return chained(last_interval_then_reverse_into([], starts, n_steps, snaps, taping))


def last_interval_then_reverse_into(out: list[Action], starts: Sequence[int], n_steps: int,
                                    snaps: int, taping: bool) -> Chunks:
    """:func:`last_interval_then_reverse` appended to ``out`` in chunks."""
    last = starts[-1]
    # A last interval of one step never reloads its start under taping: its only reverse step
    # is taped by the forward sweep's last call.
    keep = n_steps - last > 1 or not taping
    if keep:
        out.append(Store(last, Tier.L2))
    ahead: tuple[Prefetch, ...] = (Prefetch(last),) if keep else ()
    if len(starts) > 1:
        ahead += (Prefetch(starts[-2]),)
    out = yield from forward_then_reverse_into(out, last, n_steps, snaps, {last: Tier.L2},
                                               taping, ahead)
    if keep:
        out.append(Free(last, Tier.L2))
    out = yield from reverse_intervals_into(out, starts, snaps, taping)
    out.append(EndReverse())
    return out


class AsyncMultistage:
    """Asynchronous multistage checkpointing as a schedule.

    Parameters
    ----------
    n_steps : int
        Number of forward steps n (>= 1).
    interval : int
        I, 1 <= I <= n: u_0, u_I, u_2I, ... go to Level-2 during the forward sweep. A last interval
        shorter than I is reversed exactly.
    l1_slots : int
        Level-1 slots s (>= 1) for Revolve inside an interval; the interval's start, prefetched from
        Level-2, acts as one more.
    taping : bool
        True (default): pyrevolve's protocol, each ``Reverse(t)`` directly after an advance ending
        at t + 1. False: each ``Reverse(t)`` while the live state is u_t (see
        ``schedules.revolve.reverse_range``).

    Notes
    -----
    Level-1 also needs two prefetch buffers (``prefetch_slots``): the start of the interval being
    reversed and the start of the next one, read while this one is reversed.

    Examples
    --------
    Every tenth of 1000 states goes to Level-2, and Revolve reverses each interval in 10 slots:

    >>> from schedules import AsyncMultistage, simulate
    >>> result = simulate(AsyncMultistage(1000, interval=10, l1_slots=10))
    >>> result.l2_writes, result.l2_reads, result.forward_steps / 1000
    (100, 100, 2.89)
    """

    #: Prefetch buffers the schedule holds at once.
    prefetch_slots = 2

    def __init__(self, n_steps: int, interval: int, l1_slots: int, *,
                 taping: bool = True) -> None:
        self.n_steps = check_int("n_steps", n_steps, 1)
        self.interval = check_int("interval", interval, 1, self.n_steps)
        self.l1_slots = check_int("l1_slots", l1_slots, 1)
        self.taping = check_bool("taping", taping)

    def __repr__(self) -> str:
        taping = "" if self.taping else ", taping=False"
        return (
            f"AsyncMultistage(n_steps={self.n_steps}, interval={self.interval}, "
            f"l1_slots={self.l1_slots}{taping})"
        )

    def get_config(self) -> dict[str, int | str | bool]:
        """Return the constructor's arguments as a plain dict (JSON-ready)."""
        return {
            "name": "AsyncMultistage",
            "n_steps": self.n_steps,
            "interval": self.interval,
            "l1_slots": self.l1_slots,
            "taping": self.taping,
        }

    @property
    def l2_states(self) -> int:
        """Most states on Level-2 at once (the interval starts written by the forward sweep)."""
        return len(self._starts())

    @property
    def l1_peak(self) -> int:
        """Level-1 slots the schedule does hold at once at most (``simulate(...).l1_peak``,
        without running it). Reversing an interval from its prefetched start holds at most the
        states after the start up to u_{end-2} (the taping step, or taping-free an advance,
        reaches u_{end-1}); taping-free, the last interval, reversed straight after the forward
        sweep, holds one more where it is a whole interval."""
        whole_last = self.n_steps % self.interval == 0
        held = self.interval - 1 if whole_last and not self.taping else self.interval - 2
        return max(0, min(self.l1_slots, held))

    def _starts(self) -> range:
        return range(0, self.n_steps, self.interval)

    def __iter__(self) -> Iterator[Action]:
        return chained(self._chunks())

    def _chunks(self) -> Chunks:
        interval, l2 = self.interval, Tier.L2
        starts = self._starts()
        out: list[Action] = []
        for start in starts[:-1]:
            out.append(Store(start, l2))
            out.append(Advance(start, start + interval))
            if len(out) >= CHUNK:
                yield out
                out = []
        return (yield from last_interval_then_reverse_into(out, starts, self.n_steps,
                                                           self.l1_slots + 1, self.taping))


class Chen:
    """Chen et al.'s sqrt(n) segment schedule, all in Level-1.

    The forward sweep keeps the start of every segment; each segment is then replayed once, keeping
    all of its states, and reversed. Level-1 holds about 2 sqrt(n) states; the forward work is one
    extra forward sweep.

    Parameters
    ----------
    n_steps : int
        Number of forward steps n (>= 1).
    segment : int, optional
        Segment length, 1 <= segment <= n; ``ceil(sqrt(n))`` by default.
    taping : bool
        True (default): pyrevolve's protocol; False: each ``Reverse(t)`` while the live state is
        u_t.
    """

    def __init__(self, n_steps: int, segment: int | None = None, *, taping: bool = True) -> None:
        self.n_steps = check_int("n_steps", n_steps, 1)
        if segment is None:
            segment = math.isqrt(self.n_steps - 1) + 1
        self.segment = check_int("segment", segment, 1, self.n_steps)
        self.taping = check_bool("taping", taping)

    def __repr__(self) -> str:
        taping = "" if self.taping else ", taping=False"
        return f"Chen(n_steps={self.n_steps}, segment={self.segment}{taping})"

    def get_config(self) -> dict[str, int | str | bool]:
        """Return the constructor's arguments as a plain dict (JSON-ready)."""
        return {"name": "Chen", "n_steps": self.n_steps, "segment": self.segment,
                "taping": self.taping}

    @property
    def l1_slots(self) -> int:
        """Level-1 slots used at most: every segment start plus one segment's states."""
        return len(range(0, self.n_steps, self.segment)) + self.segment - 1

    def __iter__(self) -> Iterator[Action]:
        return chained(self._chunks())

    def _chunks(self) -> Chunks:
        n, seg, taping, l1 = self.n_steps, self.segment, self.taping, Tier.L1
        starts = range(0, n, seg)
        out: list[Action] = []
        for start in starts[:-1]:
            out.append(Store(start, l1))
            out.append(Advance(start, start + seg))
            if len(out) >= CHUNK:
                yield out
                out = []
        last = starts[-1]
        out.append(Store(last, l1))
        out = yield from forward_then_reverse_into(out, last, n, n - last, {last: l1}, taping)
        out.append(Free(last, l1))
        for start in reversed(starts[:-1]):
            out = yield from reverse_range_into(out, start, start + seg, seg, {start: l1},
                                                None, taping)
            out.append(Free(start, l1))
        out.append(EndReverse())
        return out
