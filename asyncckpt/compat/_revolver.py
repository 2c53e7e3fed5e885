"""The asynchronous ``Revolver``: pyrevolve's arguments, asyncckpt's engine (see the package
docstring for its keywords and environment variables)."""
from __future__ import annotations

import abc
import math
import os
from collections.abc import Callable
from typing import Any

from schedules import OnlineMultistage, simulate

from ..planning import (Environment, check_int, check_operator, choose_l1_slots,
                        default_budget, world_if_running)
from ..checkpoint import Checkpoint, check_descriptor
from ..checkpointer import AsyncCheckpointer
from ..errors import UsageError
from ..stats import Stats
from ..storage import Storage
from ._declared import Settling, declared_dtype
from ._codec import compression_from_pyrevolve
from .profiling import Profiler

__all__ = ["Revolver", "Operator", "Checkpoint", "choose_l1_slots",
           "compression_from_pyrevolve", "default_budget", "taping_from_environment"]

class Operator(abc.ABC):
    """Base of forward and reverse operators, as pyrevolve's: one ``apply`` called with the
    keywords ``t_start`` and ``t_end``."""

    @abc.abstractmethod
    def apply(self, **kwargs: Any) -> None:
        """Forward: advance the live state from u_{t_start} to u_{t_end}. Reverse: the adjoint of
        step t_start (t_end = t_start + 1)."""


def taping_from_environment() -> bool | None:
    """``$ASYNCCKPT_TAPING`` as a bool; None where it is unset or empty (the checkpointer then
    decides from the reverse operator: :class:`~asyncckpt.AsyncCheckpointer`'s ``taping``).

    Raises
    ------
    InvalidValueError
        Naming the variable and the accepted values.
    """
    return Environment.read().taping


