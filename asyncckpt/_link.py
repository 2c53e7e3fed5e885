"""The link between Level-1 and the host buffers that Level-2 transfers read and write.

On the host (:class:`HostLink`) Level-1 is host memory: a store is one memcpy into a staging
buffer on the caller's thread, a load one memcpy out of a prefetch buffer, and operators are
timed by the clock. On a device (:class:`DeviceLink`) Level-1 slots, staging and prefetch
buffers live in device memory and the host buffers are page-locked:

- a store queues a device-to-device copy of the live state into a device staging buffer on the
  compute stream (the stream the step that produced it ran on), records an event, and queues the
  device-to-host copy on a write stream of its own behind that event; the caller never waits.
  The I/O thread waits on the copy's event, then hands the host buffer to Level-2. The
  checksum that guards the state on Level-2 is computed on the device, on the write stream
  (:func:`~asyncckpt.devices.base.word_digest`), and again after each read: a host checksum of
  64 MiB states ran at 7 GB/s on an H100's host, a seventh of the link, and bounded the writes.
- a prefetch reads Level-2 into a page-locked buffer on the I/O thread, then copies it to its
  device twin on a read stream, behind the event of the last copy out of that twin. A load
  queues the copy from the twin into the live state on the compute stream.
- operators are timed by events around their calls, read when they have completed, so the
  caller is not held up; each sweep ends with one wait for the compute stream.
"""
from __future__ import annotations

import statistics
import threading
import time
from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import numpy as np
import xxhash

from ._buffers import SPLIT_COPY_BYTES, copy_halves, copy_in, copy_out, copy_pieces, padded
from ._pool import POOL
from ._tuning import CallFit
from .checkpoint import check_arrays
from .devices import Device, Event, Stream, device_of
from .errors import InvalidValueError
from .devices.base import word_digest
from .stats import Stats

__all__ = ["HostLink", "DeviceLink", "link_for"]


class _HostTimer:
    """Times operator calls by the clock, at once."""

    __slots__ = ("stats", "fit")

    def __init__(self, stats: Stats, fit: CallFit) -> None:
        self.stats, self.fit = stats, fit

    @staticmethod
    def begin() -> Any:
        return time.perf_counter()

    def end(self, mark: Any, steps: int, start: int | None = None) -> None:
        """A forward call of ``steps`` steps from u_``start`` (0 steps: a reverse step) that
        began at ``mark``."""
        self.add(time.perf_counter() - mark, steps, start)

    def add(self, elapsed: float, steps: int, start: int | None = None) -> None:
        if steps:
            self.stats.forward_compute_s += elapsed
            self.fit.add(steps, elapsed, start)
        else:
            self.stats.reverse_compute_s += elapsed

    def settle(self) -> None:
        """Nothing is pending on the host."""


class _DeviceTimer(_HostTimer):
    """Times operator calls by events on the compute stream, counted once they have run."""

    __slots__ = ("device", "_pending")

    def __init__(self, stats: Stats, fit: CallFit, device: Device) -> None:
        super().__init__(stats, fit)
        self.device = device
        self._pending: list[tuple[Event, Event, int, int | None]] = []

    def begin(self) -> Any:  # type: ignore[override]
        return self.device.current_stream().record()

    def end(self, mark: Any, steps: int, start: int | None = None) -> None:
        self._pending.append((mark, self.device.current_stream().record(), steps, start))
        self._count(wait=False)

    def _count(self, wait: bool) -> None:
        if wait:  # one wait: the stream runs in order, so the last event is the last to fire
            self._pending[-1][1].synchronize()
        done = 0
        for begun, end, steps, start in self._pending:
            if not wait and not end.query():
                break
            self.add(self.device.elapsed(begun, end), steps, start)
            done += 1
        del self._pending[:done]

    def settle(self) -> None:
        """Wait for the compute stream and count every call (the end of a sweep)."""
        if self._pending:
            self._count(wait=True)
        else:
            self.device.current_stream().synchronize()


