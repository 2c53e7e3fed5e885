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

import functools
import math
from collections.abc import Sequence
from dataclasses import dataclass, replace
from typing import Protocol

from ._args import check_int
from ._errors import InvalidValueError
from .costs import CodecCosts, Costs, Level2Tier, Prediction
from .revolve import checkpoints_taken, loads_kept, optimal_recomputations
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


@dataclass(frozen=True, slots=True)
class _Counts:
    """What reversing one range costs in forward steps, forward calls and in-memory copies."""

    steps: int
    calls: int
    copies: int

    def seconds(self, costs: Costs, reverses: int) -> float:
        return (self.steps * costs.tf + self.calls * costs.tcall + reverses * costs.adjoint
                + self.copies * costs.tc)


@functools.lru_cache(maxsize=1 << 16)  # "auto" prices thousands of plans over few ranges
def _range_counts(length: int, snaps: int, taping: bool, slack: int, *,
                  reaches_end: bool) -> _Counts:
    """Counts of :func:`schedules.revolve.reverse_range` over ``length`` steps from a stored start
    (or of :func:`~schedules.revolve.forward_then_reverse` with ``reaches_end``: the live state
    is the start on entry and the range's forward part runs to u_n first).

    Every reverse step but the last is followed by a load, but for those that find the state
    held (``slack``, :func:`~schedules.revolve.loads_kept`); with taping each loop of the
    generator advances once, and without, every loop but the reverse of a range's start does
    (each store opens one more range).
    """
    if not taping and reaches_end:
        length += 1  # the fictitious step n, whose reverse is dropped
    stores = checkpoints_taken(length, snaps)
    loads = length - 1 if reaches_end else length
    kept = loads_kept(length, snaps, slack, taping, ends_forward=reaches_end) if slack else 0
    if taping:
        steps = length + optimal_recomputations(length, snaps)
        calls = stores + length
    else:
        steps = optimal_recomputations(length, snaps)
        calls = length - 1
    return _Counts(steps, calls, stores + loads - kept)


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
    counts = _range_counts(n, snaps, taping, costs.slack, reaches_end=True)
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


def _async_multistage(n: int, interval: int, l1_slots: int, costs: Costs, tw: float, tr: float,
                      staging_buffers: int, taping: bool) -> Prediction:
    """:func:`predict_async_multistage` of checked arguments, with the Level-2 costs ``tw`` and
    ``tr`` in place of those of ``costs`` (a tier's)."""
    snaps = l1_slots + 1
    count = math.ceil(n / interval)
    last = n - (count - 1) * interval
    level2_stores = count - 1 + (last > 1 or not taping)
    compute_fwd = costs.advance(interval) + costs.tc + costs.tx
    write_bound = max(0, level2_stores - staging_buffers)
    write_stall = max(0.0, tw - compute_fwd) * write_bound
    forward = (count - 1) * costs.advance(interval) + last * costs.tf \
        + level2_stores * (costs.tc + costs.tx) + write_stall

    full = _range_counts(interval, snaps, taping, costs.slack, reaches_end=False)
    last_counts = _range_counts(last, snaps, taping, costs.slack, reaches_end=True)
    full_s = full.seconds(costs, interval)
    last_s = last_counts.seconds(costs, last) - last * costs.tf  # its forward part is above
    # the first prefetch waits behind the writes still queued at the end of the forward sweep
    queued = min(staging_buffers, count) * max(0.0, tw - compute_fwd) if count > 1 else 0.0
    read_stall = max(0.0, queued + tr - last_s) if count > 1 else 0.0
    read_stall += max(0.0, tr - full_s) * max(0, count - 2)
    reverse = last_s + (count - 1) * full_s + read_stall + level2_stores * costs.tx  # reads
    steps = (count - 1) * (interval + full.steps) + last_counts.steps
    return Prediction("async-multistage", forward + reverse, forward, reverse, steps,
                      write_stall, read_stall)


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
    stores = math.ceil(n_steps / interval)
    shares = _tier_shares(stores, tiers)
    parts = [(taken / stores, _async_multistage(n_steps, interval, l1_slots, costs, tier.tw,
                                                tier.tr, staging_buffers, taping))
             for tier, taken in shares]
    first = parts[0][1]
    return Prediction(
        "async_multistage_tiered",
        faults + sum(w * p.total_s for w, p in parts),
        faults + sum(w * p.forward_s for w, p in parts),
        sum(w * p.reverse_s for w, p in parts), first.forward_steps,
        sum(w * p.write_stall_s for w, p in parts), sum(w * p.read_stall_s for w, p in parts))