class Revolver:
    """pyrevolve's ``Revolver``, running asynchronous multistage checkpointing.

    Parameters
    ----------
    checkpoint : pyrevolve-style checkpoint object
        ``size``, ``dtype``, ``get_data(t)``, ``get_data_location(t)``; a subclass of pyrevolve's
        own ``Checkpoint`` works unchanged.
    fwd_operator, rev_operator : objects with ``apply(t_start=..., t_end=...)``
    n_checkpoints : int or None
        Level-1 slots (>= 1). With n known and nothing that names a Level-2 beside it (no
        ``interval``, ``storage``, ``memory_budget`` or compression, as arguments or
        environment variables) the run is pyrevolve's: Revolve in these slots alone
        (``interval=0``), holding the memory the program asked for and calling ``get_data``
        once per state stored. With any of them, these are the Level-1 slots of the
        asynchronous strategy. None: a memory
        budget (``$ASYNCCKPT_MEMORY_BUDGET``, else a quarter of the available memory,
        :func:`default_budget`) that Level-1 slots, the staging and prefetch buffers and DRAM
        Level-2 share; the model splits it, and Level-2 beyond it goes to the temporary
        directory unless ``storage`` (or ``$ASYNCCKPT_STORAGE``) names where.
        ``n_checkpoints`` then reports the slots chosen.
    n_timesteps : int or None
        n (>= 1). None (which pyrevolve refuses): a run of unknown length, ended by
        ``apply_forward(stop=callable)`` (see :class:`~asyncckpt.AsyncCheckpointer`).
    storage : None, "dram", path or Storage, optional
        Level-2; default ``$ASYNCCKPT_STORAGE``, else host DRAM.
    interval : int, "auto" or "adaptive", optional
        Default ``$ASYNCCKPT_INTERVAL``, else "auto".
    taping : bool, optional
        True: pyrevolve's protocol; False: the taping-free reverse (``rev.apply`` with the live
        state u_t, no taping step). Default ``$ASYNCCKPT_TAPING``, else decided from the
        reverse operator, never guessed: taping-free where it declares ``needs_taping = False``
        or is a Devito operator that reads only what the checkpoint holds
        (``stats.taping_reason``, and the log of ``asyncckpt`` at INFO, say which and why).
    compression_params : dict, optional
        pyrevolve's: ``{"scheme": None | "blosc" | "zfp" | "custom", ...}`` (zfp with one of
        ``tolerance``, ``rate``, ``precision``; custom with ``compressor`` and
        ``decompressor``). Default ``$ASYNCCKPT_COMPRESSION`` (see
        :func:`compression_from_pyrevolve`), else none.
    timings, profiler : optional
        pyrevolve's: ``profiler`` (a :class:`~asyncckpt.compat.profiling.Profiler`, made if
        None) times each sweep; ``timings`` is kept. ``stats`` has the run's own split.
    **options
        Passed to :class:`~asyncckpt.AsyncCheckpointer`. Without ``comm``, a process that
        has already imported and initialised mpi4py with more than one rank (Devito under
        ``DEVITO_MPI``) plans collectively over ``MPI.COMM_WORLD``; ``comm=None`` opts out.

    Notes
    -----
    As pyrevolve's, the constructor calls no method of ``checkpoint`` but its ``size`` and
    ``dtype``: the engine is built at the first ``apply_forward()`` (or the first look at
    ``checkpointer``, ``n_checkpoints``, ``stats`` or ``ratio``), from u_0 as it is then.

    Unlike pyrevolve: 0 checkpoints or n = 1 give a clear error or a correct run (never a
    segfault or ZeroDivisionError), a second ``apply_forward()`` starts a new run, and nothing is
    printed or logged at DEBUG by default.
    """

    def __init__(self, checkpoint: Any, fwd_operator: Any, rev_operator: Any,
                 n_checkpoints: int | None, n_timesteps: int | None, *,
                 storage: Storage | str | os.PathLike[str] | None = None,
                 interval: int | str | None = None, taping: bool | None = None,
                 compression_params: dict[str, Any] | None = None,
                 timings: Any = None, profiler: Any = None, **options: Any) -> None:
        nbytes = check_descriptor(checkpoint)
        check_operator(fwd_operator=fwd_operator, rev_operator=rev_operator)
        # read once: the checkpointer, built at the first run, is built with these values
        self._environment = environment = Environment.read().check()
        if "compression" not in options:
            options["compression"] = (
                compression_from_pyrevolve(compression_params, checkpoint.dtype)
                if compression_params is not None else environment.compression)
        if n_checkpoints is None and "memory_budget" not in options:
            options["memory_budget"] = default_budget(nbytes, environment=environment)
        elif n_checkpoints is not None:  # checked here: the engine is built later
            check_int("n_checkpoints", n_checkpoints, 1)
        if storage is None:
            storage = environment.storage
        if interval is None:
            interval = environment.interval
        if interval is None:
            if (n_checkpoints is not None and n_timesteps is not None and storage is None
                  and options["compression"] is None and options.get("memory_budget") is None
                  and options.get("run_dir") is None):  # a run directory is Level-2
                interval = 0  # pyrevolve's Revolver: Revolve in the slots it was given
            else:
                interval = "auto"
        if "comm" not in options:
            options["comm"] = world_if_running()
        self.checkpoint = checkpoint
        self.fwd_operator = fwd_operator
        self.rev_operator = rev_operator
        self.n_timesteps, self.timings = n_timesteps, timings
        self.profiler = Profiler() if profiler is None else profiler
        self._counted: tuple[object, int, int] | None = None
        self._arguments = dict(l1_slots=n_checkpoints, interval=interval, storage=storage,
                               taping=taping, **options)
        self._checkpointer: AsyncCheckpointer | None = None
        self._closed = False

    @property
    def checkpointer(self) -> AsyncCheckpointer:
        """The :class:`~asyncckpt.AsyncCheckpointer` that runs it, built on first use."""
        return self._build(running=False)

    def _build(self, *, running: bool) -> AsyncCheckpointer:
        """The checkpointer, built now if not yet; ``running``: for the forward sweep about to
        begin, which stores u_0 as the build saw it."""
        if self._checkpointer is None:
            if self._closed:
                raise UsageError("the Revolver is closed")
            first = _FirstStateOnce(self.checkpoint)
            checkpoint: Any = first
            fwd, rev = self.fwd_operator, self.rev_operator
            declared = declared_dtype(first, first.peek())
            if declared is not None:
                checkpoint = declared
                fwd, rev = Settling(fwd, declared), Settling(rev, declared)
            with self._environment.pinned():  # what the construction read, not what is now
                self._checkpointer = AsyncCheckpointer(checkpoint, fwd, rev, self.n_timesteps,
                                                       **self._arguments)
            if not running:  # the run comes later: u_0 is asked for again then
                first.forget()
        return self._checkpointer

    @property
    def n_checkpoints(self) -> int:
        """Level-1 slots of the next (or current) run."""
        return self.checkpointer.l1_slots

    def apply_forward(self, stop: Callable[[int], object] | None = None) -> None:
        """The forward sweep, u_0 to u_n; a second call starts a new run. ``stop``: with
        ``n_timesteps=None``, where the sweep ends (see
        :meth:`asyncckpt.AsyncCheckpointer.apply_forward`)."""
        with self.profiler.get_timer("forward", "apply_forward"):
            self._build(running=True).apply_forward(stop)

    def apply_reverse(self) -> None:
        """The reverse sweep: the adjoint of steps n-1 down to 0."""
        with self.profiler.get_timer("reverse", "apply_reverse"):
            self.checkpointer.apply_reverse()

    @property
    def stats(self) -> Stats:
        """The run's counts and timings (see :class:`asyncckpt.Stats`)."""
        return self.checkpointer.stats

    @property
    def ratio(self) -> float:
        """pyrevolve's ``ratio``: (forward steps of the schedule - n) / n, taping steps included
        (the same as ``stats.recompute_factor`` after a run).

        Known once the interval is: at construction for a fixed interval, after the first
        ``apply_forward()`` for "auto", after the forward sweep for "adaptive" or an unknown n;
        NaN before.
        """
        schedule = self.checkpointer.schedule
        if schedule is None or (isinstance(schedule, OnlineMultistage)
                                and schedule.n_reached is None):
            return math.nan
        if self._counted is None or self._counted[0] is not schedule:
            replayed = schedule.replay() if isinstance(schedule, OnlineMultistage) else schedule
            result = simulate(replayed)
            self._counted = (schedule, result.forward_steps, result.n_steps)
        _, steps, n = self._counted
        return (steps - n) / n

    def close(self) -> None:
        """Stop the I/O threads and delete the Level-2 files."""
        self._closed = True
        if self._checkpointer is not None:
            self._checkpointer.close()

    def __enter__(self) -> "Revolver":
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()

    def __repr__(self) -> str:
        if self._checkpointer is None:
            return (f"Revolver(n_checkpoints={self._arguments['l1_slots']}, "
                    f"n_timesteps={self.n_timesteps}, not yet run)")
        return (f"Revolver(n_checkpoints={self.n_checkpoints}, n_timesteps={self.n_timesteps}, "
                f"{self._checkpointer!r})")


