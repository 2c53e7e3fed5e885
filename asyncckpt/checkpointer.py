"""AsyncCheckpointer: runs the asynchronous multistage schedule on the user's operators.

The facade and the run's state machine (idle -> forward-done -> idle). What it is made of, each
in a module of its own: options (``_options``), the memory plan (``_budget``), Level-2
(``storage``), the plan of each run (``_plan``) and its choice by the model (``_auto``), the
interpreter of a schedule's actions (``_interpreter``), the transfer engine (``_engine``), the
run's measurements (``_meter``) and the ranks of an MPI job (``_mpi``).
"""
from __future__ import annotations

import logging
import os
import tempfile
import time
from collections.abc import Callable, Iterator
from typing import Any

from threadpoolctl import threadpool_limits

from schedules import AsyncMultistage, EndForward, EndReverse, OnlineMultistage, Revolve
from schedules.actions import Action

from ._budget import DEFAULT_STAGING_BUFFERS, MemoryPlan
from ._assembly import assemble
from ._interpreter import Level1, RunDecisions
from ._link import DeviceLink, HostLink
from ._mpi import Ranks, ranks_of
from ._options import Options, check_operator, check_stop
from ._plan import RunPlan
from ._tuning import IntervalTuner
from .checkpoint import as_dtype, check_arrays, check_descriptor
from .devices import device_of
from .errors import InvalidValueError, UsageError
from .stats import Stats
from .storage import Storage, open_level2

__all__ = ["AsyncCheckpointer", "RunPlan"]

log = logging.getLogger(__name__)


