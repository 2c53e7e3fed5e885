"""pyrevolve's explicitly leveled revolvers: ``SingleLevelRevolver`` (and its ``MemoryRevolver``
and ``DiskRevolver``) runs Revolve in one storage, ``MultiLevelRevolver`` runs H-Revolve over a
list of them. Both store where pyrevolve would, synchronously, in the storages of
:mod:`asyncckpt.compat.storage`, calling ``get_data`` once per state stored and
``get_data_location`` once per state restored, under pyrevolve's (taping) protocol; the schedules
are :mod:`schedules`' own, validated by :func:`schedules.simulate`."""
from __future__ import annotations

import os
from collections.abc import Iterator
from typing import Any

from schedules import (Advance, EndForward, EndReverse, Free, HRevolve, Level, Load, Prefetch,
                       Reverse, Revolve, Store, Tier, simulate)

from ..checkpoint import as_dtype
from ..errors import InvalidValueError, UsageError
from ._revolver import choose_l1_slots
from .compression import init_compression
from .profiling import Profiler
from .storage import BytesStorage, DiskStorage, NumpyStorage, Storage

__all__ = ["SingleLevelRevolver", "MemoryRevolver", "DiskRevolver", "MultiLevelRevolver"]

_TIERS = (Tier.L1, Tier.L2)
#: Bytes beyond a state that a compressed slot holds.
_CODEC_HEADROOM = 4096


class _LeveledRevolver:
    """Runs a schedule's actions on the user's operators, storing in ``storage_list`` (the
    action's tier: L1 is the first storage, L2 the second)."""

    def __init__(self, checkpoint: Any, fwd_operator: Any, rev_operator: Any,
                 n_timesteps: int, timings: Any, profiler: Any) -> None:
        if not isinstance(n_timesteps, int) or isinstance(n_timesteps, bool) or n_timesteps < 1:
            raise InvalidValueError(f"n_timesteps must be an int >= 1, got {n_timesteps!r} "
                                    "(these revolvers plan offline)")
        self.checkpoint, self.fwd_operator, self.rev_operator = checkpoint, fwd_operator, rev_operator
        self.n_timesteps, self.timings = n_timesteps, timings
        self.profiler = Profiler() if profiler is None else profiler
        self.storage_list: list[Storage] = []
        self._actions: Iterator[Any] | None = None
        self._keys: list[dict[int, int]] = []
        self._forward_steps: int | None = None

    def _schedule(self) -> Any:
        raise NotImplementedError

    def apply_forward(self) -> None:
        """The forward sweep to u_n, storing what the schedule stores; a second call starts a new
        run."""
        self._actions = iter(self._schedule())
        self._keys = [{} for _ in self.storage_list]
        self._run("forward", EndForward)

    def apply_reverse(self) -> None:
        """The reverse sweep: the adjoint of steps n-1 down to 0."""
        if self._actions is None:
            raise UsageError("apply_reverse() needs apply_forward() first")
        try:
            self._run("reverse", EndReverse)
        finally:
            self._actions = None

    def _run(self, section: str, until: type) -> None:
        assert self._actions is not None
        timer = self.profiler.get_timer
        for action in self._actions:
            match action:
                case Advance(start, end):
                    with timer(section, "advance"):
                        self.fwd_operator.apply(t_start=start, t_end=end)
                case Reverse(step):
                    with timer(section, "reverse"):
                        self.rev_operator.apply(t_start=step, t_end=step + 1)
                case Store(step, tier):
                    with timer(section, "takeshot"):
                        self._store(step, _TIERS.index(tier))
                case Load(step, tier):
                    with timer(section, "restore"):
                        self._load(step, _TIERS.index(tier))
                case Free(step, tier):
                    self._free(step, _TIERS.index(tier))
                case Prefetch():
                    pass  # reads are synchronous here
                case _ if type(action) is until:
                    return

    def _store(self, step: int, level: int) -> None:
        keys = self._keys[level]
        key = min(set(range(len(keys) + 1)) - set(keys.values()))
        self.storage_list[level].save(key, self.checkpoint.get_data(step))
        keys[step] = key

    def _load(self, step: int, level: int) -> None:
        self.storage_list[level].load(self._keys[level][step],
                                      self.checkpoint.get_data_location(step))

    def _free(self, step: int, level: int) -> None:
        del self._keys[level][step]

    @property
    def ratio(self) -> float:
        """Forward steps beyond n over n (taping steps included), as the compat ``Revolver``'s."""
        if self._forward_steps is None:
            self._forward_steps = simulate(self._schedule()).forward_steps
        return (self._forward_steps - self.n_timesteps) / self.n_timesteps

    def storage_ckps(self, k: int = 0) -> list[int]:
        """The steps whose states level ``k`` holds now."""
        return sorted(self._keys[k]) if k < len(self._keys) else []

    def close(self) -> None:
        """Delete the disk storages' files now (otherwise when they are collected)."""
        for storage in self.storage_list:
            if isinstance(storage, DiskStorage) and not storage.keepfiles:
                storage.removeDatdir()

    def __enter__(self) -> "_LeveledRevolver":
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()


def _single_slots(n_checkpoints: int | None, checkpoint: Any, n_timesteps: int) -> int:
    if n_checkpoints is None:
        return choose_l1_slots(checkpoint.size * as_dtype(checkpoint.dtype).itemsize, n_timesteps)
    if not isinstance(n_checkpoints, int) or isinstance(n_checkpoints, bool) or n_checkpoints < 1:
        raise InvalidValueError(f"n_checkpoints must be an int >= 1, got {n_checkpoints!r}")
    return n_checkpoints


