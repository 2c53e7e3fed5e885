"""The price of memory a run touches for the first time: the page faults of fresh state
buffers, which the runtime measures (``calibrate.measure_fault``) and counts (its warm
buffers), handed to the model as its :class:`schedules.model.FirstTouch`."""
from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, replace
from typing import Any

from schedules._args import check_int
from schedules.model import Level2Tier

from ..errors import InvalidValueError

__all__ = ["FreshMemory", "probe_buffers"]


@dataclass(frozen=True, slots=True)
class FreshMemory:
    """The price of memory a run touches for the first time.

    The first ``warm`` state buffers a run uses are already faulted in (kept from an earlier
    run); each further one costs ``fault_s`` seconds when first touched. Level-1 slots take
    them first, on the main thread, so their faults add to the run; states of an in-memory
    Level-2 tier take the rest, on the transfer thread, so their faults lengthen those writes.
    """

    warm: int
    fault_s: float

    def __post_init__(self) -> None:
        check_int("FreshMemory.warm", self.warm, 0)
        value = self.fault_s
        if (not isinstance(value, (int, float)) or isinstance(value, bool)
                or not math.isfinite(value) or value < 0):
            raise InvalidValueError(f"FreshMemory.fault_s must be a finite number of seconds "
                                    f">= 0, got {self.fault_s!r}")

    def slots_s(self, slots: int) -> float:
        """Seconds of faults for ``slots`` Level-1 slots."""
        return max(0, slots - self.warm) * self.fault_s

    def split(self, tiers: Sequence[Level2Tier], slots: int) -> list[Level2Tier]:
        """``tiers`` with each in-memory tier split into its warm states and its fresh ones
        (written in ``tw + fault_s``), once ``slots`` slots have taken their share."""
        warm, split = max(0, self.warm - slots), []
        for tier in tiers:
            if not tier.in_memory:
                split.append(tier)
                continue
            kept = warm if tier.capacity is None else min(warm, tier.capacity)
            warm -= kept
            fresh = None if tier.capacity is None else tier.capacity - kept
            if kept:
                split.append(replace(tier, capacity=kept))
            if fresh != 0:
                split.append(replace(tier, capacity=fresh, tw=tier.tw + self.fault_s))
        return split


def probe_buffers(planner: Any, made: int, engine: Any, slots_fixed: bool) -> int | None:
    """Fresh buffers the fault probe may make (they go to the pool for the run to use): what
    the budget or the default bound leaves beside the ``made`` slots and the buffers the
    ``engine`` holds, else, with fixed slots, what the plan itself will hold beside them (a
    run directory on tmpfs charges its own room; a probe beyond the plan would stay in the
    pool, resident beside it); None: unbounded."""
    room = planner.room(made, engine)
    if room is None and slots_fixed:
        room = planner.l1_slots - made + planner.memory.engine_buffers - engine.buffers_held
    return None if room is None else max(1, room)
