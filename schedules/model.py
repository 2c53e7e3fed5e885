"""The performance model of Kukreja et al. (2018), Section 3, and an event simulation
(docs/model.md states it and lists the references).

Times are in seconds. ``tf`` is one forward step inside a call; ``tcall`` what each call of the
forward operator costs beyond its steps (an advance of k steps costs ``tcall + k tf``); ``tb`` one
reverse step *including* its taping forward step (pyrevolve's convention), so the reverse operator alone
costs ``tb - tf``; ``tw``/``tr`` move one state Level-1 -> Level-2 and back; ``tc`` copies one state
within Level-1 (a store or load of a slot, or the staging copy of a Level-2 store).

With F the total forward steps of a schedule (taping steps included) and A its advances (calls),
the compute time is ``F tf + A tcall + n (tb - tf)``: store-all with taping gives
``(2n - 1) tf + n (tb - tf)``, the paper's n (Tf + Tb) less the forward sweep's shared taping step.
Every function takes ``taping``: False prices the taping-free protocol, whose schedules have no
taping steps (see :func:`schedules.revolve.untaped_forward_steps`).
"""
from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, replace
from typing import Protocol

from ._args import check_int
from ._errors import InvalidValueError
from ._ranges import range_counts
from ._search import Remembered, beaten_up_to, full_lengths, least, lowest_dips
from .costs import CodecCosts, Costs, Level2Tier, Prediction
from .timeline import simulate_times

__all__ = [
    "Costs",
    "Prediction",
    "predict_store_all",
    "predict_revolve",
    "predict_async_multistage",
    "predict_adaptive",
    "adaptive_interval",
    "predict_tiered",
    "Level2Tier",
    "FirstTouch",
    "CodecCosts",
    "tiers_hold",
    "simulate_times",
    "choose_interval",
    "IntervalChoice",
]


def predict_store_all(n_steps: int, costs: Costs, *, taping: bool = True) -> Prediction:
    """No memory limit: every state the reverse sweep reads is kept in memory (Revolve with n
    slots): one forward call per step, with taping one taping call per reverse step but the
    last, and one copy out and one back per state."""
    n = check_int("n_steps", n_steps, 1)
    prediction = predict_revolve(n, n, costs, taping=taping)
    return Prediction("store-all", prediction.total_s, prediction.forward_s,
                      prediction.reverse_s, prediction.forward_steps)


def predict_revolve(n_steps: int, snaps: int, costs: Costs, *, taping: bool = True,
                    fresh: FirstTouch | None = None) -> Prediction:
    """Revolve with ``snaps`` slots: its optimal forward steps and calls, n reverse calls and one
    copy per checkpoint stored and per load (and with ``fresh``, the faults of the slots it
    touches first: at most n)."""
    n = check_int("n_steps", n_steps, 1)
    snaps = check_int("snaps", snaps, 1)
    counts = range_counts(n, snaps, taping, costs.slack, True)
    faults = 0.0 if fresh is None else fresh.slots_s(min(snaps, n))
    total = counts.seconds(costs, n) + costs.tc + faults  # u_0's store is not in the range
    forward = n * costs.tf + costs.tcall + faults
    return Prediction("revolve", total, forward, total - forward, counts.steps)


def predict_async_multistage(n_steps: int, interval: int, l1_slots: int, costs: Costs, *,
                             staging_buffers: int = 2, taping: bool = True) -> Prediction:
    """The paper's closed form, with forward calls, in-memory copies and the stalls of one
    transfer channel.

    Forward: each interval takes ``max(tcall + I tf + tc, tw)`` once the staging buffers are full
    (the first ``staging_buffers`` writes are absorbed). Reverse: each interval costs its
    recomputation and replay, its reverse steps and one copy per load and checkpoint, and hides
    the next prefetch ``tr`` or waits for the rest.
    """
    n = check_int("n_steps", n_steps, 1)
    interval = check_int("interval", interval, 1, n)
    l1_slots = check_int("l1_slots", l1_slots, 1)
    return _async_multistage(n, interval, l1_slots, costs, costs.tw, costs.tr, staging_buffers,
                             taping)


@dataclass(frozen=True, slots=True)
class _Interval:
    """What a schedule of one interval costs apart from its Level-2 tier's ``tw`` and ``tr``:
    computed once, priced against each tier."""

    count: int
    last: int
    stores: int
    compute_fwd: float
    forward: float
    full_s: float
    last_s: float
    reverse: float
    steps: int
    staging_buffers: int

    def over(self, tw: float, tr: float, tx: float) -> Prediction:
        """The prediction with Level-2 writes of ``tw`` and reads of ``tr`` seconds."""
        count = self.count
        write_stall = max(0.0, tw - self.compute_fwd) * max(0, self.stores - self.staging_buffers)
        forward = self.forward + write_stall
        # the first prefetch waits behind the writes still queued at the end of the forward
        # sweep
        queued = (min(self.staging_buffers, count) * max(0.0, tw - self.compute_fwd)
                  if count > 1 else 0.0)
        read_stall = max(0.0, queued + tr - self.last_s) if count > 1 else 0.0
        read_stall += max(0.0, tr - self.full_s) * max(0, count - 2)
        reverse = self.reverse + read_stall + self.stores * tx  # reads
        return Prediction("async-multistage", forward + reverse, forward, reverse, self.steps,
                          write_stall, read_stall)