class SingleLevelRevolver(_LeveledRevolver):
    """Revolve with ``n_checkpoints`` states in one storage: host memory (a ``NumpyStorage``, or a
    ``BytesStorage`` with ``compression_params``), or with ``diskstorage=True`` files under
    ``filedir`` (``singlefile``: one file or one per state). ``n_checkpoints=None``: as many as a
    quarter of the available memory holds, at most n."""

    def __init__(self, checkpoint: Any, fwd_operator: Any, rev_operator: Any,
                 n_checkpoints: int | None, n_timesteps: int, timings: Any = None,
                 profiler: Any = None, compression_params: dict[str, Any] | None = None,
                 diskstorage: bool = False, filedir: str | os.PathLike[str] = "./",
                 singlefile: bool = True) -> None:
        super().__init__(checkpoint, fwd_operator, rev_operator, n_timesteps, timings, profiler)
        self.n_checkpoints = _single_slots(n_checkpoints, checkpoint, n_timesteps)
        self.compression_params = compression_params
        self.filedir, self.singlefile = filedir, singlefile
        size, dtype = checkpoint.size, checkpoint.dtype
        if diskstorage:
            storage: Storage = DiskStorage(size, self.n_checkpoints, dtype, self.profiler,
                                           filedir=filedir, singlefile=singlefile)
        elif compression_params is None or compression_params.get("scheme") is None:
            storage = NumpyStorage(size, self.n_checkpoints, dtype, self.profiler)
        else:
            # room for codecs' headers, and for data that does not compress
            headroom = -(-_CODEC_HEADROOM // as_dtype(dtype).itemsize)
            storage = BytesStorage(size + headroom, self.n_checkpoints, dtype,
                                   init_compression(compression_params), auto_pickle=True,
                                   profiler=self.profiler)
        self.storage_list = [storage]

    def _schedule(self) -> Revolve:
        return Revolve(self.n_timesteps, self.n_checkpoints)

    @property
    def makespan(self) -> int:
        """pyrevolve's: 0 for the single-level classes."""
        return 0


class MemoryRevolver(SingleLevelRevolver):
    """:class:`SingleLevelRevolver` in host memory."""

    def __init__(self, checkpoint: Any, fwd_operator: Any, rev_operator: Any,
                 n_checkpoints: int | None, n_timesteps: int, timings: Any = None,
                 profiler: Any = None, compression_params: dict[str, Any] | None = None) -> None:
        super().__init__(checkpoint, fwd_operator, rev_operator, n_checkpoints, n_timesteps,
                         timings, profiler, compression_params=compression_params)


class DiskRevolver(SingleLevelRevolver):
    """:class:`SingleLevelRevolver` on files under ``filedir``."""

    def __init__(self, checkpoint: Any, fwd_operator: Any, rev_operator: Any,
                 n_checkpoints: int | None, n_timesteps: int, timings: Any = None,
                 profiler: Any = None, filedir: str | os.PathLike[str] = "./",
                 singlefile: bool = True) -> None:
        super().__init__(checkpoint, fwd_operator, rev_operator, n_checkpoints, n_timesteps,
                         timings, profiler, diskstorage=True, filedir=filedir,
                         singlefile=singlefile)


class MultiLevelRevolver(_LeveledRevolver):
    """H-Revolve over ``storage_list`` (fastest first; each storage's ``n_ckp``, ``wd`` and
    ``rd`` are its slots and costs), with forward steps costing ``uf`` and reverse steps ``ub``.
    pyrevolve's ``up`` (the cost of a turn) is kept and not priced: a turn is a reverse step
    here. Runs on one or two storages (a memory and a disk)."""

    def __init__(self, checkpoint: Any, fwd_operator: Any, rev_operator: Any, n_timesteps: int,
                 storage_list: list[Storage], timings: Any = None, profiler: Any = None,
                 uf: float = 1, ub: float = 1, up: float = 1) -> None:
        super().__init__(checkpoint, fwd_operator, rev_operator, n_timesteps, timings, profiler)
        if storage_list is None:
            raise InvalidValueError("storage_list must be a list of one or two storages, got None")
        self.storage_list = storage_list
        for storage in storage_list:
            storage.profiler = self.profiler
        self.reload_scheduler(uf, ub, up)

    def reload_scheduler(self, uf: float = 1, ub: float = 1, up: float = 1) -> None:
        """Plan again for the storage list as it is now."""
        if not 1 <= len(self.storage_list) <= 2:
            raise InvalidValueError(f"storage_list must hold one or two storages, got "
                                    f"{len(self.storage_list)}")
        self.uf, self.ub, self.up = uf, ub, up
        levels = [Level(st.nckp, st.wd, st.rd) for st in self.storage_list]
        self.scheduler = HRevolve(self.n_timesteps, levels, forward_cost=uf, reverse_cost=ub)
        self._forward_steps = None

    @property
    def n_checkpoints(self) -> int:
        """The slots of all levels together (each storage's ``nckp``)."""
        return sum(storage.nckp for storage in self.storage_list)

    @property
    def makespan(self) -> float:
        """H-Revolve's makespan in the costs' unit."""
        return self.scheduler.makespan

    def _schedule(self) -> HRevolve:
        return self.scheduler

