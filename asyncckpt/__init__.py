"""asyncckpt: asynchronous multistage checkpointing.

Reverse arbitrarily long runs in fixed fast memory: every I-th state streams to Level-2 storage
(host DRAM, a ramdisk, an SSD) on background threads during the forward sweep, comes back by
prefetch during the reverse sweep, and Revolve runs inside each interval.

Examples
--------
The adjoint of 100 steps of ``u <- u + 0.01 cos(u)``, every tenth state in Level-2 (host
DRAM) and Revolve in 4 slots inside each interval:

>>> import numpy as np
>>> from asyncckpt import ArrayCheckpoint, AsyncCheckpointer
>>> u = np.linspace(0.0, 1.0, 1000)  # the live state, updated in place
>>> lam = np.zeros_like(u)  # the adjoint state
>>> class Forward:
...     def apply(self, *, t_start, t_end):
...         for _ in range(t_start, t_end):
...             np.add(u, 0.01 * np.cos(u), out=u)
>>> class Reverse:  # the adjoint of step t, with u_t live
...     needs_taping = False
...     def apply(self, *, t_start, t_end):
...         np.multiply(lam, 1 - 0.01 * np.sin(u), out=lam)
>>> with AsyncCheckpointer(ArrayCheckpoint([u]), Forward(), Reverse(), 100,
...                        l1_slots=4, interval=10) as ckp:
...     ckp.apply_forward()
...     lam[:] = u  # dJ/du_n for J = |u_n|^2 / 2
...     ckp.apply_reverse()  # lam is dJ/du_0 now
>>> ckp.stats.reverse_steps, ckp.stats.l2_writes, ckp.stats.forward_steps
(100, 10, 222)
"""
from __future__ import annotations

from ._version import __version__
from .checkpoint import ArrayCheckpoint, Checkpoint
from . import costs as cost_memory  # noqa: F401  (asyncckpt.cost_memory.forget(): older code)
from .checkpointer import AsyncCheckpointer, RunPlan
from .costs import MeasuredCosts
from .errors import (
    CheckpointError,
    CorruptionError,
    InvalidTypeError,
    InvalidValueError,
    MemoryBudgetError,
    RankFailedError,
    ScheduleError,
    StorageError,
    StorageFullError,
    StorageKeyError,
    TransferError,
    UsageError,
)
from .stats import Stats
from .storage import FileStorage, HostMemoryStorage, Storage, TieredStorage, WrapperStorage

__all__ = [
    "ArrayCheckpoint",
    "AsyncCheckpointer",
    "Checkpoint",
    "CheckpointError",
    "CorruptionError",
    "FileStorage",
    "HostMemoryStorage",
    "InvalidTypeError",
    "InvalidValueError",
    "MeasuredCosts",
    "MemoryBudgetError",
    "RankFailedError",
    "RunPlan",
    "ScheduleError",
    "Stats",
    "Storage",
    "StorageError",
    "StorageFullError",
    "StorageKeyError",
    "TieredStorage",
    "TransferError",
    "UsageError",
    "WrapperStorage",
]
