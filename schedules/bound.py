"""The machine's bound: the least time any plan the runtime could run would take on a machine
whose costs are measured, were every Level-2 transfer overlapped perfectly with the compute
(docs/benchmarks.md, "The machine's bound").

A plan is Revolve in the memory alone, or every I-th state on Level-2 and Revolve with ``s``
slots inside each interval. It takes at least the longer of its compute (``n tf``, the reverse
calls, the recomputation Revolve needs and a copy per state stored and loaded) and its Level-2
device's work (a write and a read per state it holds). States the memory holds beside the slots
and the two transfer buffers every multistage plan needs go to DRAM, whose transfers cost
nothing beyond their copies. No plan the runtime runs can beat the least of these over I and
s; how far a run is from it is what its overheads cost (stalls, contention, the runtime's own
work).
"""
from __future__ import annotations

import math
from dataclasses import dataclass, replace

from ._args import check_int
from ._search import full_lengths
from .costs import Costs
from .model import _interval, predict_revolve

__all__ = ["Bound", "machine_bound"]

#: The buffers a multistage plan needs beside its slots: one state in flight each way.
TRANSFER_BUFFERS = 2


@dataclass(frozen=True)
class Bound:
    """The least time of any plan (``total_s``), what its compute and its Level-2 device's
    work take (``compute_s``, ``device_s``: the longer is the bound), the plan that reaches it
    (``interval`` 0: Revolve in the memory alone; ``slots`` Level-1 slots) and the floor beside
    it (``floor_s``: the forward sweep and the reverse calls, nothing stored or recomputed)."""

    total_s: float
    compute_s: float
    device_s: float
    interval: int
    slots: int
    floor_s: float


def machine_bound(n_steps: int, memory_states: int, costs: Costs, *,
                  taping: bool = True) -> Bound:
    """The least time over the plans of a run of ``n_steps`` steps in memory for
    ``memory_states`` states, with perfect overlap of Level-2 transfers and compute.

    ``costs``: ``tf`` a forward step, ``tb`` a reverse step (with its taping step where
    ``taping``), ``tw`` and ``tr`` one state's write and read on the Level-2 device at the
    bandwidth it sustains while the compute runs, ``tc`` one copy of a state in memory
    (``tcall``, ``tx`` and ``slack`` are not used: a bound has no per-call overhead).

    Raises
    ------
    InvalidValueError
        If ``n_steps`` or ``memory_states`` is below 1.
    """
    n = check_int("n_steps", n_steps, 1)
    memory = check_int("memory_states", memory_states, 1)
    bare = replace(costs, tcall=0.0, tx=0.0, slack=0)
    floor = n * bare.tf + n * bare.adjoint
    alone = predict_revolve(n, max(1, min(memory, n)), bare, taping=taping)
    best = Bound(alone.total_s, alone.total_s, 0.0, 0, min(memory, n), floor)
    most = memory - TRANSFER_BUFFERS
    slots = 1
    while slots <= most:
        best = _least_with(n, slots, memory, bare, taping, best)
        slots = max(slots + 1, math.floor(slots * 1.25))
    return best


def _least_with(n: int, slots: int, memory: int, costs: Costs, taping: bool,
                best: Bound) -> Bound:
    """``best``, or the plan with ``slots`` slots that beats it."""
    intervals = set(range(1, min(n, 64) + 1))
    value = 64.0
    while value < n:
        intervals.add(int(value))
        value *= 1.05
    for length in full_lengths(slots + 1, 2, n, apart=1.05):
        intervals.update((length, min(n, length + 1)))
    intervals.add(n)
    in_dram = max(0, memory - slots - TRANSFER_BUFFERS)
    for interval in sorted(intervals):
        terms = _interval(n, interval, slots, costs, TRANSFER_BUFFERS, taping)
        compute = terms.forward + terms.reverse
        device = max(0, terms.stores - in_dram) * (costs.tw + costs.tr)
        if max(compute, device) < best.total_s:
            best = Bound(max(compute, device), compute, device, interval, slots, best.floor_s)
    return best
