"""Level-2 in this process's memory: host DRAM, and page-locked memory for a device."""
from __future__ import annotations

import threading
import time
from typing import Any

import numpy as np
import psutil

from .._memory.buffers import padded
from .._memory.numa import check_node, node_memory, node_of_buffer
from .._memory.pool import POOL
from ..errors import StorageError, StorageFullError, StorageKeyError
from .base import Storage, gib
from .kept import release_ram_files

__all__ = ["HostMemoryStorage", "PinnedMemoryStorage", "release_memory"]


def release_memory() -> int:
    """Return the DRAM that closed :class:`HostMemoryStorage` backends keep for reuse to the
    operating system, and the files closed :class:`FileStorage` backends keep on a RAM-backed
    filesystem; return how many bytes that was."""
    return POOL.release() + release_ram_files()


class HostMemoryStorage(Storage):
    """Level-2 in host DRAM: one touched buffer per stored state, reused.

    ``nbytes_held`` tells how much DRAM it holds, for memory accounting. On ``close`` its buffers
    go to a process-wide pool (half the physical memory at most) that the next
    HostMemoryStorage draws from, so repeated checkpointers do not fault fresh memory in again;
    :func:`~asyncckpt.storage.release_memory` returns them to the operating system.

    Parameters
    ----------
    node : int, optional
        The NUMA node whose memory holds the states (``storage="numa:N"``; docs/numa.md);
        default: wherever the kernel places them.
    """

    holds_process_memory = True
    draws_from_pool = True
    fresh_s = 0.0

    def __init__(self, node: int | None = None) -> None:
        self.node = None if node is None else check_node(node, f"HostMemoryStorage(node={node!r})")
        self._lock = threading.Lock()
        self._stored: dict[int, np.ndarray] = {}
        # freed buffers by their (page-padded) size, for the next state of that size
        self._spare: dict[int, list[np.ndarray]] = {}
        self._closed = False
        self.fresh_s = 0.0  # buffers from the pool or fresh pages: what a kept buffer avoids

    def __repr__(self) -> str:
        node = "" if self.node is None else f"node={self.node}"
        return f"HostMemoryStorage({node})"

    def _fresh(self, nbytes: int) -> np.ndarray:
        start = time.perf_counter()
        buffer = POOL.aligned(nbytes, self.node)  # one a closed backend left, else new
        elapsed = time.perf_counter() - start
        with self._lock:
            self.fresh_s += elapsed
        return buffer

    def get_config(self) -> dict[str, Any] | None:
        """Describe the backend as a plain dict."""
        config: dict[str, Any] = {"name": "HostMemoryStorage"}
        if self.node is not None:
            config["node"] = self.node
        return config

    @property
    def nbytes_held(self) -> int:
        """Bytes of DRAM this backend's buffers occupy (stored and spare; every byte touched)."""
        with self._lock:
            return sum(b.nbytes for b in self._buffers())

    def buffers(self) -> list[np.ndarray]:
        """The buffers this backend holds, stored states first, then spares kept for reuse
        (for checks of where its memory is: pinned, say)."""
        with self._lock:
            return self._buffers()

    def _buffers(self) -> list[np.ndarray]:
        return list(self._stored.values()) + [b for kept in self._spare.values() for b in kept]

    def spares(self, nbytes: int) -> int:
        """Freed buffers kept for the next states of ``nbytes`` bytes (page-padded)."""
        with self._lock:
            return len(self._spare.get(padded(nbytes), ()))

    def shed(self, keep_bytes: int) -> None:
        """Give spare buffers to the process pool until at most ``keep_bytes`` are held."""
        with self._lock:
            held = sum(b.nbytes for b in self._buffers())
            surplus: list[np.ndarray] = []
            for kept in self._spare.values():
                while kept and held > keep_bytes:
                    surplus.append(kept.pop())
                    held -= surplus[-1].nbytes
        self._let_go(surplus)

    def _let_go(self, buffers: list[np.ndarray]) -> None:
        """Hand buffers no longer held to the process pool, for the next that needs one."""
        POOL.give(buffers, self.node)

    def reserve(self, nbytes: int, count: int) -> None:
        """Check that ``count`` states of ``nbytes`` fit in the available memory.

        Nothing is allocated here: buffers are allocated and touched by ``put`` and ``adopt``,
        which run on the I/O thread, so the page faults of fresh memory (an order of magnitude
        slower than copies into touched memory)
        overlap the computation instead of delaying the run's start.
        """
        need = nbytes * count
        free = (psutil.virtual_memory().available if self.node is None
                else node_memory(self.node).available)
        available = free + POOL.nbytes  # the pool's is ours
        if need > available:
            raise StorageFullError(
                f"HostMemoryStorage.reserve: {count} states of {nbytes} bytes need {gib(need)}, "
                f"only {gib(available)} of memory is available"
            )

    def _store(self, call: str, key: int, size: int, kept: np.ndarray | None) -> np.ndarray:
        """Check a store under ``key``, keep ``kept`` as its copy when given, and return a buffer
        of ``size`` bytes (page-padded): a spare one, or fresh memory."""
        with self._lock:
            if self._closed:
                raise StorageError(f"HostMemoryStorage.{call}({key}): the storage is closed")
            if key in self._stored:
                raise StorageKeyError(f"HostMemoryStorage.{call}({key}): key already stored")
            spares = self._spare.get(size)
            spare = spares.pop() if spares else None
            if spare is None:
                # let a spare of another size go (to be freed, not pooled), so that states of
                # many sizes (compressed ones) never leave more buffers than were stored at once
                other = next((kept_ for kept_ in self._spare.values() if kept_), None)
                if other is not None:
                    other.pop()
            if kept is not None:
                self._stored[key] = kept
        return spare if spare is not None else self._fresh(size)

    def put(self, key: int, buf: np.ndarray) -> None:
        target = self._store("put", key, padded(buf.nbytes), None)
        np.copyto(target[: buf.nbytes], buf)
        with self._lock:
            self._stored[key] = target

    def adopt(self, key: int, buffer: np.ndarray, nbytes: int) -> np.ndarray:
        """Keep ``buffer`` itself as the stored copy of ``key`` and return a spare buffer of the
        same size in exchange: in DRAM the staging copy already is the transfer, so handing the
        buffer over saves a second memory copy per store. A state that fills less of the buffer
        than a page-padded copy of it would is copied instead, so that every state is held at
        its own size, and so is a buffer of another NUMA node than this backend's (a Level-1
        bound by ``l1_node``), so that each keeps its memory where it was put."""
        if padded(nbytes) < buffer.nbytes or node_of_buffer(buffer) != self.node:
            self.put(key, buffer[:nbytes])
            return buffer
        return self._store("adopt", key, buffer.nbytes, buffer)

    def get(self, key: int, out: np.ndarray) -> None:
        with self._lock:
            source = self._stored.get(key)
        if source is None:
            raise StorageKeyError(f"HostMemoryStorage.get({key}): key not stored")
        np.copyto(out, source[: out.nbytes])

    def delete(self, key: int) -> None:
        with self._lock:
            buffer = self._stored.pop(key, None)
            if buffer is None:
                raise StorageKeyError(f"HostMemoryStorage.delete({key}): key not stored")
            self._spare.setdefault(buffer.nbytes, []).append(buffer)

    def __contains__(self, key: object) -> bool:
        with self._lock:
            return key in self._stored

    def close(self) -> None:
        with self._lock:
            self._closed = True
            buffers = self._buffers()
            self._stored.clear()
            self._spare.clear()
        self._let_go(buffers)