class _FirstStateOnce:
    """``checkpoint``, whose u_0 the build asks for and the first store of u_0 then reuses
    (nothing runs between them), so that ``get_data`` runs once per state stored, as in
    pyrevolve."""

    #: get_data_location is called as pyrevolve calls it, never ahead of a load to check u_0's
    #: locations (see :func:`asyncckpt._execution.link.link_for`): they are checked at their
    #: first load, before a state is copied into them
    locations_checked_in_run = True
    #: the arrays it hands out are the wrapped descriptor's own (a ring is read through it)
    passes_arrays_through = True

    def __init__(self, checkpoint: Any) -> None:
        self._checkpoint = self.__wrapped__ = checkpoint  # what the taping decision reads
        self.size, self.dtype = checkpoint.size, checkpoint.dtype
        self._kept: Any = None
        self._reuses = 0

    def peek(self) -> Any:
        """u_0's arrays, asked for once: the build's check and the store of u_0 reuse them."""
        if self._kept is None:
            self._kept, self._reuses = self._checkpoint.get_data(0), 2
        return self._kept

    def forget(self) -> None:
        """Ask for u_0 anew at its store."""
        self._kept, self._reuses = None, 0

    def get_data(self, timestep: int) -> Any:
        if timestep == 0 and self._reuses:
            self._reuses -= 1
            kept = self._kept
            if not self._reuses:
                self.forget()
            return kept
        self.forget()
        return self._checkpoint.get_data(timestep)

    def get_data_location(self, timestep: int) -> Any:
        self.forget()
        return self._checkpoint.get_data_location(timestep)