def _interval(n: int, interval: int, l1_slots: int, costs: Costs, staging_buffers: int,
              taping: bool) -> _Interval:
    """The tier-free terms of :func:`predict_async_multistage` of checked arguments."""
    snaps = l1_slots + 1
    count = -(-n // interval)
    last = n - (count - 1) * interval
    level2_stores = count - 1 + (last > 1 or not taping)
    forward = (count - 1) * costs.advance(interval) + last * costs.tf \
        + level2_stores * (costs.tc + costs.tx)
    full = range_counts(interval, snaps, taping, costs.slack, False)
    last_counts = range_counts(last, snaps, taping, costs.slack, True)
    full_s = full.seconds(costs, interval)
    last_s = last_counts.seconds(costs, last) - last * costs.tf  # its forward part is above
    steps = (count - 1) * (interval + full.steps) + last_counts.steps
    return _Interval(count, last, level2_stores, costs.advance(interval) + costs.tc + costs.tx,
                     forward, full_s, last_s, last_s + (count - 1) * full_s, steps,
                     staging_buffers)


def _async_multistage(n: int, interval: int, l1_slots: int, costs: Costs, tw: float, tr: float,
                      staging_buffers: int, taping: bool) -> Prediction:
    """:func:`predict_async_multistage` of checked arguments, with the Level-2 costs ``tw`` and
    ``tr`` in place of those of ``costs`` (a tier's)."""
    return _interval(n, interval, l1_slots, costs, staging_buffers, taping).over(tw, tr,
                                                                                costs.tx)


def adaptive_interval(costs: Costs, min_interval: int = 1) -> int:
    """The interval ``interval="adaptive"`` settles on under steady costs: the first state
    reached after the previous Level-2 write (``tw``, handed over after its staging copy ``tc``)
    has ended, advancing in one call, and never fewer than ``min_interval`` steps."""
    min_interval = check_int("min_interval", min_interval, 1)
    busy = costs.tw - costs.tc - costs.tcall
    return max(min_interval, math.ceil(busy / costs.tf) if busy > 0 else 1)


def predict_adaptive(n_steps: int, l1_slots: int, costs: Costs, *, min_interval: int = 1,
                     staging_buffers: int = 2, taping: bool = True) -> Prediction:
    """``interval="adaptive"`` under steady costs: :func:`predict_async_multistage` at
    :func:`adaptive_interval`, with the last interval's forward sweep reused only where it ends
    within ``min_interval`` of u_n (otherwise the run advances through it once more, reversing
    it from its stored start).

    A run whose costs change mid-run settles on each part's interval in turn; the runtime's
    executed trace (``keep_trace=True``) priced by :func:`simulate_times` gives its exact
    prediction.
    """
    n = check_int("n_steps", n_steps, 1)
    interval = min(adaptive_interval(costs, min_interval), n)
    prediction = predict_async_multistage(n, interval, l1_slots, costs,
                                          staging_buffers=staging_buffers, taping=taping)
    last = n - (math.ceil(n / interval) - 1) * interval
    extra = 0.0
    if interval > min_interval and last > min_interval:
        # the last interval is advanced through, then reversed from its start: read back as
        # soon as the sweep ends, behind its own write
        extra = costs.advance(last) + costs.tc + max(0.0, costs.tw + costs.tr - costs.advance(last))
    return replace(prediction, strategy="adaptive", total_s=prediction.total_s + extra,
                   reverse_s=prediction.reverse_s + extra)


@dataclass(frozen=True, slots=True)
class IntervalChoice:
    """The interval with the least predicted time, and the baselines beside it."""

    interval: int
    prediction: Prediction
    revolve: Prediction
    store_all: Prediction


class FirstTouch(Protocol):
    """The price of memory a run touches for the first time, as the runtime knows it (the
    runtime's ``FreshMemory`` prices page faults): ``slots_s(slots)``, the seconds a run's first
    ``slots`` Level-1 slots add on the main thread, and ``split(tiers, slots)``, Level-2's tiers
    with the states whose first touch lengthens their writes as tiers of their own."""

    def slots_s(self, slots: int) -> float: ...

    def split(self, tiers: Sequence[Level2Tier], slots: int) -> list[Level2Tier]: ...


def _tier_shares(stores: int, tiers: Sequence[Level2Tier]) -> list[tuple[Level2Tier, int]]:
    """How many of ``stores`` Level-2 states each tier holds: the forward sweep frees nothing, so
    states fill the tiers in order."""
    shares, left = [], stores
    for tier in tiers:
        taken = left if tier.capacity is None else min(left, tier.capacity)
        if taken:
            shares.append((tier, taken))
        left -= taken
    if left:
        raise InvalidValueError(f"{stores} Level-2 states do not fit in tiers holding "
                                f"{stores - left}")
    return shares


def predict_tiered(n_steps: int, interval: int, l1_slots: int, costs: Costs,
                   tiers: Sequence[Level2Tier], *, staging_buffers: int = 2,
                   taping: bool = True, fresh: FirstTouch | None = None) -> Prediction:
    """:func:`predict_async_multistage` over a tiered Level-2: each tier's prediction (its own
    ``tw`` and ``tr``), weighted by the share of the schedule's Level-2 states it holds. With
    ``fresh``, the faults of the memory the run touches first: of the slots an interval's
    reversal uses (at most I), and of the in-memory tiers' states.

    Raises
    ------
    InvalidValueError
        If the tiers cannot hold the schedule's Level-2 states.
    """
    n_steps = check_int("n_steps", n_steps, 1)
    interval = check_int("interval", interval, 1, n_steps)
    l1_slots = check_int("l1_slots", l1_slots, 1)
    return _tiered(n_steps, interval, l1_slots, costs, tiers, staging_buffers, taping, fresh)


def _tiered(n_steps: int, interval: int, l1_slots: int, costs: Costs,
            tiers: Sequence[Level2Tier], staging_buffers: int, taping: bool,
            fresh: FirstTouch | None) -> Prediction:
    """:func:`predict_tiered` of checked arguments."""
    faults = 0.0
    if fresh is not None:
        slots = min(l1_slots, interval)
        faults = fresh.slots_s(slots)
        tiers = fresh.split(tiers, slots)
    stores = -(-n_steps // interval)
    shares = _tier_shares(stores, tiers)
    terms = _interval(n_steps, interval, l1_slots, costs, staging_buffers, taping)
    total = forward = reverse = write_stall = read_stall = 0.0
    for tier, taken in shares:  # each tier's prediction, weighted by the states it holds
        weight, part = taken / stores, terms.over(tier.tw, tier.tr, costs.tx)
        total += weight * part.total_s
        forward += weight * part.forward_s
        reverse += weight * part.reverse_s
        write_stall += weight * part.write_stall_s
        read_stall += weight * part.read_stall_s
    return Prediction("async_multistage_tiered", faults + total, faults + forward, reverse,
                      terms.steps, write_stall, read_stall)


def tiers_hold(n_steps: int, interval: int, tiers: Sequence[Level2Tier]) -> bool:
    """Whether ``tiers`` can hold the Level-2 states of an interval."""
    room = [t.capacity for t in tiers]
    return None in room or sum(c for c in room if c is not None) >= math.ceil(n_steps / interval)


#: How far apart the geometric grid's intervals are beyond ``max_candidates``.
GRID_RATIO = 1.1

#: The coarse grid's intervals are ``GRID_RATIO ** COARSE_STEPS`` apart; each of its
#: :data:`DIPS` lowest dips is narrowed by square roots to ``GRID_RATIO``.
COARSE_STEPS = 4
DIPS = 2

#: Full binomial lengths priced around each dip at most (:func:`~schedules._search.full_lengths`).
FULL_LENGTHS = 8

#: Runs of fewer intervals than this are priced on a grid ``GRID_RATIO ** FEW_STEPS``
#: apart.
FEW_INTERVALS = 64
FEW_STEPS = 2

#: The refinement stops at steps of ``I / EXACT_TO`` around the best interval I.
EXACT_TO = 1024

#: Intervals priced in each round of :func:`choose_interval`'s search beyond its grid.
REFINE_POINTS = 16


def choose_interval(n_steps: int, l1_slots: int, costs: Costs, *, staging_buffers: int = 2,
                    max_candidates: int = 4096, taping: bool = True,
                    tiers: Sequence[Level2Tier] | None = None,
                    fresh: FirstTouch | None = None,
                    min_interval: int = 1) -> IntervalChoice:
    """Return the interval I in [``min_interval``, n] with the least predicted time (closed
    form with stalls).

    The first ``max_candidates`` intervals are priced one by one. Above them, a search whose
    cost does not grow with n: a coarse grid (:data:`COARSE_STEPS`; finer where a run has
    fewer than :data:`FEW_INTERVALS` intervals, whose last one's length makes the price bumpy)
    and the full binomial lengths, where Revolve's recomputation per step dips, up to where
    no interval can price below the best (:func:`~schedules._search.beaten_up_to`); then the :data:`DIPS`
    lowest dips narrowed to :data:`GRID_RATIO` apart, and the range between the priced
    intervals beside the best in rounds of :data:`REFINE_POINTS` evenly spaced intervals, down
    to steps of I / :data:`EXACT_TO`. Ties go to the smaller I (fewer states recomputed,
    sooner overlap). With ``tw <= tf`` this is 1. With ``tiers`` (a tiered Level-2, fastest
    first), each interval is priced by :func:`predict_tiered` and intervals whose states the
    tiers cannot hold are skipped. ``fresh`` prices the first touch of the memory each
    schedule uses (Revolve's included).

    Raises
    ------
    InvalidValueError
        If ``tiers`` hold no state at all.
    """
    n = check_int("n_steps", n_steps, 1)
    l1_slots = check_int("l1_slots", l1_slots, 1)
    first = check_int("min_interval", min_interval, 1, n)
    max_candidates = check_int("max_candidates", max_candidates, 1)
    if tiers is None and fresh is not None:
        tiers = [Level2Tier(None, costs.tw, costs.tr)]
    if fresh is not None and tiers is not None:
        fresh = Remembered(fresh, tiers)
    room = None if tiers is None or any(t.capacity is None for t in tiers) else sum(
        t.capacity for t in tiers if t.capacity is not None)
    priced: dict[int, Prediction | None] = {}  # None: the tiers cannot hold its states
    best_interval, best = 0, None

    def price(interval: int) -> None:
        nonlocal best_interval, best
        if interval in priced or not first <= interval <= n:
            return
        if tiers is None:
            prediction = _async_multistage(n, interval, l1_slots, costs, costs.tw, costs.tr,
                                           staging_buffers, taping)
        elif room is None or room >= -(-n // interval):  # the tiers hold its states
            prediction = _tiered(n, interval, l1_slots, costs, tiers, staging_buffers, taping,
                                 fresh)
        else:
            priced[interval] = None
            return
        priced[interval] = prediction
        if best is None or prediction.total_s < best.total_s * (1 - 1e-12) or (
                prediction.total_s <= best.total_s * (1 + 1e-12) and interval < best_interval):
            best_interval, best = interval, prediction

    for interval in range(first, min(n, first + max_candidates - 1) + 1):
        price(interval)
    above = first + max_candidates - 1
    if above < n:
        beaten, value = 0, float(above)
        while value < n:  # the coarse grid, up to where no price can reach the best
            if int(value) > beaten:
                price(int(value))
                if best is not None:
                    beaten = max(beaten, beaten_up_to(n, int(value), l1_slots, costs,
                                                       taping, best))
            # few intervals of I steps make a bumpy price (the last one's length): 10% apart
            value *= GRID_RATIO ** (FEW_STEPS if value * FEW_INTERVALS >= n else COARSE_STEPS)
        price(n)
        # and the full binomial lengths as far as they lie a grid step apart
        for length in full_lengths(l1_slots + 1, above, n, apart=GRID_RATIO):
            if length > beaten:  # one step more: the taping step's
                price(length)
                price(length + 1)
        for centre in lowest_dips(priced, DIPS):  # each dip narrowed to GRID_RATIO apart
            ratio = GRID_RATIO ** COARSE_STEPS
            while ratio > GRID_RATIO * (1 + 1e-9):
                ratio = math.sqrt(ratio)
                for interval in (int(centre / ratio), int(centre * ratio)):
                    price(interval)
                centre = least(priced, (centre, int(centre / ratio), int(centre * ratio)))
            # Revolve's recomputation per step dips at full binomial lengths
            for length in full_lengths(l1_slots + 1, int(centre / ratio),
                                        int(centre * ratio), most=FULL_LENGTHS):
                for interval in (length - 1, length, length + 1):
                    price(interval)
    if best is None:
        raise InvalidValueError("the Level-2 tiers hold no state: give one a capacity")
    if best_interval > above:  # between the intervals priced beside the best
        low = max(i for i in priced if i < best_interval)
        high = min((i for i in priced if i > best_interval), default=best_interval)
        # rounds of REFINE_POINTS evenly spaced, each between the best one's neighbours, down
        # to every interval: O(log n) prices, where pricing each one took O(n)
        while high - low > 1:
            step = -(-(high - low) // REFINE_POINTS)
            for interval in range(low + step, high, step):
                price(interval)
            if step <= max(1, best_interval // EXACT_TO):
                break
            low, high = max(low, best_interval - step), min(high, best_interval + step)
    return IntervalChoice(best_interval, best,
                          predict_revolve(n, l1_slots, costs, taping=taping, fresh=fresh),
                          predict_store_all(n, costs, taping=taping))