class PinnedMemoryStorage(HostMemoryStorage):
    """Level-2 in page-locked (pinned) host memory, for states whose Level-1 is a device's: a
    device copies to and from pinned memory by DMA, beside its compute, at the link's full
    bandwidth. Like :class:`HostMemoryStorage` it keeps each state in a buffer of its own
    (adopting the staging buffer the device copied into) and reuses freed ones.

    Parameters
    ----------
    device : asyncckpt.devices.Device, optional
        The device whose page-locked memory to use; default: CUDA device 0 through CuPy.
    """

    def __init__(self, device: Any = None) -> None:
        super().__init__()
        if device is None:
            from ..devices.cuda import CupyDevice

            device = CupyDevice()
        self.device = device

    def __repr__(self) -> str:
        return f"PinnedMemoryStorage({self.device.name})"

    def get_config(self) -> dict[str, Any] | None:
        return None  # its device is a live object, which a plain dict cannot describe

    def _fresh(self, nbytes: int) -> np.ndarray:
        start = time.perf_counter()
        buffer = self.device.pinned(nbytes)
        elapsed = time.perf_counter() - start
        with self._lock:
            self.fresh_s += elapsed
        return buffer

    def _let_go(self, buffers: list[np.ndarray]) -> None:
        """Pinned memory goes back to the device's allocator, not the pool."""

