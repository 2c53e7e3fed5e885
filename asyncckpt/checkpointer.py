"""AsyncCheckpointer: runs the asynchronous multistage schedule on the user's operators.

The facade and the run's state machine (idle -> forward-done -> idle). Its parts are made in one
place, :func:`asyncckpt._build.build`: what a run will do is decided in
:mod:`asyncckpt._planning`, its costs learned in :mod:`asyncckpt._tuning`, and it is done in
:mod:`asyncckpt._execution` (docs/architecture.md).
"""
from __future__ import annotations

import logging
import os
from collections.abc import Callable, Iterator
from typing import Any

from schedules import AsyncMultistage, EndForward, EndReverse, OnlineMultistage, Revolve
from schedules.actions import Action

from ._execution.guard import CallGuard
from ._execution.ranks import Ranks, ranks_of
from ._execution.resumable import unwind_reverse
from ._planning.budget import DEFAULT_STAGING_BUFFERS
from ._build import build
from ._lifetime import Closing
from ._planning.environment import Environment
from ._planning.options import Options, check_operator, check_stop
from ._planning.plan import RunPlan
from ._planning.taping import decide_taping
from .checkpoint import as_dtype, check_descriptor
from .costs import MeasuredCosts
from .errors import UsageError
from .stats import Stats
from .storage import Storage

__all__ = ["AsyncCheckpointer", "RunPlan"]

log = logging.getLogger(__name__)


