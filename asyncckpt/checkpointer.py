"""AsyncCheckpointer: runs the asynchronous multistage schedule on the user's operators."""
from __future__ import annotations

import logging
import os
import tempfile
import time
from collections.abc import Callable, Iterator
from typing import Any

import numpy as np
from threadpoolctl import threadpool_limits

from schedules import AsyncMultistage, EndForward, EndReverse, OnlineMultistage, Revolve
from schedules.actions import Action
from schedules.model import adaptive_interval, predict_adaptive

from ._budget import Budget, dram_tier, slot_candidates
from ._buffers import padded
from ._calibrate import THREAD_HANDOFF_S, measure_fault, measure_transfer, probe_forward
from ._engine import TransferEngine
from ._interpreter import Interpreter, Level1, RunDecisions
from ._link import DeviceLink, HostLink
from ._mpi import RankGroup, per_rank
from ._options import (check_bool, check_choice, check_int, check_operator, parse_bytes,
                       parse_interval)
from ._pool import POOL
from ._tuning import (CallFit, IntervalTuner, Plan, agree_costs, cheapest_near_fastest,
                      fastest_once_warm, remember, remembered)
from .checkpoint import as_dtype, check_arrays, check_descriptor
from .devices import device_of
from .errors import InvalidTypeError, InvalidValueError, MemoryBudgetError, UsageError
from .stats import Stats
from .storage import HostMemoryStorage, Storage, TieredStorage, open_storage

