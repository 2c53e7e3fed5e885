"""Touched DRAM that closed Level-2 backends leave for the next one in the process.

Faulting fresh memory in is slow where the host reclaims freed pages within seconds (virtual
machines; docs/measurements.md), so a program that makes a new checkpointer per gradient
evaluation would pay it on every evaluation. A closed
:class:`~asyncckpt.storage.HostMemoryStorage` gives its buffers here instead, up to a limit,
and the next one takes them back.
"""
from __future__ import annotations

import ctypes
import ctypes.util
import os
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import numpy as np
import psutil

from .buffers import HUGE_PAGE, aligned_buffer, padded

__all__ = ["MemoryPool", "POOL", "FAULT_THREADS"]

#: Threads that fault fresh buffers in at once (:meth:`MemoryPool.make`): page faults of
#: several threads overlap, even on two cores (docs/measurements.md).
FAULT_THREADS = max(1, min(4, len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity")
                           else os.cpu_count() or 1))


class MemoryPool:
    """Buffers kept by NUMA node (None: unbound) and size, at most ``limit_bytes`` in all.

    Parameters
    ----------
    limit_bytes : int
        Bytes kept at most; what would exceed it is let go (returned to the OS).
    """

    def __init__(self, limit_bytes: int) -> None:
        self.limit_bytes = limit_bytes
        self._lock = threading.Lock()
        self._by_size: dict[tuple[int | None, int], list[np.ndarray]] = {}
        self._held = 0
        # buffers faulted in fresh through :meth:`aligned`, and the seconds that took, ever
        self._made = 0
        self._made_s = 0.0

    @property
    def nbytes(self) -> int:
        """Bytes held now."""
        with self._lock:
            return self._held

    def count(self, nbytes: int, node: int | None = None) -> int:
        """How many kept buffers :meth:`take` could give for ``nbytes`` on ``node``."""
        with self._lock:
            sizes = {nbytes, padded(nbytes)}
            return sum(len(self._by_size.get((node, size), ())) for size in sizes)

    def take(self, nbytes: int, node: int | None = None) -> np.ndarray | None:
        """A kept buffer able to hold ``nbytes`` (of that size or of it padded to pages) bound
        to ``node`` (None: unbound), or None."""
        with self._lock:
            for size in (nbytes, padded(nbytes)):
                kept = self._by_size.get((node, size))
                if kept:
                    self._held -= size
                    return kept.pop()
        return None

    def give(self, buffers: list[np.ndarray], node: int | None = None) -> None:
        """Keep ``buffers``, bound to ``node`` (None: unbound), while they fit under the
        limit."""
        with self._lock:
            for buffer in buffers:
                if self._held + buffer.nbytes > self.limit_bytes:
                    break
                self._by_size.setdefault((node, buffer.nbytes), []).append(buffer)
                self._held += buffer.nbytes

    def keep_at_most(self, nbytes: int, count: int, taking: int = 0) -> None:
        """Let kept buffers for states of ``nbytes`` go (of that size or smaller: a codec's
        compressed states) until at most ``count`` states' bytes are left, and beside them
        ``taking`` buffers of a state's size about to be taken (by new Level-1 slots), the
        largest kept first: what a budgeted checkpointer cannot use beside the buffers it holds
        is not to stay resident on its account."""
        size = padded(nbytes)
        room, spare = count * size, taking * size
        let_go = False
        with self._lock:
            for key in sorted((key for key in self._by_size if key[1] <= size),  # every node's
                              key=lambda key: -key[1]):
                kept, extra = self._by_size[key], spare if key[1] == size else 0
                while kept and len(kept) * key[1] > room + extra:
                    self._held -= kept.pop().nbytes
                    let_go = True
                held = len(kept) * key[1]
                taken = min(held, extra)
                spare -= taken
                room -= held - taken
        if let_go:
            trim_heap()  # buffers under a huge page come from the C heap, which keeps them

    def release(self) -> int:
        """Let every kept buffer go, back to the operating system; return the bytes
        released."""
        with self._lock:
            released, self._held = self._held, 0
            self._by_size.clear()
        trim_heap()
        return released

    def aligned(self, nbytes: int, node: int | None = None) -> np.ndarray:
        """A page-aligned, touched buffer of ``padded(nbytes)`` bytes on ``node`` (None:
        unbound): a kept one, else new (its first touch counted in :meth:`faults`)."""
        kept = self.take(padded(nbytes), node)
        if kept is not None:
            return kept
        start = time.perf_counter()
        buffer = aligned_buffer(nbytes, node)
        elapsed = time.perf_counter() - start
        with self._lock:
            self._made += 1
            self._made_s += elapsed
        return buffer

    def make(self, nbytes: int, count: int, node: int | None = None) -> list[np.ndarray]:
        """``count`` page-aligned, touched buffers of ``padded(nbytes)`` bytes on ``node``
        (None: unbound): kept ones first, the rest faulted in on :data:`FAULT_THREADS` threads
        at once where they are of a huge page or more (counted in :meth:`faults` at the wall
        time they took, what the caller waited)."""
        buffers: list[np.ndarray] = []
        while len(buffers) < count and (kept := self.take(padded(nbytes), node)) is not None:
            buffers.append(kept)
        missing = count - len(buffers)
        if missing <= 0:
            return buffers
        start = time.perf_counter()
        # a thread per buffer pays off where faults dominate, in huge-page mappings: below them
        # (the LSTM's 150 KiB states) handing each buffer to a thread costs more than its faults
        threads = min(FAULT_THREADS, missing) if padded(nbytes) >= HUGE_PAGE else 1
        if threads == 1:
            fresh = [aligned_buffer(nbytes, node) for _ in range(missing)]
        else:
            with ThreadPoolExecutor(threads, thread_name_prefix="asyncckpt-fault") as pool:
                fresh = list(pool.map(lambda _: aligned_buffer(nbytes, node), range(missing)))
        elapsed = time.perf_counter() - start
        with self._lock:
            self._made += missing
            self._made_s += elapsed
        return buffers + fresh

    def faults(self) -> tuple[int, float]:
        """Buffers :meth:`aligned` has faulted in fresh so far, and the seconds that took: a run
        tells its own from the difference (every thread's, the I/O threads' included)."""
        with self._lock:
            return self._made, self._made_s


#: The process's pool: half the physical memory at most. Fresh pages cost tens of times what a
#: write into a kept buffer does (docs/measurements.md), so a fresh checkpointer per gradient
#: must find them here.
POOL = MemoryPool(psutil.virtual_memory().total // 2)


def _malloc_trim() -> Any:
    """glibc's ``malloc_trim``, or None (another C library)."""
    try:
        return ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6").malloc_trim
    except (OSError, AttributeError):
        return None


_TRIM = _malloc_trim()


def trim_heap() -> None:
    """Give the C heap's free pages back to the operating system. Buffers under
    :data:`~asyncckpt._memory.buffers.HUGE_PAGE` come from malloc's heap, which keeps freed
    pages resident: without this, 43 to 128 MiB stayed after runs of 400 states of 1 MiB."""
    if _TRIM is not None:
        _TRIM(0)
