"""Measurements of the real run's costs: Level-2 transfers through the runtime's own I/O path,
the staging copy, and the forward operator's per-call and per-step costs."""
from __future__ import annotations

import os
import statistics
import time
from collections.abc import Callable
from typing import Any

import numpy as np

from schedules.model import CodecCosts

from .._execution.bounded import BoundedCalls
from .._memory.buffers import aligned_buffer, padded
from .._memory.pool import POOL, trim_heap
from ..errors import CheckpointError, StorageFullError, TransferError
from ..storage import Storage

__all__ = ["measure_level2", "measure_transfer", "measure_codec", "measure_fault",
           "probe_forward", "THREAD_HANDOFF_S"]

#: What waking a worker thread costs the caller (docs/measurements.md).
THREAD_HANDOFF_S = 20e-6


def _random_state(nbytes: int, dtype: Any = np.uint8) -> np.ndarray:
    """A page-aligned buffer (uint8) of ``nbytes``: random values of ``dtype`` (random bytes
    but for floats, whose random bits would be NaNs and infinities: uniform values in [-1, 1)
    instead), made from ``os.urandom`` in chunks of 256 KiB. Not ``numpy.random``: in a
    process that has drawn no random numbers, it imports and faults in 1.7 MiB of code that
    no budget counts."""
    buffer = aligned_buffer(nbytes)
    dtype = np.dtype(dtype)
    floats = dtype.kind == "f" and nbytes % dtype.itemsize == 0
    chunk = 1 << 18  # a multiple of every float's size
    for start in range(0, nbytes, chunk):
        end = min(nbytes, start + chunk)
        if floats:
            bits = np.frombuffer(os.urandom(8 * ((end - start) // dtype.itemsize)), np.uint64)
            values = ((bits >> np.uint64(11)) * 2.0**-52 - 1.0).astype(dtype)
            buffer[start:end] = values.view(np.uint8)
        else:
            buffer[start:end] = np.frombuffer(os.urandom(end - start), np.uint8)
    return buffer[:nbytes]


def measure_codec(codec: Any, nbytes: int, dtype: Any) -> CodecCosts:
    """What ``codec`` costs on one state of ``nbytes`` of random values of ``dtype``, which no
    codec shrinks much: the price of compressing before a run has shown what its states
    are."""
    state = _random_state(nbytes, dtype)
    start = time.perf_counter()
    encoded = codec.encode(state)
    middle = time.perf_counter()
    stored = 1.0
    if encoded is not None:
        codec.decode(np.frombuffer(encoded, np.uint8), state)
        stored = min(1.0, max(len(memoryview(encoded).cast("B")), 1) / nbytes)
    end = time.perf_counter()
    del state, encoded
    # what the codec allocated is freed, but the C heap of this thread (the caller's, which
    # runs no codec after) would keep its pages resident on the budget's account
    trim_heap()
    return CodecCosts(middle - start, end - middle, stored)


#: States a probe of a Level-2 outside the process's memory writes in a row, then reads back: a
#: device throttled with a small burst allowance (a kernel cgroup cap) serves one state at its
#: own speed and a few in a row at the cap (docs/measurements.md).
BURST_STATES = 4


def measure_transfer(storage: Storage, nbytes: int, repeats: int = 3) -> tuple[float, float]:
    """Return the seconds to write one state to ``storage`` and to read it back: in process
    memory the median of ``repeats`` round trips of one state, elsewhere the mean over
    :data:`BURST_STATES` written in a row and read back (as many as fit).

    Uses a page-aligned buffer (of random bytes for a compressing backend, which no codec
    shrinks: it is priced at its worst) and keys no state uses (negative), and deletes them
    after.
    """
    view = (_random_state(nbytes) if storage.compression is not None
            else aligned_buffer(nbytes)[:nbytes])
    free = (key for key in range(-1, -(1 << 62), -1) if key not in storage)
    if not storage.holds_process_memory:
        return _burst(storage, view, [next(free) for _ in range(BURST_STATES)])
    key = next(free)
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


def _burst(storage: Storage, view: np.ndarray, keys: list[int]) -> tuple[float, float]:
    """Mean seconds to write ``view`` under ``keys`` in a row and to read each back; a full
    device ends the row early (but not before its first state)."""
    written: list[int] = []
    try:
        start = time.perf_counter()
        for key in keys:
            try:
                storage.put(key, view)
            except StorageFullError:
                if not written:
                    raise
                break
            written.append(key)
            wrote = time.perf_counter() - start
        start = time.perf_counter()
        for key in written:
            storage.get(key, view)
        read = time.perf_counter() - start
    finally:
        for key in written:
            storage.delete(key)
    return wrote / len(written), read / len(written)


def measure_fault(nbytes: int, least_bytes: int = 32 << 20, most: int | None = None) -> float:
    """Return the seconds to fault in one fresh state buffer of ``nbytes``: the mean over enough
    new buffers to make ``least_bytes`` (64 at most, and at most ``most``: the buffers a
    budget holds), which then go to the process pool for the run to use."""
    count = max(1, min(64, -(-least_bytes // padded(nbytes)), most or 64))
    start = time.perf_counter()
    buffers = [aligned_buffer(nbytes) for _ in range(count)]
    elapsed = time.perf_counter() - start
    POOL.give(buffers)
    return elapsed / count


def probe_forward(fwd_operator: Any, n_timesteps: int,
                  settle: Callable[[], None] | None = None) -> tuple[list[int], list[float]]:
    """Time the forward operator on the opening steps from the live u_0: one step in a call
    twice (the first call may compile or warm caches), then up to 8 in one call, so that its
    per-call cost can be told from its per-step cost. Returns the calls' lengths and seconds;
    the live state is left advanced (the caller restores u_0). ``settle`` waits for work the
    calls queued (on a device), so that each is timed to its end."""
    lengths = [1, 1, min(8, n_timesteps - 2)] if n_timesteps >= 4 else [1]
    seconds, t = [], 0
    if settle is not None:
        settle()
    for length in lengths:
        start = time.perf_counter()
        fwd_operator.apply(t_start=t, t_end=t + length)
        if settle is not None:
            settle()
        seconds.append(time.perf_counter() - start)
        t += length
    return lengths, seconds


def measure_level2(storage: Storage, nbytes: int, link: Any, calls: BoundedCalls
                   ) -> tuple[tuple[float, float], list[tuple[float, float]] | None]:
    """(tw, tr) of one state through Level-2 and, for a tiered Level-2, through each tier,
    fastest first (Level-2's are then the first tier's); a device adds its copies to and from
    page-locked memory (``link``) to every transfer. Each probe is one call through ``calls``
    (within the deadline), timed where it runs."""
    down, up = link.measure(nbytes)
    if storage.tiers is None:
        tw, tr = _probed(storage, nbytes, calls)
        return (tw + down, tr + up), None
    tiers = [(tw + down, tr + up) for tw, tr in (_probed(tier, nbytes, calls)
                                                 for tier in storage.tiers)]
    return tiers[0], tiers


def _probed(storage: Storage, nbytes: int, calls: BoundedCalls) -> tuple[float, float]:
    """:func:`measure_transfer`, its device's failures a :class:`~asyncckpt.TransferError`
    that names the backend (a full device stays a ``StorageFullError``)."""
    try:
        return calls.call(f"the probe of {storage!r}", measure_transfer, storage, nbytes)
    except CheckpointError:
        raise
    except Exception as exc:
        raise TransferError(f"the probe of Level-2 {storage!r} (one state of {nbytes} bytes "
                            f"written and read back before the first run) failed: "
                            f"{exc!r}") from exc
