"""asyncckpt: asynchronous multistage checkpointing.

Reverse arbitrarily long runs in fixed fast memory: every I-th state streams to Level-2 storage
(host DRAM, a ramdisk, an SSD) on background threads during the forward sweep, comes back by
prefetch during the reverse sweep, and Revolve runs inside each interval.
"""
from __future__ import annotations

from .checkpoint import ArrayCheckpoint, Checkpoint
from . import costs as cost_memory  # asyncckpt.cost_memory.forget(), as docs/model.md says
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
    "cost_memory",
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

__version__ = "0.2.0"
