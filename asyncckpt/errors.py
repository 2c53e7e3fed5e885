"""Every exception asyncckpt raises for misuse or failure: one tree under :class:`CheckpointError`.

::

    CheckpointError
    ├── InvalidValueError (ValueError)      bad argument, option or environment variable
    ├── InvalidTypeError (TypeError)        wrong type; an object lacking the protocol's methods
    ├── ScheduleError (ValueError)          a schedule breaks an invariant
    ├── UsageError (ValueError)             a call out of order: closed, reverse before forward
    ├── MemoryBudgetError (MemoryError)     the memory at hand cannot hold what the run needs
    ├── StorageError                        a Level-2 backend failed or was misused
    │   ├── StorageKeyError (KeyError)      a key missing, or stored twice
    │   ├── StorageFullError                no room on the device
    │   └── CorruptionError                 a read does not match its checksum
    ├── TransferError                       a background transfer failed; its cause is chained
    └── RankFailedError                     another MPI rank of the run failed (or disagreed)
"""
from __future__ import annotations

from schedules._errors import CheckpointError, InvalidTypeError, InvalidValueError, ScheduleError

__all__ = [
    "CheckpointError",
    "InvalidValueError",
    "InvalidTypeError",
    "ScheduleError",
    "UsageError",
    "MemoryBudgetError",
    "StorageError",
    "StorageKeyError",
    "StorageFullError",
    "CorruptionError",
    "TransferError",
    "RankFailedError",
]


class UsageError(CheckpointError, ValueError):
    """A call the object's state does not allow: a closed checkpointer, or ``apply_reverse()``
    before a completed ``apply_forward()``. (A ValueError, as these were before the hierarchy.)"""


class MemoryBudgetError(CheckpointError, MemoryError):
    """The memory at hand cannot hold what the run needs: not even one Level-1 slot."""


class StorageError(CheckpointError):
    """A Level-2 backend could not store, read or delete a state, or was used after close."""


class StorageKeyError(StorageError, KeyError):
    """``get`` or ``delete`` of a key that is not stored, or ``put`` of one that is."""

    def __str__(self) -> str:  # KeyError quotes its message; this one is a sentence
        return str(self.args[0]) if self.args else ""


class StorageFullError(StorageError):
    """The Level-2 device has no room for what the run will write."""


class CorruptionError(StorageError):
    """A state read back from Level-2 does not match the checksum taken when it was written."""


class TransferError(CheckpointError):
    """A background transfer between Level-1 and Level-2 failed; its cause is chained."""


class RankFailedError(CheckpointError):
    """Another rank of an MPI run failed: raised on every other rank at the next point where
    the ranks exchange, naming the rank and its error (which that rank raises itself)."""