class HostLink:
    """Level-1 in host memory.

    Parameters
    ----------
    split_copies : bool
        Copy states of :data:`~asyncckpt._buffers.SPLIT_COPY_BYTES` or more in two halves, one
        on a helper thread of the link's own (ended by :meth:`close`): a copy of a state is
        bound by one core's memory bandwidth, and the caller waits for every one.
    """

    device: Device | None = None
    _split_copies = False
    _helper: ThreadPoolExecutor | None = None

    def __init__(self, *, split_copies: bool = False) -> None:
        self._split_copies = split_copies

    def adapt(self, arrays: Sequence[Any]) -> list[Any]:
        return list(arrays)

    def slot(self, nbytes: int) -> Any:
        """A Level-1 slot for a state of at most ``nbytes`` bytes."""
        return POOL.aligned(nbytes)

    def slots(self, nbytes: int, count: int) -> list[Any]:
        """``count`` Level-1 slots at once, the fresh ones faulted in on several threads."""
        return POOL.make(nbytes, count)

    def release(self, buffers: list[Any]) -> None:
        """Let slots and engine buffers go (to the process's pool, for the next checkpointer)."""
        POOL.give(buffers)

    def staging_buffer(self, nbytes: int) -> np.ndarray:
        """A host buffer a Level-2 write is staged in."""
        return POOL.aligned(nbytes)

    prefetch_buffer = staging_buffer

    def copy_out(self, arrays: Sequence[Any], slot: Any) -> None:
        """Copy the live ``arrays`` into a Level-1 ``slot``."""
        if not self._copy_split(arrays, slot, out=True):
            copy_out(arrays, slot)

    def copy_in(self, slot: Any, arrays: Sequence[Any]) -> None:
        """Copy a Level-1 ``slot`` into the live ``arrays``."""
        if not self._copy_split(arrays, slot, out=False):
            copy_in(slot, arrays)

    def _copy_split(self, arrays: Sequence[Any], buffer: np.ndarray, out: bool) -> bool:
        """Copy half of a large state on the helper thread, the other half here; False where
        the state is not split (see :func:`~asyncckpt._buffers.copy_halves`)."""
        halves = copy_halves(arrays, buffer, out) if self._split_copies else None
        if halves is None:
            return False
        if self._helper is None:
            self._helper = ThreadPoolExecutor(1, thread_name_prefix="asyncckpt-copy")
        theirs = self._helper.submit(copy_pieces, halves[1])
        try:
            copy_pieces(halves[0])
        finally:
            theirs.result()
        return True

    @staticmethod
    def checksum(view: np.ndarray) -> int:
        """The checksum of a state in a host buffer, as this link's digests compute it."""
        # xxh3 runs at ~27 GB/s here, beside 12 GB/s for the copy it guards
        return xxhash.xxh3_64_intdigest(view.data)

    def send(self, arrays: Sequence[Any], host: np.ndarray, nbytes: int, digest: bool) -> Any:
        """Start moving the live ``arrays`` (``nbytes``) into the staging buffer ``host``, with
        their checksum where the link computes it (``digest``); return what :meth:`sent` waits
        on."""
        self.copy_out(arrays, host)
        return None

    def sent(self, ticket: Any) -> tuple[float, int | None]:
        """On the I/O thread: wait until ``host`` holds the state; return the link's seconds
        and the checksum it computed (None: the caller computes :meth:`checksum` of ``host``)."""
        return 0.0, None

    def receive(self, host: np.ndarray, nbytes: int, digest: bool) -> tuple[float, int | None]:
        """On the I/O thread, after a Level-2 read into the prefetch buffer ``host``: make it
        ready for :meth:`deliver`; return the link's seconds and, with ``digest``, the checksum
        of the state where it arrived (None: the caller checks ``host``)."""
        return 0.0, None

    def deliver(self, host: np.ndarray, arrays: Sequence[Any]) -> None:
        """Copy a received prefetch buffer into the live ``arrays``."""
        self.copy_in(host, arrays)

    def keep(self, arrays: Sequence[Any], host: np.ndarray) -> None:
        """Put the live ``arrays`` where :meth:`deliver` takes them from (a recomputed state)."""
        self.copy_out(arrays, host)

    def timer(self, stats: Stats, fit: CallFit) -> _HostTimer:
        """What times the operators' calls during one sweep."""
        return _HostTimer(stats, fit)

    def settle(self) -> None:
        """Wait until the live state is what the calls so far made it."""

    def measure_copy(self, arrays: Sequence[Any], targets: Sequence[Any],
                     repeats: int = 3) -> float:
        """Median seconds of one copy of ``arrays`` (a state) into a Level-1 buffer: into each
        of ``targets`` in turn, so that several targets measure it cache-cold."""
        times = []
        for _ in range(repeats):
            start = time.perf_counter()
            for target in targets:
                self.copy_out(arrays, target)
            self.settle()
            times.append((time.perf_counter() - start) / len(targets))
        return statistics.median(times)

    def measure(self, nbytes: int) -> tuple[float, float]:
        """Seconds the link adds to a Level-2 write and a read of ``nbytes`` (host: none)."""
        return 0.0, 0.0

    @property
    def device_bytes(self) -> int:
        """Device memory held by the run's buffers."""
        return 0

    def close(self) -> None:
        """End the helper thread of split copies, if one was started."""
        helper, self._helper = self._helper, None
        if helper is not None:
            helper.shutdown(wait=True)



