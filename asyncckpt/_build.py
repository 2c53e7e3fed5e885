"""The one place a checkpointer's parts are made from its options: the link and Level-1, the
memory plan and its split, Level-2, the costs measured on it, the transfer engine, the
interpreter, the meter and, where the model chooses the plan, the auto-planner; and
:class:`~asyncckpt._runs.Runs`, which hands the interpreter one schedule per run."""
from __future__ import annotations

import dataclasses
import time
from contextlib import ExitStack
from dataclasses import dataclass
from typing import Any

from schedules import AsyncMultistage

from ._execution.bounded import ABANDON_S, BoundedCalls
from ._execution.engine import TransferEngine
from ._execution.interpreter import Interpreter
from ._execution.level1 import Level1
from ._execution.link import Link, link_for, measure_copy
from ._execution.meter import RunMeter
from ._execution.ranks import Ranks, agree_on_run
from ._execution.resumable import ResumableEngine
from ._execution.identity import identity_of
from ._execution.resume import NoRunDir, RunDir
from ._execution.run_files import charge_ram
from .errors import UsageError
from .storage import CompressedStorage, Storage, in_host_memory, level2_spec, open_level2
from ._tuning.auto import AutoPlanner
from ._planning.budget import MemoryPlan, check_node_holds
from ._planning.devito_ring import live_ring
from ._tuning.calibrate import THREAD_HANDOFF_S, measure_codec, measure_level2
from ._planning.options import Options
from ._planning.plan import Planner
from .storage.spec import remove_directories
from ._runs import Runs

__all__ = ["Parts", "Runs", "build"]


@dataclass(frozen=True)
class Parts:
    """What a checkpointer is made of (see :func:`build`)."""

    link: Link
    level1: Level1
    memory: MemoryPlan
    #: Level-2, and whether the checkpointer opened it (then it closes it too)
    storage: Storage
    owns_storage: bool
    #: the one way the caller's thread calls Level-2: within the deadline
    calls: BoundedCalls
    #: whether every run stays in Level-1 (no Level-2 transfers)
    in_level1: bool
    engine: TransferEngine
    interpreter: Interpreter
    meter: RunMeter
    runs: "Runs"
    #: "background" or "inline"
    transfers: str
    #: (tw, tr) of one state through Level-2, and through each tier of a tiered one (None
    #: where Level-2 was not measured: a user's backend with a fixed interval, Level-1 alone)
    transfer_costs: tuple[float, float] | None
    tier_costs: list[tuple[float, float]] | None

    def close(self, abandon: bool) -> None:
        """Stop the engine (where ``abandon`` after abandoning the run), close the run
        directory and :meth:`release`, within ``ABANDON_S``: each step by a time of its own,
        so that a stall in one leaves the next its share."""
        until = time.monotonic() + ABANDON_S
        try:
            if abandon:
                self.engine.discard(until - ABANDON_S / 2)
                self.level1.abandon()
        finally:
            try:
                self.engine.close(until - ABANDON_S / 4)
            finally:
                try:
                    self.runs.resume.close(until - ABANDON_S / 8)  # no I/O thread runs
                finally:
                    self.release(until)

    def leave(self) -> None:
        """The process exits under a run still under way on another thread: remove the
        directories Level-2 made, where the checkpointer opened it (its files have no name
        there, and a run directory is left as a killed process leaves it, to resume)."""
        if self.owns_storage:
            remove_directories(self.storage)

    def abandon(self) -> None:
        """Abandon the run under way: delete what it wrote, give back its Level-1 slots."""
        self.engine.discard()
        self.level1.abandon()

    def release(self, until: float | None = None) -> None:
        """Let go of the link, Level-2 where the checkpointer opened it (closed by ``until``, a
        :func:`time.monotonic`, at the latest), and Level-1."""
        release(self.link, self.storage if self.owns_storage else None, self.level1,
                self.calls, until)


def release(link: Link, storage: Storage | None, level1: Level1 | None,
            calls: BoundedCalls | None, until: float | None = None) -> None:
    """Close ``link`` and ``storage`` (through ``calls``, by ``until`` at the latest, where
    ``calls`` are made) and give ``level1``'s slots back (where they were made), each even if
    another fails."""
    with ExitStack() as stack:
        if level1 is not None:
            stack.callback(level1.release)
        if calls is not None:
            stack.callback(calls.close, until)
        if storage is not None and calls is not None:
            stack.callback(calls.call, "close", storage.close, until=until)
        elif storage is not None:
            stack.callback(storage.close)
        stack.callback(link.close)