class AsyncCheckpointer:
    """Reverse a run of ``n_timesteps`` steps in fixed Level-1 memory, streaming every I-th state
    to Level-2 during the forward sweep and prefetching it back during the reverse sweep.

    Parameters
    ----------
    checkpoint : Checkpoint or duck-typed descriptor
        ``size``, ``dtype``, ``get_data(t)``, ``get_data_location(t)``. The arrays may be numpy
        arrays (Level-1 in host memory) or arrays on a device: CuPy arrays, torch CUDA tensors
        (through DLPack) or the stand-in's (:mod:`asyncckpt.devices`). On a device, Level-1
        slots, staging and prefetch buffers live in device memory, Level-2 is page-locked host
        memory by default, and every copy is queued on a stream, ordered by events after the
        step that made the state (docs/gpu.md).
    fwd_operator, rev_operator : objects with ``apply(*, t_start, t_end)``
        The forward step(s) and the adjoint of one step, as in pyrevolve.
    n_timesteps : int or None
        n >= 1; None for a run whose length is not known in advance: each
        :meth:`apply_forward` then takes ``stop``, the forward sweep advances one step per call
        and ends where ``stop`` says, and repeated runs may end at different n.
    l1_slots : int
        Level-1 slots for Revolve inside an interval (>= 1). With ``n - 1`` or more (``n``
        taping-free) every state fits in Level-1: the run is store-all there, with no Level-2
        traffic (``stats.interval`` is then 0). Slots are allocated by the first run that
        uses them: before its first step, as many as its schedule will hold at once, the fresh
        ones faulted in on several threads.
    interval : int, "auto" or "adaptive"
        I in [1, n]: every I-th state goes to Level-2. "adaptive": the next state goes to
        Level-2 as soon as the previous Level-2 write has completed, but never within the
        interval "auto" would choose (1 on a first run with unknown n), so the intervals follow
        the device and the compute as they are at that moment; each interval, whatever its
        length, is reversed optimally in the Level-1 slots. With ``n_timesteps=None``, "auto"
        means "adaptive". "auto" (default): the schedule the
        performance model predicts fastest: the interval, or Revolve in Level-1 alone where that
        is faster. Its costs come from Level-2 transfers probed at construction and a probe of
        the first run's opening forward calls (one step twice, then a few steps in one call, from
        u_0, which is then restored); every completed run replaces them with what it measured,
        and the next checkpointer of the same operators and state size in this process starts
        from those. ``stats.calibration`` records them and the prediction.
    storage : None, str, os.PathLike or Storage
        Level-2: None for host DRAM, a path for a :class:`~asyncckpt.storage.FileStorage` in a
        private directory under it (a ramdisk or an SSD), or any Storage instance (not closed by
        the checkpointer).
    memory_budget : int or str, optional
        The memory the checkpointer may hold ("8GiB"); ``l1_slots`` may then be left out and is
        chosen with the interval. On the host it counts Level-1 and the DRAM tier of Level-2
        together (the rest spills to a file under the temporary directory); on a device it
        counts device memory: Level-1 slots and the staging and prefetch buffers.
    host_memory_budget : int or str, optional
        States on a device only: the page-locked host memory Level-2 may hold, its staging and
        prefetch buffers included; the rest spills to a file tier. Default: unbounded.
    staging_buffers : int
        Level-2 writes that may be in flight before the forward sweep waits (default 2).
    io_threads : int
        Background I/O threads (default 1; on two cores more cannot help).
    transfers : {"auto", "background", "inline"}
        Where Level-2 transfers run. "background": on the I/O threads, overlapping the compute.
        "inline": on the caller's thread, for states so small that a transfer costs less than
        waking a thread. "auto" (default): measure a write and a read of one state on a backend
        the checkpointer made itself and go inline when both together take under 40 us;
        background for a user's ``Storage``.
    verify : bool
        Check every Level-2 read against a checksum taken when it was written (default True).
    on_level2_error : {"raise", "recompute"}
        A failed Level-2 write, a failed read or a read that fails its checksum: "raise"
        (default) raises :class:`~asyncckpt.TransferError` on the caller's thread at the next
        synchronisation point, naming the step and the cause. "recompute" survives it: the lost
        state is rebuilt in the reverse sweep by advancing from the nearest earlier checkpoint
        that can still be read, so the adjoint stays exact; the run is slower, and
        ``stats.l2_failures`` and ``stats.recovery_steps`` count the cost. Raising is the
        default because a failing device should be seen, not silently paid for.
    blas_threads : int or None
        Cap BLAS threads while the sweeps run, to keep a core free for the I/O thread where
        Level-2 transfers are heavy beside a BLAS-bound step. Default None: BLAS is left alone;
        on the LSTM experiment (2 cores, states of 32 and 150 KiB) a cap of 1 made a
        forward+backward pass 13-16% slower.
    taping : bool
        True (default): pyrevolve's protocol, ``rev.apply(t_start=t, t_end=t+1)`` directly after a
        forward call ending at t + 1 (its taping step). False: ``rev.apply`` runs while the live
        state holds u_t (restored through ``get_data_location(t)`` or reached by advancing), with
        no taping step: for adjoints that read only what the checkpoint holds (Devito's, see
        docs/migration.md); it saves one forward step and call per reverse step.
    keep_trace : bool
        Keep the actions each run executed in :attr:`trace`, for
        :func:`schedules.simulate` to validate (default False).
    comm : mpi4py communicator, optional
        Run one collective plan on every rank of ``comm`` (each rank checkpointing its own
        part): the memory budget is the least of the ranks', the model's costs the largest,
        adaptive decisions and ``stop`` agreed (the run ends where any rank's ``stop`` says so),
        so every rank makes the same operator calls. A path given as ``storage`` becomes a
        private directory per rank under it (``rank00003``). A failure on one rank raises on
        every rank at the next exchange (each Level-2 store and load, the end of each sweep):
        :class:`~asyncckpt.RankFailedError` on the others. See docs/mpi.md.

    Notes
    -----
    Level-1 memory is at most ``(l1_slots + staging_buffers + 2) * nbytes`` (each rounded up to
    pages); it never grows with n. Staging and prefetch buffers are allocated and touched at
    construction, slots when first used; closed, they are kept for the next checkpointer of the
    process (see :func:`asyncckpt.storage.release_memory`).
    """

    def __init__(
        self,
        checkpoint: Any,
        fwd_operator: Any,
        rev_operator: Any,
        n_timesteps: int | None,
        *,
        l1_slots: int | None = None,
        interval: int | str = "auto",
        storage: Storage | str | os.PathLike[str] | list[Any] | None = None,
        memory_budget: int | str | None = None,
        host_memory_budget: int | str | None = None,
        staging_buffers: int = DEFAULT_STAGING_BUFFERS,
        io_threads: int = 1,
        transfers: str = "auto",
        verify: bool = True,
        on_level2_error: str = "raise",
        blas_threads: int | None = None,
        taping: bool = True,
        keep_trace: bool = False,
        comm: Any = None,
    ) -> None:
        self._closed = True  # until construction succeeds
        self.nbytes = check_descriptor(checkpoint)
        check_operator("fwd_operator", fwd_operator)
        check_operator("rev_operator", rev_operator)
        options = self._options = Options.parse(
            n_timesteps, l1_slots=l1_slots, interval=interval, memory_budget=memory_budget,
            host_memory_budget=host_memory_budget, staging_buffers=staging_buffers,
            io_threads=io_threads, transfers=transfers, verify=verify,
            on_level2_error=on_level2_error, blas_threads=blas_threads, taping=taping,
            keep_trace=keep_trace)
        self.n_timesteps, self.taping = options.n_timesteps, options.taping
        self.keep_trace = options.keep_trace
        #: the actions the last run executed (with ``keep_trace=True``)
        self.trace: list[Action] = []
        #: the ranks the plan is agreed on: one process, or every rank of ``comm``
        self.ranks: Ranks = ranks_of(comm)
        self.checkpoint, self.dtype = checkpoint, as_dtype(checkpoint.dtype)
        self.fwd_operator, self.rev_operator = fwd_operator, rev_operator
        first = checkpoint.get_data(0)
        #: The device Level-1 lives on (where u_0's arrays are), or None for host memory.
        self.device = device_of(first) if isinstance(first, (list, tuple)) else None
        transfers = options.transfers
        if self.device is not None:
            first = self.device.adapt(first)
            if transfers == "inline":
                raise InvalidValueError(
                    f"transfers='inline' would make the caller wait for every device copy; "
                    f"states on {self.device.name} use 'background' (or 'auto')")
            transfers = "background"
        first = check_arrays(first, self.nbytes, self.dtype, "checkpoint.get_data(0)",
                             device=self.device)
        memory = MemoryPlan.make(self.nbytes, self.n_timesteps, self.taping,
                                 options.staging_buffers, options.memory_budget,
                                 options.host_memory_budget, on_host=self.device is None,
                                 ranks=self.ranks)
        self.memory_budget = None if memory.budget is None else memory.budget.nbytes
        slots, self.in_level1 = memory.split(options.l1_slots, options.interval)
        bounded = memory.bounds_level2(self.in_level1)
        if bounded and storage is None:
            storage = ["dram", tempfile.gettempdir()]  # DRAM up to the budget, then spill
        try:
            self.storage, self._owns_storage = open_level2(
                self.ranks.storage_spec(storage), self.device, bounded=bounded)
        except BaseException as failure:
            self.ranks.fail(failure)  # the others must not wait for this rank
            raise
        self._link = HostLink() if self.device is None else DeviceLink(self.device)
        self._level1 = Level1(self.nbytes, self._link)
        try:
            parts = assemble(options, memory, slots=slots, in_level1=self.in_level1,
                             transfers=transfers, storage=self.storage,
                             owns_storage=self._owns_storage, link=self._link,
                             level1=self._level1, ranks=self.ranks, checkpoint=checkpoint,
                             dtype=self.dtype, fwd=fwd_operator, rev=rev_operator, first=first)
        except BaseException as failure:
            self._level1.release()
            self._link.close()
            if self._owns_storage:
                self.storage.close()
            try:
                self.ranks.fail(failure)
            finally:
                self.ranks.free()
            raise
        self._planner, self._engine, self._interpreter = (parts.planner, parts.engine,
                                                          parts.interpreter)
        self._meter, self._auto, self.transfers = parts.meter, parts.auto, parts.transfers
        self.transfer_costs, self.tier_costs = parts.transfer_costs, parts.tier_costs
        self._closed = False
        self._actions: Iterator[Action] | None = None
        self._phase = "idle"  # idle -> forward-done -> idle
        self._stats = Stats()
        log.info("AsyncCheckpointer: n=%s I=%s l1_slots=%d, state %d bytes, Level-1 %.1f MiB, "
                 "Level-2 %r, transfers %s, taping %s", self.n_timesteps,
                 "Level-1 only" if self.in_level1 else options.interval, self.l1_slots,
                 self.nbytes, self.l1_bytes / 2**20, self.storage, self.transfers, self.taping)

    # -- what is planned -----------------------------------------------------------------------

    @property
    def plan(self) -> RunPlan:
        """What the next (or current) run does: slots, interval, Level-2 tiers, prediction."""
        return self._planner.view(self.transfers)

    @property
    def l1_slots(self) -> int:
        """Level-1 slots of the next (or current) run."""
        return self._planner.l1_slots

    @property
    def l1_bytes(self) -> int:
        """Level-1 bytes of the next (or current) run: slots, staging and prefetch buffers."""
        return self._planner.l1_bytes

    @property
    def interval(self) -> int:
        """The interval of the next (or current) run (0: Level-1 alone)."""
        return self._planner.interval

    @property
    def schedule(self) -> AsyncMultistage | OnlineMultistage | Revolve | None:
        """The schedule of the current (or last) run."""
        return self._planner.schedule

    @property
    def costs(self) -> IntervalTuner | None:
        """The costs "auto" and "adaptive" price plans with, as measured so far (None for a fixed
        interval). Its fields may be set, to ask the model what it would choose with others."""
        return None if self._auto is None else self._auto.tuner

    @property
    def stats(self) -> Stats:
        """Counts and timings of the current (or last) run."""
        return self._stats

    # -- the run -------------------------------------------------------------------------------

    def apply_forward(self, stop: Callable[[int], object] | None = None) -> None:
        """Run the forward sweep from u_0 to u_n, streaming interval starts to Level-2.

        A second call starts a new run (the next iteration of an optimisation loop).

        Parameters
        ----------
        stop : callable, optional
            Only with ``n_timesteps=None``, and then required: called with the index t of each
            state the forward sweep reaches (t >= 1), it returns True to end the sweep there
            (n = t). An exception it raises ends the run and reaches the caller.
        """
        self._check_open()
        check_stop(self.n_timesteps, stop)
        if self._phase != "idle":
            self._abandon_run()
        self.ranks.settled = False  # a failure agreed on in an earlier run is over
        planner = self._planner
        stats = self._stats = Stats(
            n_timesteps=self.n_timesteps or 0, l1_slots=planner.l1_slots,
            l1_bytes=planner.l1_bytes, taping=self.taping,
            device="host" if self.device is None else self.device.name)
        self._meter.start()
        if self._auto is not None:
            try:
                self._auto.before_run(stats, self._interpreter)
            except BaseException as failure:
                self.ranks.fail(failure)
                raise
        if planner.planned and (planner.adaptive or self.n_timesteps is None):
            planner.online(RunDecisions(self._engine, planner.interval,
                                        adaptive=planner.adaptive, stop=stop,
                                        step_seconds=self._step_seconds, group=self.ranks))
        assert planner.schedule is not None
        stats.interval = planner.interval
        self.trace = []
        self._actions = iter(planner.schedule)
        self._phase = "forward"
        start = time.perf_counter()
        try:
            planner.reserve_slots(self._level1)
            self._run(EndForward)
        finally:
            stats.forward_s = time.perf_counter() - start
            self._meter.collect(stats)
        planner.record_forward(stats)
        self._phase = "forward-done"

    def apply_reverse(self) -> None:
        """Run the reverse sweep: the adjoint of steps n-1 down to 0 (each after its taping step,
        or, taping-free, with the live state u_t)."""
        self._check_open()
        if self._phase != "forward-done":
            raise UsageError("apply_reverse() needs a completed apply_forward() first "
                             f"(the checkpointer is {self._phase!r})")
        self._phase = "reverse"
        start = time.perf_counter()
        try:
            self._run(EndReverse)
        finally:
            self._stats.reverse_s = time.perf_counter() - start
            self._meter.collect(self._stats)
        self._actions = None
        self._phase = "idle"
        if self._auto is not None:
            self._auto.after_run(self._stats, self._meter.fit)

    def _step_seconds(self) -> float:
        """A forward step's seconds: measured in this run, else the model's."""
        stats = self._stats
        if stats.forward_steps:
            return stats.forward_compute_s / stats.forward_steps
        tf = None if self._auto is None else self._auto.tuner.tf
        return tf if tf is not None else 0.0

    def _run(self, until: type[EndForward] | type[EndReverse]) -> None:
        assert self._actions is not None
        blas = self._options.blas_threads
        limits = (threadpool_limits(limits=blas, user_api="blas") if blas is not None else None)
        try:
            self._interpreter.run(self._actions, until, self._stats, self._meter.fit,
                                  self.trace if self.keep_trace else None)
            if until is EndReverse:
                self._engine.drain()
            self.ranks.exchange()  # the end of a sweep: every rank got here, or all raise
        except BaseException as failure:
            self.ranks.fail(failure)
            raise
        finally:
            if limits is not None:
                limits.restore_original_limits()

    def _check_open(self) -> None:
        if self._closed:
            raise UsageError("the AsyncCheckpointer is closed")

    def _abandon_run(self) -> None:
        self._engine.discard()
        self._level1.abandon()
        self._actions = None
        self._phase = "idle"

    # -- lifetime ------------------------------------------------------------------------------

    def close(self) -> None:
        """Stop the I/O threads and release Level-2 (delete its files); safe to call twice."""
        if self._closed:
            return
        self._closed = True
        try:
            if self._phase != "idle":
                self._abandon_run()
        finally:
            self._engine.close()
            self._link.close()
            if self._owns_storage:
                self.storage.close()
            self._level1.release()
            self.ranks.free()

    def __enter__(self) -> "AsyncCheckpointer":
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()

    def __del__(self) -> None:
        if not getattr(self, "_closed", True):
            try:
                self.close()
            except Exception:  # noqa: BLE001 - nothing to report to at interpreter teardown
                pass

    def __repr__(self) -> str:
        interval = self.interval if self._auto is None else repr(self._options.interval)
        return (f"AsyncCheckpointer(n_timesteps={self.n_timesteps}, l1_slots={self.l1_slots}, "
                f"interval={interval}, storage={self.storage!r})")
