"""The runtime's own work per step, counted rather than timed: with operators that do nothing
and a tiny state, every function call a run makes is the runtime's (the schedule's generators
included). A count is the same on any machine and under any load, so a change that adds
per-action work (a description formatted for every transfer, a numpy scalar per lookup, a
ctypes object per store) shows here as a number, not as noise in a benchmark
(benchmarks/bench_action_cost.py times the same runs)."""
from __future__ import annotations

import sys
from types import FrameType
from typing import Any

import numpy as np
import pytest

from asyncckpt import ArrayCheckpoint, AsyncCheckpointer


class Nothing:
    def apply(self, *, t_start: int, t_end: int) -> None:
        pass


def calls_per_step(interval: int, n: int = 400) -> float:
    """Function calls (Python and C) per step of the second forward+reverse run of ``n`` steps
    of an 8-byte state at ``interval``, ``l1_slots=10``, Level-2 in DRAM."""
    state = np.zeros(1)
    with AsyncCheckpointer(ArrayCheckpoint([state]), Nothing(), Nothing(), n, l1_slots=10,
                           interval=interval, storage="dram") as ckp:
        ckp.apply_forward()  # the first run makes the buffers
        ckp.apply_reverse()
        seen = [0]

        def count(frame: FrameType, event: str, arg: Any) -> None:
            if event in ("call", "c_call"):
                seen[0] += 1

        before = sys.getprofile()
        sys.setprofile(count)
        try:
            ckp.apply_forward()
            ckp.apply_reverse()
        finally:
            sys.setprofile(before)
        assert ckp.stats.reverse_steps == n
    return seen[0] / n


@pytest.mark.parametrize(("interval", "most"), [(1, 160), (10, 77), (0, 64)])
def test_a_step_of_tiny_states_costs_a_bounded_number_of_calls(interval: int,
                                                                 most: int) -> None:
    """At interval 1 every step is a Level-2 store, prefetch, load and free (7 actions); at
    interval 10 mostly Level-1 copies (6 actions); at 0 Revolve in the Level-1 slots alone
    (5 actions). The engine's inline transfers name no call and wait on nothing already done,
    its per-state tables answer in plain ints, and a store asks for no buffer's address where
    no NUMA node is bound: 227 and 116 calls a step, then 189 and 108. A schedule's actions
    come in chunks from one generator, no longer through four nested ones, each built with
    its slots set directly; the interpreter dispatches on an action's type, the clock itself
    marks a call's start, and a Level-2 transfer is called without a wrapper: 185, 104 and 83
    calls a step, then 157, 75 and 62."""
    assert calls_per_step(interval) <= most
