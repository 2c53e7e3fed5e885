"""asyncckpt: asynchronous multistage checkpointing.

Reverse arbitrarily long runs in fixed fast memory: every I-th state streams to Level-2 storage
(host DRAM, a ramdisk, an SSD) on background threads during the forward sweep, comes back by
prefetch during the reverse sweep, and Revolve runs inside each interval.
"""
from __future__ import annotations

from .checkpoint import ArrayCheckpoint, Checkpoint
from .checkpointer import AsyncCheckpointer
from .errors import (
    CheckpointError,
    CorruptionError,
    ScheduleError,
    StorageError,
    StorageFullError,
    TransferError,
)
from .stats import Stats
from .storage import FileStorage, HostMemoryStorage, Storage

__all__ = [
    "ArrayCheckpoint",
    "AsyncCheckpointer",
    "Checkpoint",
    "CheckpointError",
    "CorruptionError",
    "FileStorage",
    "HostMemoryStorage",
    "ScheduleError",
    "Stats",
    "Storage",
    "StorageError",
    "StorageFullError",
    "TransferError",
]

__version__ = "0.1.0"
