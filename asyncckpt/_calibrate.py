"""Measurements of the real run's costs: Level-2 transfers through the runtime's own I/O path."""
from __future__ import annotations

import statistics
import time

from ._buffers import aligned_buffer
from .storage import Storage

__all__ = ["measure_transfer", "THREAD_HANDOFF_S"]

#: What waking a worker thread costs the caller here (measured: 17-20 us per submit).
THREAD_HANDOFF_S = 20e-6


def measure_transfer(storage: Storage, nbytes: int, repeats: int = 3) -> tuple[float, float]:
    """Return the median seconds to write one state to ``storage`` and to read it back.

    Uses a page-aligned, touched buffer and a key no state uses (negative), and deletes it after.
    """
    buffer = aligned_buffer(nbytes)
    view = buffer[:nbytes]
    key = -1
    while key in storage:
        key -= 1
    writes, reads = [], []
    for _ in range(repeats):
        start = time.perf_counter()
        storage.put(key, view)
        middle = time.perf_counter()
        storage.get(key, view)
        writes.append(middle - start)
        reads.append(time.perf_counter() - middle)
        storage.delete(key)
    return statistics.median(writes), statistics.median(reads)
