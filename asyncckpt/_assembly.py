"""How a checkpointer's parts are made: the planner of its runs, Level-2's measured costs and
where transfers run, the transfer engine, the interpreter, the meter and, where the model
chooses the plan, the tuner."""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from schedules import AsyncMultistage

from ._auto import AutoPlanner
from ._budget import MemoryPlan
from ._calibrate import THREAD_HANDOFF_S, measure_codec, measure_level2
from ._engine import TransferEngine
from ._interpreter import Interpreter, Level1
from ._link import HostLink
from ._meter import RunMeter
from ._mpi import Ranks
from ._options import Options
from ._plan import Planner
from .storage import CompressedStorage, Storage

__all__ = ["Parts", "assemble"]


@dataclass(frozen=True)
class Parts:
    """What runs a checkpointer's schedules (see :func:`assemble`)."""

    planner: Planner
    engine: TransferEngine
    interpreter: Interpreter
    meter: RunMeter
    auto: AutoPlanner | None
    #: "background" or "inline"
    transfers: str
    #: (tw, tr) of one state through Level-2, and through each tier of a tiered one (None
    #: where Level-2 was not measured: a user's backend with a fixed interval, Level-1 alone)
    transfer_costs: tuple[float, float] | None
    tier_costs: list[tuple[float, float]] | None


def assemble(options: Options, memory: MemoryPlan, *, slots: int, in_level1: bool,
             transfers: str, storage: Storage, owns_storage: bool, link: HostLink,
             level1: Level1, ranks: Ranks, checkpoint: Any, dtype: Any, fwd: Any, rev: Any,
             first: list[Any]) -> Parts:
    """Make the parts that run a checkpointer's schedules on ``storage`` (Level-2), ``level1``
    (its slots, made by ``link``) and ``ranks``. ``transfers`` is the option, "auto" decided
    here: inline where a write and a read of one state together cost less than waking a
    thread twice, on every rank alike. A codec runs on the I/O threads, never inline unless
    asked."""
    nbytes = memory.nbytes
    # open_level2 put the codec in front of all Level-2
    compressor = storage if options.codec is not None and not in_level1 else None
    assert compressor is None or isinstance(compressor, CompressedStorage)
    planner = Planner(memory, storage, adaptive=options.adaptive, l1_slots=slots,
                      in_level1=in_level1)
    if in_level1:
        planner.level1_only()
    elif isinstance(options.interval, int):
        planner.with_interval(options.interval)
    transfer_costs: tuple[float, float] | None = None
    tier_costs: list[tuple[float, float]] | None = None
    if not in_level1 and (owns_storage or options.tuned):
        every = None if compressor is None else compressor.compress_every
        if compressor is not None:  # Level-2's own costs: the codec is priced on its own
            compressor.compress_every = 0
        try:
            transfer_costs, tier_costs = measure_level2(storage, nbytes, link)
        finally:
            if compressor is not None and every is not None:
                compressor.compress_every = every
        if (tier_costs is not None or compressor is not None) and transfers == "auto":
            transfers = "background"
    if transfers == "auto":
        cheap = ranks.all(transfer_costs is not None
                          and sum(transfer_costs) < 2 * THREAD_HANDOFF_S)
        transfers = "inline" if cheap or in_level1 else "background"
    engine = TransferEngine(
        storage, nbytes,
        staging_buffers=0 if in_level1 else options.staging_buffers,
        prefetch_buffers=0 if in_level1 else AsyncMultistage.prefetch_slots,
        io_threads=options.io_threads if transfers == "background" else 0,
        verify=options.verify, on_error=options.on_level2_error, link=link)
    interpreter = Interpreter(checkpoint, nbytes, dtype, fwd, rev, engine, level1, ranks)
    meter = RunMeter(engine, level1, interpreter, storage, link)
    auto = None
    if options.tuned and not in_level1:
        assert transfer_costs is not None
        slot = level1.take()
        try:  # a store's cost to the caller: the staging copy of one state
            copy_s = link.measure_copy(first, [slot])
        finally:
            level1.give(slot)
        codec_costs = None
        if compressor is not None and not options.compress_auto:
            # a first run compresses before its states have shown what they are
            codec_costs = measure_codec(compressor.codec, nbytes, dtype)
        auto = AutoPlanner.make(
            planner, fwd=fwd, rev=rev, transfers=transfers, transfer_costs=transfer_costs,
            tier_costs=tier_costs, copy_s=copy_s, staging_buffers=options.staging_buffers,
            codec_costs=codec_costs, slots_fixed=options.l1_slots is not None, level1=level1,
            link=link, ranks=ranks, on_host=link.device is None, compressor=compressor,
            compress_auto=options.compress_auto)
        if memory.n_timesteps == 1:
            planner.with_interval(1)
    return Parts(planner, engine, interpreter, meter, auto, transfers, transfer_costs,
                 tier_costs)