__all__ = ["AsyncCheckpointer"]

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
        staging_buffers: int = 2,
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
        self.n_timesteps = (None if n_timesteps is None
                            else check_int("n_timesteps", n_timesteps, 1))
        if l1_slots is None and memory_budget is None:
            raise InvalidValueError("give l1_slots (Level-1 slots), memory_budget (bytes), "
                                    "or both; got neither")
        fixed_slots = None if l1_slots is None else check_int("l1_slots", l1_slots, 1)
        self.memory_budget = (None if memory_budget is None
                              else parse_bytes("memory_budget", memory_budget))
        interval = parse_interval(interval, self.n_timesteps, adaptive=True)
        if self.n_timesteps is None and interval == "auto":
            interval = "adaptive"  # the model needs n; the adaptive rule does not
        self._adaptive = interval == "adaptive"
        self.keep_trace = check_bool("keep_trace", keep_trace)
        #: the actions the last run executed (with ``keep_trace=True``)
        self.trace: list[Action] = []
        staging_buffers = check_int("staging_buffers", staging_buffers, 1)
        io_threads = check_int("io_threads", io_threads, 1)
        check_choice("transfers", transfers, ("auto", "background", "inline"))
        check_choice("on_level2_error", on_level2_error, ("raise", "recompute"))
        if blas_threads is not None:
            blas_threads = check_int("blas_threads", blas_threads, 1)
        self.taping = check_bool("taping", taping)
        self._group = None if comm is None else RankGroup(comm)
        if self._group is not None:
            storage = per_rank(storage, self._group.rank)
            if self.memory_budget is not None:  # one plan: the tightest rank's budget
                self.memory_budget = self._group.min(self.memory_budget)
        self.checkpoint = checkpoint
        self.dtype = as_dtype(checkpoint.dtype)
        self.fwd_operator = fwd_operator
        self.rev_operator = rev_operator
        self.blas_threads = blas_threads
        first = checkpoint.get_data(0)
        #: The device Level-1 lives on (where u_0's arrays are), or None for host memory.
        self.device = device_of(first) if isinstance(first, (list, tuple)) else None
        if self.device is not None:
            first = self.device.adapt(first)
            if transfers == "inline":
                raise InvalidValueError(
                    f"transfers='inline' would make the caller wait for every device copy; "
                    f"states on {self.device.name} use 'background' (or 'auto')")
            transfers = "background"
        first = check_arrays(first, self.nbytes, self.dtype, "checkpoint.get_data(0)",
                             device=self.device)

        engine_buffers = staging_buffers + AsyncMultistage.prefetch_slots
        self._engine_buffers = engine_buffers
        self._budget = (None if self.memory_budget is None
                        else Budget(self.memory_budget, self.nbytes, engine_buffers))
        self._slots_fixed = fixed_slots is not None
        self.l1_slots, self.in_level1 = self._split(fixed_slots, interval)
        on_host = self.device is None  # a device's budget counts device memory, not DRAM
        # Level-2 DRAM states the budget allows, beside the slots on the host (None: unbounded)
        self._host_states: int | None = None
        if host_memory_budget is not None:
            if on_host:
                raise InvalidValueError(
                    "host_memory_budget is for states on a device; u_0 is in host memory, "
                    "where memory_budget counts Level-1 and Level-2 DRAM together")
            host = parse_bytes("host_memory_budget", host_memory_budget)
            if self._group is not None:
                host = self._group.min(host)
            self._host_states = host // padded(self.nbytes) - engine_buffers
            if self._host_states < 0:
                raise MemoryBudgetError(
                    f"host_memory_budget={host} bytes cannot hold the {engine_buffers} pinned "
                    f"staging and prefetch buffers of {padded(self.nbytes)} bytes")
        bounded = (self._budget is not None if on_host else self._host_states is not None) \
            and not self.in_level1
        if bounded and storage is None:
            storage = ["dram", tempfile.gettempdir()]  # DRAM up to the budget, then spill
            if self._group is not None:
                storage = per_rank(storage, self._group.rank)
        try:
            self.storage, self._owns_storage = open_storage(storage, self.device)
        except BaseException as failure:
            if self._group is not None:
                self._group.fail(failure)  # the others must not wait for this rank
            raise
        self._dram: int | None = None
        if bounded:
            if isinstance(self.storage, HostMemoryStorage):  # bounded by the budget
                self.storage = TieredStorage([self.storage], owned=[self._owns_storage])
                self._owns_storage = True
            self._dram = dram_tier(self.storage)
        self.interval = 0
        self._planned: tuple[int, int] | None = None  # (interval, slots) planned for
        self.schedule: AsyncMultistage | OnlineMultistage | Revolve | None = None
        self._tuner: IntervalTuner | None = None
        self._tuner_key: tuple[object, ...] = ()
        self._link = HostLink() if self.device is None else DeviceLink(self.device)
        self._level1 = Level1(self.nbytes, self._link)
        try:
            self._use_slots(self.l1_slots)
            if self.in_level1:
                self._plan_level1()
            elif isinstance(interval, int):
                self._plan(interval)
            self.transfer_costs: tuple[float, float] | None = None
            self.tier_costs: list[tuple[float, float]] | None = None
            if not self.in_level1 and (self._owns_storage or isinstance(interval, str)):
                # a device adds its copies to and from page-locked memory to every transfer
                down, up = self._link.measure(self.nbytes)
                if isinstance(self.storage, TieredStorage):
                    self.tier_costs = [(tw + down, tr + up) for tw, tr in
                                       (measure_transfer(t, self.nbytes)
                                        for t in self.storage.tiers)]
                    self.transfer_costs = self.tier_costs[0]
                    transfers = "background" if transfers == "auto" else transfers
                else:
                    tw, tr = measure_transfer(self.storage, self.nbytes)
                    self.transfer_costs = (tw + down, tr + up)
            if transfers == "auto":
                cheap = (self.transfer_costs is not None
                         and sum(self.transfer_costs) < 2 * THREAD_HANDOFF_S)
                if self._group is not None:  # the model's costs depend on it: one answer
                    cheap = self._group.all(cheap)
                transfers = "inline" if cheap or self.in_level1 else "background"
            self.transfers = transfers
            self._engine = TransferEngine(
                self.storage,
                self.nbytes,
                staging_buffers=0 if self.in_level1 else staging_buffers,
                prefetch_buffers=0 if self.in_level1 else AsyncMultistage.prefetch_slots,
                io_threads=io_threads if transfers == "background" else 0,
                verify=verify,
                on_error=on_level2_error,
                link=self._link,
            )
            self._interpreter = Interpreter(checkpoint, self.nbytes, self.dtype, fwd_operator,
                                            rev_operator, self._engine, self._level1,
                                            self._group)
            if isinstance(interval, str) and not self.in_level1:
                tw, tr = self.transfer_costs  # type: ignore[misc]
                self._tuner_key = self._cost_key(fwd_operator, rev_operator, transfers,
                                                 self.taping)
                self._tuner = remembered(self._tuner_key, IntervalTuner(
                    self._nominal_n(), self.l1_slots, staging_buffers, transfers == "inline",
                    self.taping, tw=tw, tr=tr, tc=self._measure_copy(first),
                    tier_costs=self.tier_costs, in_memory=self._memory_tier()),
                    otherwise=self._cost_key(fwd_operator, rev_operator, transfers,
                                             not self.taping))
                if self.device is None and self._tuner.fault_s is None:
                    self._tuner.fault_s = measure_fault(self.nbytes)
                if self.n_timesteps == 1:
                    self._plan(1)
        except BaseException as failure:
            self._level1.release()
            self._link.close()
            if self._owns_storage:
                self.storage.close()
            if self._group is not None:
                try:
                    self._group.fail(failure)
                finally:
                    self._group.free()
            raise
        self._closed = False
        self._actions: Iterator[Action] | None = None
        self._phase = "idle"  # idle -> forward-done -> idle
        self._stats = Stats()
        self._fit = CallFit()
        self._fresh_base = 0.0
        self._faults_base = (0, 0.0)
        log.info("AsyncCheckpointer: n=%d I=%s l1_slots=%d, state %d bytes, Level-1 %.1f MiB, "
                 "Level-2 %r, transfers %s, taping %s", self.n_timesteps,
                 "Level-1 only" if self.in_level1 else interval, self.l1_slots, self.nbytes,
                 self.l1_bytes / 2**20, self.storage, self.transfers, self.taping)

    def _split(self, fixed_slots: int | None, interval: int | str) -> tuple[int, bool]:
        """Level-1 slots, and whether the run needs no Level-2 (every state the reverse sweep
        reads fits in Level-1, or the budget leaves no room for the transfer engine)."""
        n = self.n_timesteps
        budget = self._budget
        if n is None:  # an online run needs Level-2: only n tells when Level-1 is enough
            if budget is None:
                assert fixed_slots is not None
                return fixed_slots, False
            if budget.max_slots_with_level2 < 1:
                raise MemoryBudgetError(
                    f"memory_budget={budget.nbytes} bytes leaves no room for Level-2 beside "
                    f"{budget.engine_buffers} staging and prefetch buffers, which a run of "
                    "unknown length needs")
            if fixed_slots is not None:
                budget.check_slots(fixed_slots, True)
                return fixed_slots, False
            guess = interval if isinstance(interval, int) else 10
            return max(1, min(guess, budget.max_slots_with_level2)), False
        needed = max(1, n - (1 if self.taping else 0))
        if budget is None:
            assert fixed_slots is not None
            return fixed_slots, fixed_slots >= needed
        if fixed_slots is not None:
            level1_only = fixed_slots >= needed or budget.max_slots_with_level2 < 1
            budget.check_slots(fixed_slots, not level1_only)
            return fixed_slots, level1_only
        if budget.buffers >= needed:
            return needed, True
        if budget.max_slots_with_level2 < 1:
            return min(budget.buffers, n), True  # Revolve in the budget's slots alone
        guess = interval if isinstance(interval, int) else 10  # "auto" revises it every run
        return max(1, min(guess, budget.max_slots_with_level2)), False

    def _use_slots(self, l1_slots: int) -> None:
        """Run with ``l1_slots`` Level-1 slots; the DRAM tier of Level-2 gets what the budget
        leaves beside them."""
        self.l1_slots = l1_slots
        if self._dram is not None:
            assert isinstance(self.storage, TieredStorage)
            # bytes, not states: states smaller than the largest are counted at their size
            self.storage.set_byte_limit(self._dram,
                                        self._dram_states(l1_slots) * padded(self.nbytes))
        buffers = 0 if self.in_level1 else self._engine_buffers
        used = l1_slots if self.n_timesteps is None else min(l1_slots, self.n_timesteps)
        self.l1_bytes = (used + buffers) * padded(self.nbytes)

    def _dram_states(self, l1_slots: int) -> int:
        """States the budgeted DRAM tier of Level-2 holds beside ``l1_slots`` slots: on the host
        what memory_budget leaves, on a device what host_memory_budget leaves."""
        if self._host_states is not None:
            return self._host_states
        assert self._budget is not None
        return self._budget.dram_states(l1_slots)

    def _capacities(self, l1_slots: int) -> list[int | None] | None:
        """Each Level-2 tier's capacity with ``l1_slots`` slots (None: one untiered Level-2)."""
        if not isinstance(self.storage, TieredStorage):
            return None
        capacities = list(self.storage.capacities)
        if self._dram is not None:
            capacities[self._dram] = self._dram_states(l1_slots)
        return capacities

    def _cost_key(self, fwd: object, rev: object, transfers: str,
                  taping: bool) -> tuple[object, ...]:
        """What the measured unit costs depend on: the operators' kinds, the state size, the
        Level-2 device and the protocol. Taping runs a forward and a reverse call by turns at
        every reverse step, and on Devito 3D their steps cost more than in taping-free runs
        (a forward step 5% more, side by side): priced with the costs both protocols measured,
        taping runs took 1.2 times their prediction. The first checkpointer of one protocol
        starts from what runs of the other measured (see :func:`remembered`)."""
        def describe(storage: Storage) -> str:
            config = storage.get_config()
            return str(sorted(config.items())) if config else type(storage).__qualname__

        tiers = self.storage.tiers if isinstance(self.storage, TieredStorage) else [self.storage]
        device = " then ".join(describe(tier) for tier in tiers)
        return (type(fwd).__module__, type(fwd).__qualname__, type(rev).__module__,
                type(rev).__qualname__, self.nbytes, device, transfers, taping)

    def _nominal_n(self) -> int:
        """n for the model: the run's, or for runs of unknown length the last one's (at first,
        long enough for intervals of any length the slots favour)."""
        if self.n_timesteps is not None:
            return self.n_timesteps
        if self._tuner is not None and self._tuner.runs:
            return self._tuner.n_steps
        return 100 * (self.l1_slots + 1)

    def _plan_level1(self) -> None:
        """Run Revolve in the Level-1 slots alone, with no Level-2 (store-all there, when every
        state the reverse sweep reads fits)."""
        assert self.n_timesteps is not None
        self.interval = 0
        self._planned = None
        self.schedule = Revolve(self.n_timesteps, min(self.l1_slots, self.n_timesteps),
                                taping=self.taping)

    def _plan(self, interval: int) -> None:
        """Use ``interval`` from now on (the least one, for adaptive and online runs): build its
        schedule, where it is fixed in advance, and make room on Level-2."""
        n = self.n_timesteps
        if self._planned == (interval, self.l1_slots):
            return
        if n is not None:
            l2_states = len(range(0, n, interval))
            capacities = self._capacities(self.l1_slots)
            if capacities is not None and None not in capacities \
                    and sum(c for c in capacities if c is not None) < l2_states:
                raise MemoryBudgetError(
                    f"interval {interval} keeps {l2_states} states on Level-2, but its tiers "
                    f"hold {sum(c for c in capacities if c is not None)} within memory_budget="
                    f"{self.memory_budget} bytes: give a larger interval or budget, or a disk "
                    "tier")
            self.storage.reserve(self.nbytes, l2_states)
        self.interval = interval
        self._planned = interval, self.l1_slots
        # an adaptive or online run's schedule is made per run, fed by that run
        self.schedule = (None if self._adaptive or n is None
                         else AsyncMultistage(n, interval, self.l1_slots, taping=self.taping))

    def _online_schedule(self, stop: Callable[[int], object] | None) -> OnlineMultistage:
        """A run's schedule whose intervals (adaptive) or end (unknown n) the run decides."""
        return OnlineMultistage(
            self.l1_slots, RunDecisions(self._engine, self.interval, adaptive=self._adaptive,
                                        stop=stop, step_seconds=self._step_seconds,
                                        group=self._group),
            n_steps=self.n_timesteps, min_interval=self.interval, taping=self.taping)

    def _step_seconds(self) -> float:
        """A forward step's seconds: measured in this run, else the model's."""
        stats = self._stats
        if stats.forward_steps:
            return stats.forward_compute_s / stats.forward_steps
        tuner = self._tuner
        return tuner.tf if tuner is not None and tuner.tf is not None else 0.0

    def _measure_copy(self, arrays: list[np.ndarray]) -> float:
        """Seconds of the staging copy of one state (a store's cost to the caller)."""
        slot = self._level1.take()
        try:
            return self._link.measure_copy(arrays, [slot])
        finally:
            self._level1.give(slot)

    # -- public API ----------------------------------------------------------------------------

    @property
    def stats(self) -> Stats:
        """Counts and timings of the current (or last) run."""
        return self._stats

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
        if self.n_timesteps is None and stop is None:
            raise UsageError("n_timesteps=None: apply_forward(stop=callable) must say where the "
                             "forward sweep ends")
        if self.n_timesteps is not None and stop is not None:
            raise UsageError(f"stop= is for runs of unknown length (n_timesteps=None); this "
                             f"checkpointer runs n_timesteps={self.n_timesteps} steps")
        if stop is not None and not callable(stop):
            raise InvalidTypeError(f"stop must be callable, got {stop!r}")
        if self._phase != "idle":
            self._abandon_run()
        if self._group is not None:
            self._group.settled = False  # a failure agreed on in an earlier run is over
        self._stats = Stats(n_timesteps=self.n_timesteps or 0, l1_slots=self.l1_slots,
                            l1_bytes=self.l1_bytes, taping=self.taping,
                            device="host" if self.device is None else self.device.name)
        self._fit = CallFit()
        self._level1.copies, self._level1.copy_s = 0, 0.0
        self._interpreter.descriptor_s = 0.0
        self._fresh_base = self.storage.fresh_s
        self._faults_base = POOL.faults()
        self._engine.reset_counters()
        if isinstance(self.storage, TieredStorage):
            self.storage.reset_counters()
        tuner = self._tuner
        n = self.n_timesteps
        if tuner is not None and (n is None or n > 1):
            try:
                if tuner.tf is None and n is not None:
                    self._probe(tuner)
                if tuner.tf is not None:
                    self._choose(tuner)
                else:  # a first run of unknown length: the adaptive rule alone
                    self._plan(1)
            except BaseException as failure:
                if self._group is not None:
                    self._group.fail(failure)
                raise
        if self._planned is not None and (self._adaptive or n is None):
            self.schedule = self._online_schedule(stop)
        assert self.schedule is not None
        self._stats.interval = self.interval
        self.trace = []
        self._actions = iter(self.schedule)
        self._phase = "forward"
        start = time.perf_counter()
        try:
            if isinstance(self.schedule, (Revolve, AsyncMultistage)):
                # fault the slots the schedule will hold in now, on several threads: 1.7 times
                # faster on this project's virtual machines than one by one inside the sweep
                self._level1.reserve(self.schedule.l1_peak)
            self._run(EndForward)
        finally:
            self._stats.forward_s = time.perf_counter() - start
            self._collect()
        schedule = self.schedule
        if isinstance(schedule, OnlineMultistage):
            assert schedule.n_reached is not None
            self._stats.n_timesteps = schedule.n_reached
            self._stats.interval_starts = list(schedule.stores)
        elif isinstance(schedule, AsyncMultistage):
            self._stats.interval_starts = list(range(0, schedule.n_steps, schedule.interval))
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
            self._collect()
        self._actions = None
        self._phase = "idle"
        stats = self._stats
        if self._tuner is not None:
            predicted = stats.calibration.get("predicted_total_s")
            if predicted:
                stats.calibration["measured_over_predicted"] = stats.total_s / predicted
            self._tuner.learn(stats, self._fit)
            if self.n_timesteps is None:
                self._tuner.n_steps = stats.n_timesteps  # the next run's best guess of n
            remember(self._tuner_key, self._tuner)

    def _memory_tier(self) -> int | None:
        """Which tier of Level-2 keeps its states in this process's host memory, if any."""
        if isinstance(self.storage, TieredStorage):
            return dram_tier(self.storage)
        return 0 if type(self.storage) is HostMemoryStorage else None

    def _warm_buffers(self) -> int:
        """State buffers already faulted in that the next run can use: its slots, the process
        pool's, and the spares of a DRAM Level-2."""
        warm = self._level1.made + POOL.count(padded(self.nbytes))
        index = self._memory_tier()
        if index is not None:
            tiers = self.storage.tiers if isinstance(self.storage, TieredStorage) else [self.storage]
            memory = tiers[index]
            assert isinstance(memory, HostMemoryStorage)
            warm += memory.spares(self.nbytes)
        return warm

    def _plan_for(self, tuner: IntervalTuner) -> Plan:
        """The plan to run (:func:`~asyncckpt._tuning.fastest_once_warm` on a first run, then
        :func:`~asyncckpt._tuning.cheapest_near_fastest`): for each slot count, the intervals
        the model finds fastest with and without faults priced, and Revolve in the Level-1 slots
        alone. Under a budget without fixed slots the slot counts span the
        splits of the budget between slots and the DRAM tier."""
        budgeted = self._budget is not None and not self._slots_fixed
        if budgeted:
            assert self._budget is not None
            candidates = slot_candidates(min(self._budget.max_slots_with_level2, tuner.n_steps))
        else:
            candidates = [self.l1_slots]
        # pricing faults changes the choice only where a fault cost was measured
        pricings = (False, True) if tuner.fresh() is not None else (False,)
        plans: list[Plan] = []
        seen: set[tuple[int, int]] = set()
        for slots in candidates:
            capacities = self._capacities(slots)
            try:
                choices = [tuner.choose(slots, capacities, fresh=fresh,
                                        max_candidates=512 if budgeted else 4096)
                           for fresh in pricings]
            except InvalidValueError:  # these tiers hold no state beside so many slots
                if not budgeted:
                    raise
                continue
            intervals = {choice.interval for choice in choices}
            if self.n_timesteps is not None:
                intervals.add(0)
            for interval in intervals:  # each priced once, the warm choice's baselines kept
                used = slots
                if budgeted and interval and not self._adaptive:
                    # an interval's schedule is the same with more than I slots: the budget
                    # they would take goes to the DRAM tier instead of sending states to disk
                    used = min(slots, interval)
                    if (used, interval) in seen:
                        continue
                seen.add((used, interval))
                room = capacities if used == slots else self._capacities(used)
                transfers = (AsyncMultistage(tuner.n_steps, interval, used).l2_states
                             if interval else 0)
                plans.append(Plan(used, interval, choices[0],
                                  tuner.price(used, interval, room, fresh=False),
                                  tuner.price(used, interval, room), transfers))
        if not plans:
            raise MemoryBudgetError(f"memory_budget={self.memory_budget} bytes leaves no "
                                    f"room on Level-2 {self.storage!r}")
        chosen = cheapest_near_fastest(plans) if tuner.runs else fastest_once_warm(plans)
        if log.isEnabledFor(logging.DEBUG):
            for plan in sorted(plans, key=lambda plan: plan.warm_s)[:6]:
                log.debug("auto considers %d slots, I=%d: %.3f s warm, %.3f s of faults, "
                          "%d Level-2 writes", plan.slots, plan.interval, plan.warm_s,
                          plan.faults_s, plan.transfers)
            log.debug("auto: %d slots, %s, predicted %.3f s (%.3f s of faults), %d warm "
                      "buffers, tf %.3g s, tb %.3g s, tcall %.3g s, tw %.3g s, tr %.3g s, "
                      "fault %s s", chosen.slots,
                      f"I={chosen.interval}" if chosen.interval else "Level-1 alone",
                      chosen.total_s, chosen.faults_s, tuner.warm_buffers, tuner.tf or 0.0,
                      tuner.costs().tb, tuner.tcall, tuner.tw, tuner.tr, tuner.fault_s)
        return chosen

    def _choose(self, tuner: IntervalTuner) -> None:
        """Take the schedule the model predicts fastest once memory is warm, or after a first
        run one within :data:`~asyncckpt._tuning.NEAR_TIE` of it that faults in less fresh
        memory: an interval, or Revolve in Level-1 alone; under a budget without fixed slots,
        also the split of the budget between Level-1 slots and the DRAM tier. The prediction
        adds what this run pays to fault in the memory no earlier run left (see
        :mod:`asyncckpt._tuning`)."""
        tuner.n_steps = self._nominal_n()
        tuner.warm_buffers = self._warm_buffers()
        if self._group is not None:
            agree_costs(tuner, self._group)
        plan = self._plan_for(tuner)
        slots, interval, choice = plan.slots, plan.interval, plan.choice
        self._use_slots(slots)
        self._stats.calibration = tuner.record(choice)
        self._stats.calibration.update(interval=interval, predicted_total_s=plan.total_s,
                                       predicted_faults_s=plan.faults_s)
        self._stats.l1_slots, self._stats.l1_bytes = self.l1_slots, self.l1_bytes
        if self._group is not None:
            self._group.same("the plan (l1_slots, interval; 0: Level-1 alone)",
                             (self.l1_slots, interval))
        if interval == 0:
            # Revolve in the Level-1 slots alone: no Level-2 at all
            self._plan_level1()
        else:
            self._plan(interval)
            if self._adaptive and self.n_timesteps is not None:
                costs = tuner.costs()
                adaptive = predict_adaptive(self.n_timesteps, self.l1_slots, costs,
                                            min_interval=interval,
                                            staging_buffers=tuner.staging_buffers,
                                            taping=self.taping)
                self._stats.calibration.update(
                    predicted_total_s=adaptive.total_s,
                    adaptive_interval=adaptive_interval(costs, interval))

    def _probe(self, tuner: IntervalTuner) -> None:
        """The first run with ``interval="auto"`` and no costs yet: time the opening forward calls
        (see :func:`~asyncckpt._calibrate.probe_forward`). u_0 is kept in a Level-1 slot and
        restored, so the schedule then runs from u_0 as it is."""
        stats, arrays, link = self._stats, self._interpreter.arrays, self._link
        held = self._level1.take()
        try:
            link.copy_out(arrays(0, into=False), held)
            assert self.n_timesteps is not None  # runs of unknown length are not probed
            lengths, seconds = probe_forward(self.fwd_operator, self.n_timesteps,
                                             settle=link.settle)
            stats.forward_compute_s += sum(seconds)
            stats.forward_steps += sum(lengths)
            stats.probe_steps = sum(lengths)
            if len(lengths) == 3:
                tuner.probed(seconds[1], seconds[2], lengths[2])
            else:
                tuner.tf, tuner.tcall = max(seconds[0], 1e-9), 0.0
            link.copy_in(held, arrays(0, into=True))
        finally:
            self._level1.give(held)

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
            if self._group is not None:
                self._group.free()

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
        interval = self.interval if self._tuner is None else "'auto'"
        return (f"AsyncCheckpointer(n_timesteps={self.n_timesteps}, l1_slots={self.l1_slots}, "
                f"interval={interval}, storage={self.storage!r})")

    # -- interpretation ------------------------------------------------------------------------

    def _check_open(self) -> None:
        if self._closed:
            raise UsageError("the AsyncCheckpointer is closed")

    def _abandon_run(self) -> None:
        self._engine.discard()
        self._level1.abandon()
        self._actions = None
        self._phase = "idle"

    def _collect(self) -> None:
        engine, stats = self._engine, self._stats
        stats.l2_writes, stats.l2_reads = engine.writes, engine.reads
        stats.bytes_written, stats.bytes_read = engine.bytes_written, engine.bytes_read
        stats.write_stall_s, stats.read_stall_s = engine.write_stall_s, engine.read_stall_s
        stats.write_busy_s, stats.read_busy_s = engine.write_busy_s, engine.read_busy_s
        stats.l2_peak_states = engine.peak_held
        stats.l2_failures = engine.failures
        stats.write_fresh_s = self.storage.fresh_s - self._fresh_base
        made, made_s = POOL.faults()
        stats.fresh_buffers = made - self._faults_base[0]
        stats.fresh_s = made_s - self._faults_base[1]
        if isinstance(self.storage, TieredStorage):
            stats.l2_tiers = self.storage.counters()
        stats.device_bytes = self._link.device_bytes
        stats.copies = self._level1.copies + engine.copies
        stats.copy_s = self._level1.copy_s + engine.copy_s
        stats.descriptor_s = self._interpreter.descriptor_s
        stats.forward_calls = int(self._fit.calls)

    def _run(self, until: type[EndForward] | type[EndReverse]) -> None:
        assert self._actions is not None
        limits = (threadpool_limits(limits=self.blas_threads, user_api="blas")
                  if self.blas_threads is not None else None)
        group = self._group
        try:
            self._interpreter.run(self._actions, until, self._stats, self._fit,
                                  self.trace if self.keep_trace else None)
            if until is EndReverse:
                self._engine.drain()
            if group is not None:
                group.exchange()  # the end of a sweep: every rank got here, or all raise
        except BaseException as failure:
            if group is not None:
                group.fail(failure)
            raise
        finally:
            if limits is not None:
                limits.restore_original_limits()
