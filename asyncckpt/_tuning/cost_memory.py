"""What the process remembers of the costs its checkpointers measured, and how the ranks of an
MPI job agree on them."""
from __future__ import annotations

import threading
from copy import deepcopy
from dataclasses import astuple, fields, replace
from typing import Any

from schedules.model import CodecCosts

from .residual import Missed
from .tuner import IntervalTuner

__all__ = ["AGREED_LARGEST", "COSTS", "CostMemory", "agree_costs"]


class CostMemory:
    """The costs measured in this process, by what they depend on (``cost_key``), so the
    next checkpointer of the same operators and state size (a fresh ``Revolver`` per gradient,
    as Devito builds it) starts from them instead of probing. Thread-safe; what it holds and
    hands out are copies."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._tuners: dict[tuple[object, ...], IntervalTuner] = {}

    def __len__(self) -> int:
        with self._lock:
            return len(self._tuners)

    def recall(self, key: tuple[object, ...], tuner: IntervalTuner, *,
               otherwise: tuple[object, ...] | None = None) -> IntervalTuner:
        """``tuner`` with the costs the last run under ``key`` measured, else those under
        ``otherwise`` (the other protocol's: a first taping-free run after taping ones starts
        from their reverse call's cost instead of guessing it), if any."""
        with self._lock:
            known = self._tuners.get(key)
            if known is None and otherwise is not None:
                known = self._tuners.get(otherwise)
            known = deepcopy(known)
        if known is None:
            return tuner
        same_tiers = (known.tier_costs is not None and tuner.tier_costs is not None
                      and len(known.tier_costs) == len(tuner.tier_costs))
        same_paths = same_tiers or (known.tier_costs is None and tuner.tier_costs is None)
        recalled = deepcopy(tuner)
        recalled.quiet, recalled.busy = known.quiet, known.busy
        recalled.runs, recalled.fault_s, recalled.tx = known.runs, known.fault_s, known.tx
        recalled.misses, recalled.doubted = known.misses, known.doubted
        recalled.caller = known.caller
        if known.codec is not None:
            recalled.codec = known.codec
        recalled.transfers = replace(
            tuner.transfers, tw=known.tw, tr=known.tr,
            tier_costs=known.tier_costs if same_tiers else tuner.tier_costs,
            loaded_costs=known.loaded_costs if same_paths and known.loaded_costs is not None
            else tuner.loaded_costs)
        return recalled

    def keep(self, key: tuple[object, ...], tuner: IntervalTuner) -> None:
        """Keep ``tuner``'s measured costs for the next checkpointer under ``key``."""
        with self._lock:
            self._tuners[key] = deepcopy(tuner)

    def forget(self) -> None:
        """Forget every cost measured in this process: the next "auto" checkpointer probes
        anew."""
        with self._lock:
            self._tuners.clear()


#: The process's cost memory (``asyncckpt.cost_memory``).
COSTS = CostMemory()


#: The tuner's costs on which every rank takes the largest: the slowest rank sets the pace of
#: all, since every operator call waits for it (and every rank waits for the one paying most
#: to fault memory in).
AGREED_LARGEST = ("tf", "tb", "tcall", "tw", "tr", "tc", "fault_s", "tf_busy", "tcall_busy",
                  "tb_busy", "tc_busy", "tx", "tq")


def agree_costs(tuner: IntervalTuner, group: Any) -> None:
    """Give ``tuner`` the largest of every rank's costs (:data:`AGREED_LARGEST`, each tier's,
    the codec's and the residuals too), the fewest warm buffers and the first tier any rank
    holds in process memory, in one reduction (``group``: the ranks,
    :mod:`asyncckpt._execution.ranks`; every rank prices the same tiers)."""
    tiers = tuner.tier_costs or []
    codec = tuner.codec
    largest = [getattr(tuner, name) for name in AGREED_LARGEST]
    largest += [tuner.residual[False], tuner.residual[True], *astuple(tuner.missed)]
    largest += [cost for pair in tiers for cost in pair]
    largest += [None] * 3 if codec is None else [codec.compress_s, codec.decompress_s,
                                                 codec.stored]
    # a reverse call's cost beyond its forward step: tb is the slowest forward step and the
    # slowest reverse call, never a tb from one rank below a tf from another
    largest += [tuner.quiet.adjoint, tuner.busy.adjoint]
    # Level-2 in process memory on any rank prices its states' faults on all: a rank whose
    # Level-2 is a directory and one whose is DRAM would otherwise price plans differently
    least = [tuner.in_memory, tuner.warm_buffers, 0 if codec is None else 1]
    agreed, fewest = group.agree(largest, least)
    in_memory, warm_buffers, every_codec = fewest
    tuner.in_memory = None if in_memory is None else int(in_memory)
    tuner.warm_buffers = int(warm_buffers)
    named = len(AGREED_LARGEST)
    for name, value in zip(AGREED_LARGEST, agreed):
        setattr(tuner, name, value)
    tuner.residual = {False: agreed[named], True: agreed[named + 1]}
    sums = named + 2 + len(fields(Missed))
    tuner.missed = Missed(*agreed[named + 2:sums])
    rest = agreed[sums:]
    if tuner.tier_costs is not None:
        tuner.tier_costs = [(rest[2 * i], rest[2 * i + 1]) for i in range(len(tiers))]
    compress_s, decompress_s, stored, *adjoints = rest[2 * len(tiers):]
    for part, adjoint in zip((tuner.quiet, tuner.busy), adjoints):
        if part.tf is not None and adjoint is not None:
            part.tb = part.tf + adjoint
    tuner.codec = (None if not every_codec else
                   CodecCosts(compress_s, decompress_s, stored))
