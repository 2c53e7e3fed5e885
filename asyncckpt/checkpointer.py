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
import time
from collections.abc import Callable, Iterator
from contextlib import nullcontext, suppress
from typing import Any

from threadpoolctl import threadpool_limits

from schedules import AsyncMultistage, EndForward, EndReverse, OnlineMultistage, Revolve
from schedules.actions import Action

from ._budget import DEFAULT_STAGING_BUFFERS, MemoryPlan
from ._assembly import assemble
from ._interpreter import Level1, RunDecisions
from ._link import link_for
from ._mpi import Ranks, ranks_of
from ._options import Options, check_operator, check_stop
from ._plan import RunPlan
from ._tuning import IntervalTuner
from .checkpoint import as_dtype, check_descriptor
from .errors import UsageError
from .stats import Stats
from .storage import Storage, level2_spec, open_level2

__all__ = ["AsyncCheckpointer", "RunPlan"]

log = logging.getLogger(__name__)


class AsyncCheckpointer:
    """Reverse a run of ``n_timesteps`` steps in fixed Level-1 memory, streaming every I-th state
    to Level-2 during the forward sweep and prefetching it back during the reverse sweep.

    Parameters
    ----------
    checkpoint : Checkpoint or duck-typed descriptor
        ``size``, ``dtype``, ``get_data(t)``, ``get_data_location(t)``. numpy arrays keep
        Level-1 in host memory; CuPy arrays or torch CUDA tensors keep it on the device, with
        Level-2 in page-locked host memory (docs/gpu.md).
    fwd_operator, rev_operator : objects with ``apply(*, t_start, t_end)``
        The forward step(s) and the adjoint of one step, as in pyrevolve.
    n_timesteps : int or None
        n >= 1; None where the length is not known in advance: :meth:`apply_forward` then
        takes ``stop`` (docs/online.md).
    l1_slots : int
        Level-1 slots for Revolve inside an interval (>= 1); with ``n - 1`` or more (``n``
        taping-free) the run is store-all in Level-1 (``stats.interval`` 0).
    interval : int, "auto" or "adaptive"
        I in [1, n]: every I-th state goes to Level-2. 0: none does, Revolve runs in the Level-1
        slots alone (pyrevolve's algorithm; needs n). "auto" (default): the plan the model
        predicts fastest on costs measured on the run (docs/model.md; ``plan``, ``costs``).
        "adaptive": the next state goes once the last write is done, never within the interval
        "auto" chooses (what "auto" means for unknown n).
    storage : None, str, os.PathLike, Storage or list of those
        Level-2: None (host DRAM), a path (a :class:`~asyncckpt.storage.FileStorage` there), a
        Storage (which the checkpointer leaves open), or a list of those: tiers, fastest first.
    memory_budget : int or str, optional
        The memory it may hold ("8GiB"), Level-1 and the in-memory tier of Level-2 together
        (the rest spills to the temporary directory); on a device, device memory.
    host_memory_budget : int or str, optional
        States on a device: the page-locked host memory Level-2 may hold (default unbounded).
    staging_buffers : int
        Level-2 writes that may be in flight before the forward sweep waits (default 2).
    io_threads : int
        Background I/O threads (default 1).
    transfers : {"auto", "background", "inline"}
        Level-2 transfers on the I/O threads, or on the caller's thread for tiny states.
    verify : bool
        Check every Level-2 read against a checksum taken at write time (default True).
    compression : None, str, dict or Codec
        Level-2 holds states compressed on the I/O threads: None (default), "lz4" or "zstd"
        (lossless), ``{"codec": "zfp", "tolerance": 1e-6}`` (lossy; docs/compression.md).
    on_level2_error : {"raise", "recompute"}
        A failed or corrupted transfer raises :class:`~asyncckpt.TransferError` on the
        caller's thread, or its state is rebuilt exactly in the reverse sweep
        (docs/reliability.md).
    blas_threads : int or None
        Cap BLAS threads while the sweeps run (default None: left alone).
    taping : bool
        True (default): pyrevolve's protocol, each ``rev.apply`` directly after a forward call
        ending at t + 1. False: ``rev.apply`` runs with u_t live, one forward step fewer per
        reverse step, for adjoints that read only the checkpoint (docs/migration.md).
    keep_trace : bool
        Keep each run's actions in :attr:`trace`, for :func:`schedules.simulate`.
    comm : mpi4py communicator, optional
        One plan on every rank, Level-2 per rank, a failure raised on all (docs/mpi.md).

    Notes
    -----
    Level-1 memory is at most ``(l1_slots + staging_buffers + 2) * nbytes`` (each rounded up to
    pages; one more per I/O thread with compression), whatever n. Closed, the buffers go to the
    process's pool for the next checkpointer (:func:`asyncckpt.storage.release_memory`).
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
        compression: Any = None,
        on_level2_error: str = "raise",
        blas_threads: int | None = None,
        taping: bool = True,
        keep_trace: bool = False,
        comm: Any = None,
    ) -> None:
        self._closed = True  # until construction succeeds
        self.nbytes = check_descriptor(checkpoint)
        check_operator(fwd_operator=fwd_operator, rev_operator=rev_operator)
        self.checkpoint, self.dtype = checkpoint, as_dtype(checkpoint.dtype)
        options = self._options = Options.parse(
            n_timesteps, l1_slots=l1_slots, interval=interval, memory_budget=memory_budget,
            host_memory_budget=host_memory_budget, staging_buffers=staging_buffers,
            io_threads=io_threads, transfers=transfers, verify=verify, compression=compression,
            dtype=self.dtype, on_level2_error=on_level2_error, blas_threads=blas_threads,
            taping=taping, keep_trace=keep_trace)
        self.n_timesteps, self.taping, self.keep_trace = (options.n_timesteps, options.taping,
                                                          options.keep_trace)
        #: the actions the last run executed (with ``keep_trace=True``)
        self.trace: list[Action] = []
        #: the ranks the plan is agreed on: one process, or every rank of ``comm``
        self.ranks: Ranks = ranks_of(comm)
        self.fwd_operator, self.rev_operator = fwd_operator, rev_operator
        self._link, first, transfers = link_for(checkpoint, self.nbytes, self.dtype,
                                                options.transfers)
        #: The device Level-1 lives on (where u_0's arrays are), or None for host memory.
        self.device = self._link.device
        self._level1 = Level1(self.nbytes, self._link)
        self._owns_storage = False
        try:
            memory = MemoryPlan.make(self.nbytes, options, on_host=self.device is None,
                                     ranks=self.ranks)
            self.memory_budget = None if memory.budget is None else memory.budget.nbytes
            slots, self.in_level1 = memory.split(options.l1_slots, options.interval)
            bounded = memory.bounds_level2(self.in_level1)
            self.storage, self._owns_storage = open_level2(
                self.ranks.storage_spec(level2_spec(storage, bounded)), self.device,
                bounded=bounded, codec=None if self.in_level1 else options.codec)
            parts = assemble(options, memory, slots=slots, in_level1=self.in_level1,
                             transfers=transfers, storage=self.storage,
                             owns_storage=self._owns_storage, link=self._link,
                             level1=self._level1, ranks=self.ranks, checkpoint=checkpoint,
                             dtype=self.dtype, fwd=fwd_operator, rev=rev_operator, first=first)
        except BaseException as failure:
            try:
                self.ranks.fail(failure)  # the other ranks must not wait for this one
            finally:
                self._release()
            raise
        self._planner, self._engine, self._interpreter = (parts.planner, parts.engine,
                                                          parts.interpreter)
        self._meter, self._auto, self.transfers = parts.meter, parts.auto, parts.transfers
        self.transfer_costs, self.tier_costs = parts.transfer_costs, parts.tier_costs
        self._closed = False
        self._actions: Iterator[Action] | None = None
        self._phase = "idle"  # idle -> forward-done -> idle
        self._stats = Stats()
        if log.isEnabledFor(logging.INFO):  # the plan's view is built for the message alone
            log.info("AsyncCheckpointer(n=%s): %s", self.n_timesteps, self.plan)

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

    def apply_forward(self, stop: Callable[[int], object] | None = None) -> None:
        """Run the forward sweep from u_0 to u_n, streaming interval starts to Level-2; a second
        call starts a new run (the next iteration of an optimisation loop).

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
        self._meter.start(self.n_timesteps)
        if self._auto is not None:
            self._auto.before_run(stats, self._interpreter)
        if planner.planned and (planner.adaptive or self.n_timesteps is None):
            auto = self._auto
            tf = None if auto is None else auto.tuner.tf
            # an adaptive run of known n follows its own costs below the planned interval too
            rechoose = (auto.least_interval if auto is not None and planner.adaptive
                        and self.n_timesteps is not None else None)
            planner.online(RunDecisions(
                self._engine, planner.interval, adaptive=planner.adaptive, stop=stop,
                stats=stats, model_tf=tf or 0.0, group=self.ranks, rechoose=rechoose,
                floor=None if rechoose is None else planner.least_interval_floor()))
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

    def _run(self, until: type[EndForward] | type[EndReverse]) -> None:
        assert self._actions is not None
        blas = self._options.blas_threads
        with nullcontext() if blas is None else threadpool_limits(limits=blas, user_api="blas"):
            try:
                self._interpreter.run(self._actions, until, self._stats, self._meter.fit,
                                      self.trace if self.keep_trace else None)
                if until is EndReverse:
                    self._engine.drain()
                self.ranks.exchange()  # the end of a sweep: every rank got here, or all raise
            except BaseException as failure:
                self.ranks.fail(failure)
                raise

    def _check_open(self) -> None:
        if self._closed:
            raise UsageError("the AsyncCheckpointer is closed")

    def _abandon_run(self) -> None:
        self._engine.discard()
        self._level1.abandon()
        self._actions = None
        self._phase = "idle"

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
            self._release()

    def _release(self) -> None:
        """Let go of Level-1, the link, Level-2 where the checkpointer opened it, and the ranks."""
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
            with suppress(Exception):  # nothing to report to at interpreter teardown
                self.close()

    def __repr__(self) -> str:
        interval = self.interval if self._auto is None else repr(self._options.interval)
        return (f"AsyncCheckpointer(n_timesteps={self.n_timesteps}, l1_slots={self.l1_slots}, "
                f"interval={interval}, storage={self.storage!r})")
