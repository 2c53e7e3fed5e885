"""An event simulation of a schedule's actions on the model's costs: what the closed forms of
:mod:`schedules.model` predict, step by step, with the staging buffers and prefetches in
between."""
from __future__ import annotations

import heapq
from collections.abc import Iterable
from typing import assert_never

from .actions import (Action, Advance, EndForward, EndReverse, Free, Load, Prefetch, Reverse, Store,
                      Tier)
from .costs import Costs, Prediction
from .live import LiveRing, RingField

__all__ = ["simulate_times"]


def simulate_times(actions: Iterable[Action], costs: Costs, *, staging_buffers: int = 2,
                   channels: int = 1) -> Prediction:
    """Walk a schedule's actions with a main thread and ``channels`` transfer channels.

    Stores to Level-2 take a staging buffer (the main thread waits for the earliest write to end
    when none is free); prefetches queue on the channels behind earlier transfers and after the
    write of their own state; a load from Level-2 waits for its prefetch. A load of the state
    the live arrays still hold (``costs.slack``) within a sweep costs nothing.
    """
    channel_free = [0.0] * channels
    heapq.heapify(channel_free)
    now = 0.0
    forward_end = None
    in_flight: list[float] = []  # end times of writes holding staging buffers
    written: dict[int, float] = {}
    arrives: dict[int, float] = {}
    write_stall = read_stall = 0.0
    steps = 0
    # a state as one level of a ring with slack rows beyond it: a load right after a call of
    # at most that many steps from it costs nothing (with no slack, every load costs)
    live = LiveRing((RingField("u", costs.slack + 1, (0,), 1),))

    def transfer(ready: float, cost: float) -> float:
        start = max(heapq.heappop(channel_free), ready)
        end = start + cost
        heapq.heappush(channel_free, end)
        return end

    for action in actions:
        match action:
            case Advance(start=begin, end=end):
                steps += end - begin
                now += costs.advance(end - begin)
                live.advanced(begin, end)
            case Reverse():
                now += costs.adjoint
            case Store(step=step, tier=Tier.L2):
                in_flight = [t for t in in_flight if t > now]
                if len(in_flight) >= staging_buffers:
                    earliest = min(in_flight)
                    write_stall += earliest - now
                    now = earliest
                    in_flight.remove(earliest)
                now += costs.tc + costs.tx
                live.hold(step)
                done = transfer(now, costs.tw)
                in_flight.append(done)
                written[step] = done
            case Store(step=step):
                now += costs.tc
                live.hold(step)
            case Prefetch(step=step):
                arrives[step] = transfer(max(now, written.get(step, 0.0)), costs.tr)
                now += costs.tx
            case Load(step=step) if costs.slack and live.holds(step):
                pass
            case Load(step=step, tier=tier):
                if tier is Tier.L2 and arrives[step] > now:
                    read_stall += arrives[step] - now
                    now = arrives[step]
                now += costs.tc
                live.hold(step)
            case Free(step=step, tier=Tier.L2):
                arrives.pop(step, None)
            case Free():
                pass
            case EndForward():
                if forward_end is None:
                    forward_end = now
                live.forget()  # the live state is trusted no more between the sweeps
            case EndReverse():
                pass
            case _:
                assert_never(action)
    forward_end = now if forward_end is None else forward_end
    return Prediction("simulated", now, forward_end, now - forward_end, steps, write_stall,
                      read_stall)