class DeviceLink(HostLink):
    """Level-1 in ``device`` memory, Level-2 transfers through page-locked host buffers on
    streams of their own.

    Parameters
    ----------
    device : Device
    """

    def __init__(self, device: Device) -> None:
        self.device = self._device = device
        device.warm_up()
        self._write_stream = device.new_stream()
        self._read_stream = device.new_stream()
        self._lock = threading.Lock()
        # free device staging buffers, each with a device and a page-locked word for its digest
        self._staging: list[tuple[Any, Any, np.ndarray]] = []
        # id(prefetch host buffer) -> its device twin and digest words
        self._twins: dict[int, tuple[Any, Any, np.ndarray]] = {}
        self._consumed: dict[int, Event] = {}  # id(prefetch host buffer) -> last copy out
        self._device_bytes = 0

    def __repr__(self) -> str:
        return f"DeviceLink({self._device!r})"

    def adapt(self, arrays: Sequence[Any]) -> list[Any]:
        return self._device.adapt(arrays)

    def _empty(self, nbytes: int) -> Any:
        buffer = self._device.empty(padded(nbytes))
        with self._lock:
            self._device_bytes += buffer.nbytes
        return buffer

    def slot(self, nbytes: int) -> Any:
        return self._empty(nbytes)

    def slots(self, nbytes: int, count: int) -> list[Any]:
        return [self._empty(nbytes) for _ in range(count)]

    def release(self, buffers: list[Any]) -> None:
        freed = sum(b.nbytes for b in buffers if self._device.owns(b))
        with self._lock:
            self._device_bytes -= freed

    def _checked(self, nbytes: int) -> tuple[Any, Any, np.ndarray]:
        """A device buffer, with the device word and page-locked host word of its digest."""
        return self._empty(nbytes), self._device.empty(8), self._device.pinned(8).view(np.uint64)

    checksum = staticmethod(word_digest)

    def staging_buffer(self, nbytes: int) -> np.ndarray:
        staging = self._checked(nbytes)
        with self._lock:
            self._staging.append(staging)
        return self._device.pinned(padded(nbytes))

    def prefetch_buffer(self, nbytes: int) -> np.ndarray:
        host = self._device.pinned(padded(nbytes))
        self._twins[id(host)] = self._checked(nbytes)
        return host

    def copy_out(self, arrays: Sequence[Any], slot: Any) -> None:
        self._device.gather(arrays, slot, self._device.current_stream())

    def copy_in(self, slot: Any, arrays: Sequence[Any]) -> None:
        self._device.scatter(slot, arrays, self._device.current_stream())

    def send(self, arrays: Sequence[Any], host: np.ndarray, nbytes: int, digest: bool) -> Any:
        compute = self._device.current_stream()
        with self._lock:
            staging = self._staging.pop()  # as many as host staging buffers: one is free
        buffer, scratch, word = staging
        self._device.gather(arrays, buffer, compute)
        produced = compute.record()
        stream = self._write_stream
        stream.wait_event(produced)
        start = stream.record()
        self._device.to_host(buffer, host, nbytes, stream)
        if digest:
            self._device.digest(buffer, nbytes, scratch, word, stream)
        return staging, digest, start, stream.record()

    def sent(self, ticket: Any) -> tuple[float, int | None]:
        staging, digest, start, done = ticket
        try:
            done.synchronize()
            value = int(staging[2][0]) if digest else None
        finally:
            with self._lock:
                self._staging.append(staging)
        return self._device.elapsed(start, done), value

    def receive(self, host: np.ndarray, nbytes: int, digest: bool) -> tuple[float, int | None]:
        stream = self._read_stream
        consumed = self._consumed.pop(id(host), None)
        if consumed is not None:  # the compute stream may still be copying out of the twin
            stream.wait_event(consumed)
        twin, scratch, word = self._twins[id(host)]
        start = stream.record()
        self._device.to_device(host, twin, nbytes, stream)
        if digest:
            self._device.digest(twin, nbytes, scratch, word, stream)
        done = stream.record()
        done.synchronize()
        return self._device.elapsed(start, done), int(word[0]) if digest else None

    def deliver(self, host: np.ndarray, arrays: Sequence[Any]) -> None:
        compute = self._device.current_stream()
        self._device.scatter(self._twins[id(host)][0], arrays, compute)
        self._consumed[id(host)] = compute.record()

    def keep(self, arrays: Sequence[Any], host: np.ndarray) -> None:
        compute = self._device.current_stream()
        self._device.gather(arrays, self._twins[id(host)][0], compute)
        self._consumed[id(host)] = compute.record()

    def timer(self, stats: Stats, fit: CallFit) -> _HostTimer:
        return _DeviceTimer(stats, fit, self._device)

    def settle(self) -> None:
        self._device.current_stream().synchronize()

    def measure(self, nbytes: int, repeats: int = 3) -> tuple[float, float]:
        """Median seconds of a device-to-host and a host-to-device copy of ``nbytes`` between
        device memory and page-locked host memory, on the link's own streams."""
        device = self._device
        buffer, host = device.empty(padded(nbytes)), device.pinned(padded(nbytes))

        def timed(stream: Stream, copy: Any, *args: Any) -> float:
            start = stream.record()
            copy(*args, nbytes, stream)
            end = stream.record()
            end.synchronize()
            return device.elapsed(start, end)

        down = [timed(self._write_stream, device.to_host, buffer, host) for _ in range(repeats)]
        up = [timed(self._read_stream, device.to_device, host, buffer) for _ in range(repeats)]
        return statistics.median(down), statistics.median(up)

    @property
    def device_bytes(self) -> int:
        with self._lock:
            return self._device_bytes

    def close(self) -> None:
        """Release the link's streams (after their queued work) and the engine's device
        buffers."""
        self._write_stream.close()
        self._read_stream.close()
        with self._lock:
            held = self._staging + list(self._twins.values())
            self._device_bytes -= sum(buffer.nbytes for buffer, _, _ in held)
            self._staging, self._twins = [], {}
            self._consumed.clear()


def link_for(checkpoint: Any, nbytes: int, dtype: np.dtype,
             transfers: str) -> tuple[HostLink, list[Any], str]:
    """The link of a checkpointer whose state u_0 is ``checkpoint.get_data(0)``: a
    :class:`DeviceLink` where its arrays are on a device, else a :class:`HostLink`; with
    u_0's arrays, checked against ``nbytes`` and ``dtype``, and where Level-2 transfers run (on
    a device always in the background: inline, the caller would wait for every copy). u_0 may
    be smaller than ``nbytes``: states may differ in size, the descriptor's being the
    largest."""
    first = checkpoint.get_data(0)
    device = device_of(first) if isinstance(first, (list, tuple)) else None
    if device is not None:
        first = device.adapt(first)
        if transfers == "inline":
            raise InvalidValueError(
                f"transfers='inline' would make the caller wait for every device copy; "
                f"states on {device.name} use 'background' (or 'auto')")
        transfers = "background"
    first = check_arrays(first, nbytes, dtype, "checkpoint.get_data(0)", exact=False,
                         device=device)
    # a run of small states never asks whether to split a copy
    link = (HostLink(split_copies=nbytes >= SPLIT_COPY_BYTES) if device is None
            else DeviceLink(device))
    return link, first, transfers