def build(checkpoint: Any, fwd: Any, rev: Any, nbytes: int, dtype: Any, options: Options,
          ranks: Ranks, storage: Any) -> Parts:
    """Make a checkpointer's parts from its options, ``storage`` being the ``storage=``
    argument; on failure release what was made, tell the other ranks, let go of them and
    raise."""
    link: Link | None = None
    level1: Level1 | None = None
    opened: Storage | None = None  # Level-2, where opened here
    calls: BoundedCalls | None = None
    run: RunDir | NoRunDir = NoRunDir()
    try:
        agree_on_run(ranks, options.n_timesteps, options.interval, nbytes)
        if options.run_dir is not None:
            run, options = _open_run(options, checkpoint, nbytes, dtype, storage, ranks)
            storage = opened = run.storage
        if options.on_level2_error == "recompute" and ranks.size > 1:
            raise UsageError(
                f"on_level2_error='recompute' under MPI ({ranks.size} ranks): a rank rebuilding "
                "a lost state would re-run forward steps alone while its peers wait for it in "
                "their own calls (halo exchanges); use 'raise', which raises on every rank")
        link, first, transfers = link_for(checkpoint, nbytes, dtype, options.transfers,
                                          options.l1_node)
        level1 = Level1(nbytes, link)
        # host memory however given is the default bound's; a run directory's is the run's
        memory = MemoryPlan.make(nbytes, options, on_host=link.device is None, ranks=ranks,
                                 default_storage=run.storage is None and in_host_memory(storage),
                                 resident_level2=storage is not None and in_host_memory(storage))
        slots, in_level1 = memory.split(options.l1_slots, options.interval)
        if in_level1 and isinstance(run, RunDir):
            raise _without_level2(options, run, slots)
        if isinstance(run, RunDir) and run.storage.holds_process_memory:  # on tmpfs
            options = charge_ram(run, options, nbytes, memory.host_room(), slots,
                                 memory.engine_buffers)
            slots = options.l1_slots or slots  # fixed there: the room beside is the run's
        check_node_holds(options.l1_node, memory, slots, in_level1, options.l1_slots is not None)
        bounded = memory.bounds_level2(in_level1)
        spec = level2_spec(storage, bounded, by_default=memory.default_bound is not None)
        raw, owns = open_level2(ranks.storage_spec(spec), link.device, bounded=bounded)
        owns = owns or run.storage is not None  # the run directory's Level-2 is the run's
        level2 = raw
        compressor = None
        if options.codec is not None and not in_level1 and not memory.codec_declined:
            # the codec in front of all Level-2; it closes what it wraps where it was opened here
            level2 = compressor = CompressedStorage(raw, options.codec, close_inner=owns)
        opened = level2 if owns else None
        # until the probe prices Level-2, the deadline is the one given, else the floor
        calls = BoundedCalls(level2, transfer_deadline(options.transfer_timeout, None))
        return _assemble(options, memory, slots=slots, in_level1=in_level1, transfers=transfers,
                         storage=level2, raw=raw, compressor=compressor, owns_storage=owns,
                         calls=calls, link=link, level1=level1, ranks=ranks,
                         checkpoint=checkpoint, dtype=dtype, fwd=fwd, rev=rev, first=first,
                         run=run)
    except BaseException as failure:
        try:
            ranks.fail(failure)  # the other ranks must not wait for this one
        finally:
            try:
                if link is not None:
                    release(link, opened, level1, calls)
                elif opened is not None:
                    opened.close()
            finally:
                try:
                    run.close()  # a directory made here, where nothing was committed, goes
                finally:
                    ranks.free()
        raise


def _open_run(options: Options, checkpoint: Any, nbytes: int, dtype: Any, storage: Any,
              ranks: Ranks) -> tuple[RunDir, Options]:
    """The run directory of ``options`` and the options a run resumed from it follows: the
    plan its states were stored with."""
    spec = options.run_dir
    assert spec is not None and options.n_timesteps is not None
    if storage is not None:
        raise UsageError(f"run_dir={str(spec.path)!r} holds the run's Level-2: give no "
                         f"storage= beside it (got {storage!r})")
    if ranks.size > 1:
        raise UsageError(f"run_dir= is for one process; this run has {ranks.size} ranks")
    run = RunDir(spec.path, identity_of(options.n_timesteps, checkpoint, nbytes, dtype,
                                        spec.outputs, spec.adjoint),
                 spec.outputs, spec.adjoint, spec.keep)
    if run.plan is not None:
        interval, slots = run.plan
        options = dataclasses.replace(options, interval=interval, l1_slots=slots)
    return run, options


