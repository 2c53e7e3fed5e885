"""Level-2 storage: where every I-th state waits for the reverse sweep.

Keys are ints (the step t); a value is one flat buffer of ``nbytes`` bytes. ``put`` and ``get``
block and run on the transfer engine's worker threads, so backends must be thread-safe for
distinct keys.

The contract is :class:`Storage` (``base``); the backends are host memory (``memory``), a file
(``files``), tiers of those (``tiered``) and a codec in front of any (``compressed``);
``spec`` reads what a user writes as ``storage=``.
"""
from __future__ import annotations

from .base import Storage, WrapperStorage
from .compressed import CompressedStorage, CompressionCounters
from .files import FileStorage, release_files
from .memory import HostMemoryStorage, PinnedMemoryStorage, release_memory
from .spec import (from_config, in_host_memory, level2_spec, memory_tier, names_host_memory,
                   open_level2, open_storage, per_rank, tiers_of)
from .tiered import TieredStorage

__all__ = [
    "Storage",
    "WrapperStorage",
    "HostMemoryStorage",
    "PinnedMemoryStorage",
    "FileStorage",
    "TieredStorage",
    "CompressedStorage",
    "CompressionCounters",
    "from_config",
    "level2_spec",
    "memory_tier",
    "in_host_memory",
    "names_host_memory",
    "open_level2",
    "open_storage",
    "per_rank",
    "release_files",
    "release_memory",
    "tiers_of",
]
