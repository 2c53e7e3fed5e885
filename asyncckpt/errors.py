"""The exceptions asyncckpt raises beyond ValueError and TypeError."""
from __future__ import annotations

from schedules import CheckpointError, ScheduleError

__all__ = [
    "CheckpointError",
    "ScheduleError",
    "StorageError",
    "StorageFullError",
    "CorruptionError",
    "TransferError",
]


class StorageError(CheckpointError):
    """A Level-2 backend could not store, read or delete a state."""


class StorageFullError(StorageError):
    """The Level-2 device has no room for what the run will write."""


class CorruptionError(StorageError):
    """A state read back from Level-2 does not match the checksum taken when it was written."""


class TransferError(CheckpointError):
    """A background transfer between Level-1 and Level-2 failed; its cause is chained."""