def _without_level2(options: Options, run: RunDir, slots: int) -> UsageError:
    """The refusal of a run directory whose plan stores no state on Level-2: it would commit
    nothing (and a run resumed from it, a plan other than its states')."""
    began = ("" if run.plan is None else f"the run in it began with interval {run.plan[0]} "
             f"and {run.plan[1]} Level-1 slots, and ")
    budget = ("" if options.memory_budget is None
              else f" within memory_budget={options.memory_budget}")
    return UsageError(f"run_dir={str(run.path)!r} commits the states a run stores on Level-2; "
                      f"{began}this plan keeps every state in Level-1 ({slots} slots for "
                      f"n={options.n_timesteps}{budget}): give fewer l1_slots, an interval "
                      "or a larger memory_budget, or no run_dir")


def _assemble(options: Options, memory: MemoryPlan, *, slots: int, in_level1: bool,
              transfers: str, storage: Storage, raw: Storage,
              compressor: CompressedStorage | None, owns_storage: bool, calls: BoundedCalls,
              link: Link, level1: Level1, ranks: Ranks, checkpoint: Any, dtype: Any, fwd: Any,
              rev: Any, first: list[Any], run: RunDir | NoRunDir) -> Parts:
    """The parts that run schedules on ``storage`` (Level-2: ``raw``, behind ``compressor``
    where states are compressed), ``level1`` and ``ranks``.
    ``transfers`` is the option, "auto" decided here: inline where a write and a read of one
    state together cost less than waking a thread twice, on every rank alike. A codec runs on
    the I/O threads, never inline unless asked."""
    nbytes = memory.nbytes
    planner = Planner(memory, storage, calls, adaptive=options.adaptive, l1_slots=slots,
                      in_level1=in_level1)
    if in_level1:
        planner.level1_only()
    elif isinstance(options.interval, int):
        planner.with_interval(options.interval)
    transfer_costs: tuple[float, float] | None = None
    tier_costs: list[tuple[float, float]] | None = None
    if not in_level1 and (owns_storage or options.tuned):
        # Level-2's own costs: the codec is priced on its own
        transfer_costs, tier_costs = measure_level2(raw, nbytes, link, calls)
        if (tier_costs is not None or compressor is not None) and transfers == "auto":
            transfers = "background"
    if transfers == "auto":
        # elsewhere than in asyncckpt's own DRAM, an inline transfer wakes a thread too (calls)
        cheap = ranks.all(transfer_costs is not None and calls.inline
                          and sum(transfer_costs) < 2 * THREAD_HANDOFF_S)
        transfers = "inline" if cheap or in_level1 else "background"
    calls.deadline_s = transfer_deadline(options.transfer_timeout, transfer_costs)
    engine = (TransferEngine if isinstance(run, NoRunDir) and not options.keep_forward
              else ResumableEngine)(
        storage, nbytes,
        staging_buffers=0 if in_level1 else options.staging_buffers,
        prefetch_buffers=0 if in_level1 else AsyncMultistage.prefetch_slots,
        io_threads=options.io_threads if transfers == "background" else 0,
        verify=options.verify, on_error=options.on_level2_error, link=link,
        calls=calls)
    if isinstance(engine, ResumableEngine):
        engine.keep_states = options.keep_forward
    ring = live_ring(checkpoint, fwd, rev) if link.device is None else None
    interpreter = Interpreter(checkpoint, nbytes, dtype, fwd, rev, engine, level1, ranks, ring)
    run.attach(engine, interpreter)
    meter = RunMeter(engine, level1, interpreter, storage, link)
    auto = None
    if options.tuned and not in_level1:
        assert transfer_costs is not None
        slot = level1.take()
        try:  # a store's cost to the caller: the staging copy of one state
            copy_s = measure_copy(link, first, [slot])
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
            engine=engine,
            link=link, ranks=ranks, on_host=link.device is None, compressor=compressor,
            compress_auto=options.compress_auto, level2_required=options.run_dir is not None)
        auto.tuner.slack = 0 if ring is None else ring.slack  # loads it prices as kept
        if memory.n_timesteps == 1:
            planner.with_interval(1)
    runs = Runs(planner, auto, engine, interpreter, meter, ranks, run, taping=options.taping,
                taping_reason=options.taping_reason,
                device="host" if link.device is None else link.device.name)
    return Parts(link, level1, memory, storage, owns_storage, calls, in_level1, engine,
                 interpreter, meter, runs, transfers, transfer_costs, tier_costs)


#: A transfer's deadline where none is given: long enough for any healthy device under load
DEADLINE_FLOOR_S = 60.0
#: ... and for a slow one, this many times its probed transfer
DEADLINE_TRANSFERS = 100


def transfer_deadline(given: float | None, costs: tuple[float, float] | None) -> float:
    """Seconds the caller waits for one transfer: ``given``, else :data:`DEADLINE_FLOOR_S` or,
    for a device so slow that it matters, :data:`DEADLINE_TRANSFERS` times its probed write
    and read."""
    if given is not None:
        return given
    return max(DEADLINE_FLOOR_S, DEADLINE_TRANSFERS * sum(costs or (0.0, 0.0)))