def tiers_hold(n_steps: int, interval: int, tiers: Sequence[Level2Tier]) -> bool:
    """Whether ``tiers`` can hold the Level-2 states of an interval."""
    room = [t.capacity for t in tiers]
    return None in room or sum(c for c in room if c is not None) >= math.ceil(n_steps / interval)


#: Intervals priced in each round of :func:`choose_interval`'s search beyond its grid.
REFINE_POINTS = 16


def choose_interval(n_steps: int, l1_slots: int, costs: Costs, *, staging_buffers: int = 2,
                    max_candidates: int = 4096, taping: bool = True,
                    tiers: Sequence[Level2Tier] | None = None,
                    fresh: FirstTouch | None = None) -> IntervalChoice:
    """Return the interval I in [1, n] with the least predicted time (closed form with stalls).

    Every I up to ``max_candidates`` is priced, and a geometric grid above it (10% apart), then
    the range between the best grid point's neighbours, in rounds of :data:`REFINE_POINTS`
    evenly spaced intervals each narrowed to the best one's neighbours, down to every interval; ties go to the smaller I (fewer states
    recomputed, sooner overlap). With ``tw <= tf`` this is 1. With
    ``tiers`` (a tiered Level-2, fastest first), each interval is priced by
    :func:`predict_tiered` and intervals whose states the tiers cannot hold are skipped.
    ``fresh`` prices the first touch of the memory each schedule uses (Revolve's included).

    Raises
    ------
    InvalidValueError
        If ``tiers`` hold no state at all.
    """
    n = check_int("n_steps", n_steps, 1)
    l1_slots = check_int("l1_slots", l1_slots, 1)
    candidates = set(range(1, min(n, max_candidates) + 1))
    value = float(max_candidates)
    while value < n:
        candidates.add(int(value))
        value *= 1.1
    candidates.add(n)
    if tiers is None and fresh is not None:
        tiers = [Level2Tier(None, costs.tw, costs.tr)]
    best_interval, best = 0, None

    def price(interval: int) -> None:
        nonlocal best_interval, best
        if tiers is None:
            prediction = _async_multistage(n, interval, l1_slots, costs, costs.tw, costs.tr,
                                           staging_buffers, taping)
        elif tiers_hold(n, interval, tiers):
            prediction = _tiered(n, interval, l1_slots, costs, tiers, staging_buffers, taping,
                                 fresh)
        else:
            return
        if best is None or prediction.total_s < best.total_s * (1 - 1e-12):
            best_interval, best = interval, prediction

    grid = sorted(candidates)
    for interval in grid:
        price(interval)
    if best is None:
        raise InvalidValueError("the Level-2 tiers hold no state: give one a capacity")
    if best_interval > max_candidates:  # between the grid points beside the best
        at = grid.index(best_interval)
        low, high = grid[at - 1], grid[min(at + 1, len(grid) - 1)]
        # rounds of REFINE_POINTS evenly spaced, each between the best one's neighbours, down
        # to every interval: O(log n) prices, where pricing each one took O(n)
        while high - low > 1:
            step = -(-(high - low) // REFINE_POINTS)
            for interval in range(low + step, high, step):
                if interval not in candidates:
                    candidates.add(interval)
                    price(interval)
            if step == 1:
                break
            low, high = max(low, best_interval - step), min(high, best_interval + step)
    return IntervalChoice(best_interval, best,
                          predict_revolve(n, l1_slots, costs, taping=taping, fresh=fresh),
                          predict_store_all(n, costs, taping=taping))