class AsyncCheckpointer(Closing):
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
        Level-2: None or "dram" (host DRAM), "numa:N" (host memory of NUMA node N), a path (a
        :class:`~asyncckpt.storage.FileStorage` there), a Storage (left open), or a list of
        those: tiers, fastest first. Host memory named without a budget holds at most
        ``$ASYNCCKPT_MEMORY_BUDGET``, else a quarter of the memory available (slots and buffers
        beyond it a MemoryBudgetError, Level-2 in the rest); states beyond spill to the next
        tier, or to the temporary directory.
    memory_budget : int or str, optional
        The memory it may hold ("8GiB"), Level-1 and the in-memory tier of Level-2 together
        (the rest spills to the temporary directory); on a device, device memory.
    host_memory_budget : int or str, optional
        States on a device: the page-locked host memory Level-2 may hold (default: with
        ``storage=None`` the bound above, else unbounded).
    staging_buffers, io_threads : int
        Level-2 writes that may be in flight before the forward sweep waits (default 2), and
        background I/O threads (default 1).
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
    taping : bool or None
        True: pyrevolve's protocol; False: taping-free (u_t live); None (default): decided from
        the reverse operator, never guessed (``stats.taping_reason``; docs/migration.md).
    keep_trace : bool
        Keep each run's actions in :attr:`trace`, for :func:`schedules.simulate`.
    comm : mpi4py communicator, optional
        One plan on every rank, Level-2 per rank, a failure raised on all (docs/mpi.md).
    transfer_timeout : float, optional
        Seconds past which a Level-2 transfer the caller waits for means a stalled device: a
        :class:`~asyncckpt.TransferError` (default 60, more for a slow one; docs/reliability.md).
    l1_node : int, optional
        The NUMA node Level-1's slots, staging and prefetch buffers are bound to (docs/numa.md).
    run_dir, outputs, adjoint, keep_run_dir : optional
        Level-2 durable in the directory ``run_dir``, committed with the descriptors ``outputs``
        (the forward's products) and ``adjoint`` (the reverse's state); a checkpointer made
        later on it resumes the run (:attr:`resumed`); a finished run's is removed unless
        ``keep_run_dir`` (docs/resume.md).
    keep_forward : bool
        Keep the forward sweep's Level-2 states: apply_reverse() may run again (another seed).

    Notes
    -----
    Level-1 memory is at most ``(l1_slots + staging_buffers + 2) * nbytes`` (pages; one more per
    I/O thread with compression), whatever n; closed, the process's pool keeps it for the next.
    """

    def __init__(
        self, checkpoint: Any, fwd_operator: Any, rev_operator: Any, n_timesteps: int | None, *,
        l1_slots: int | None = None, interval: int | str = "auto",
        storage: Storage | str | os.PathLike[str] | list[Any] | None = None,
        memory_budget: int | str | None = None, host_memory_budget: int | str | None = None,
        staging_buffers: int = DEFAULT_STAGING_BUFFERS, io_threads: int = 1,
        transfers: str = "auto", verify: bool = True, compression: Any = None,
        on_level2_error: str = "raise", blas_threads: int | None = None,
        taping: bool | None = None, keep_trace: bool = False, comm: Any = None,
        transfer_timeout: float | None = None, l1_node: int | None = None,
        run_dir: str | os.PathLike[str] | None = None, outputs: Any = None,
        adjoint: Any = None, keep_run_dir: bool = False, keep_forward: bool = False,
    ) -> None:
        self._calls = CallGuard()
        self.nbytes = check_descriptor(checkpoint)
        check_operator(fwd_operator=fwd_operator, rev_operator=rev_operator)
        self.checkpoint, self.dtype = checkpoint, as_dtype(checkpoint.dtype)
        environment = Environment.read()  # once: the runs use what it was built with
        options = self._options = Options.parse(
            n_timesteps, l1_slots=l1_slots, interval=interval, memory_budget=memory_budget,
            host_memory_budget=host_memory_budget, staging_buffers=staging_buffers,
            io_threads=io_threads, transfers=transfers, verify=verify, compression=compression,
            dtype=self.dtype, on_level2_error=on_level2_error, blas_threads=blas_threads,
            taping=decide_taping(taping, checkpoint, fwd_operator, rev_operator, environment),
            keep_trace=keep_trace, transfer_timeout=transfer_timeout, l1_node=l1_node,
            run_dir=run_dir, outputs=outputs, adjoint=adjoint, keep_run_dir=keep_run_dir,
            keep_forward=keep_forward, environment=environment)
        self.n_timesteps, self.keep_trace = options.n_timesteps, options.keep_trace
        #: the actions the last run executed (with ``keep_trace=True``)
        self.trace: list[Action] = []
        #: the ranks the plan is agreed on: one process, or every rank of ``comm``
        self.ranks: Ranks = ranks_of(comm)
        self.fwd_operator, self.rev_operator, self.taping = fwd_operator, rev_operator, \
            options.taping
        parts = self._parts = build(checkpoint, fwd_operator, rev_operator, self.nbytes,
                                    self.dtype, options, self.ranks, storage)
        #: The device Level-1 lives on (where u_0's arrays are, None for host memory); Level-2
        self.device, self.storage = parts.link.device, parts.storage
        self.memory_budget = None if parts.memory.budget is None else parts.memory.budget.nbytes
        self.in_level1, self.transfers = parts.in_level1, parts.transfers
        self.transfer_costs, self.tier_costs = parts.transfer_costs, parts.tier_costs
        self._opened()
        self._actions: Iterator[Action] | None = None
        self._phase, self._stats = "idle", Stats()  # idle -> forward-done -> idle
        if log.isEnabledFor(logging.INFO):  # the plan's view is built for the message alone
            log.info("AsyncCheckpointer(n=%s): %s", self.n_timesteps, self.plan)

    @property
    def plan(self) -> RunPlan:
        """What the next (or current) run does: slots, interval, Level-2 tiers, prediction."""
        return self._parts.runs.planner.view(self.transfers)

    @property
    def l1_slots(self) -> int:
        """Level-1 slots of the next (or current) run."""
        return self._parts.runs.planner.l1_slots

    @property
    def l1_bytes(self) -> int:
        """Level-1 bytes of the next (or current) run: slots, staging and prefetch buffers."""
        return self._parts.runs.planner.l1_bytes

    @property
    def interval(self) -> int:
        """The interval of the next (or current) run (0: Level-1 alone)."""
        return self._parts.runs.planner.interval

    @property
    def schedule(self) -> AsyncMultistage | OnlineMultistage | Revolve | None:
        """The schedule of the current (or last) run."""
        return self._parts.runs.planner.schedule

    @property
    def costs(self) -> MeasuredCosts | None:
        """The costs "auto" and "adaptive" price plans with, as measured so far (None for a fixed
        interval); set changed ones (``ckp.costs = ckp.costs.replace(tw=...)``) to plan with."""
        return self._parts.runs.costs()

    @costs.setter
    def costs(self, costs: MeasuredCosts) -> None:
        self._parts.runs.assume(costs)

    @property
    def resumed(self) -> dict[str, Any] | None:
        """None for a fresh run, else where the run in ``run_dir`` resumes: its "sweep" and
        "step" (docs/resume.md)."""
        return self._parts.runs.resume.resumed

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
        with self._calls.running("apply_forward()"):
            check_stop(self.n_timesteps, stop)
            if self._phase != "idle":  # the run under way (or kept) is abandoned
                self._parts.abandon()
                self._actions, self._phase = None, "idle"
            parts = self._parts
            stats, schedule = parts.runs.begin(stop)
            self._stats, self.trace = stats, []
            self._actions, self._phase = iter(schedule), "forward"
            self._run(EndForward)
            parts.runs.planner.record_forward(stats)
            self._phase = "forward-done"

    def apply_reverse(self) -> None:
        """Run the reverse sweep: the adjoint of steps n-1 down to 0 (each after its taping step,
        or, taping-free, with the live state u_t); with ``keep_forward=True``, again and again."""
        with self._calls.running("apply_reverse()"):
            if self._phase == "reverse" and self._options.keep_forward:  # one that raised
                unwind_reverse(self._parts.engine, self._parts.level1)
                self._actions, self._phase = None, "forward-done"
            if self._phase != "forward-done":
                raise UsageError("apply_reverse() needs a completed apply_forward() first "
                                 f"(the checkpointer is {self._phase!r})")
            if self._actions is None:  # a further reverse sweep over the kept forward sweep
                self._stats, self._actions = self._parts.runs.reverse_again()
            self._phase = "reverse"
            self._run(EndReverse)
            self._actions, self._phase = None, "forward-done" if self._options.keep_forward \
                else "idle"
            self._parts.runs.learn(self._stats)

    def _run(self, until: type[EndForward] | type[EndReverse]) -> None:
        """One sweep, timed into the run's stats."""
        assert self._actions is not None
        self._parts.runs.sweep(self._actions, until, self._stats,
                               self.trace if self.keep_trace else None, self._options.blas_threads)

    def close(self) -> None:
        """Stop the I/O threads and release Level-2 (delete its files); safe to call twice.
        Returns within 2 s whatever Level-2 does: a transfer or call still running then (an
        interrupted run's, a stalled device's) is left to its daemon thread, and logged."""
        if self._closed:
            return
        self._calls.check("close()")
        self._closed = self._calls.closed = True
        try:
            self._parts.close(abandon=self._phase != "idle")
        finally:
            self.ranks.free()

    def drain(self) -> None:
        """Wait for every Level-2 transfer still under way (the forward sweep returns with its
        last writes in flight) and raise the first failure."""
        with self._calls.running("drain()"):
            self._parts.engine.drain()

    def _leave(self) -> None:
        self._parts.leave()

    def __repr__(self) -> str:
        interval = self.interval if self._parts.runs.auto is None else repr(self._options.interval)
        return (f"AsyncCheckpointer(n_timesteps={self.n_timesteps}, l1_slots={self.l1_slots}, "
                f"interval={interval}, storage={self.storage!r})")

