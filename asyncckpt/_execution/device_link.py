"""Level-1 in a device's memory, Level-2 transfers through page-locked host buffers.

- a store queues a device-to-device copy of the live state into a device staging buffer on the
  compute stream (the stream the step that produced it ran on), records an event, and queues the
  device-to-host copy on a write stream of its own behind that event; the caller never waits.
  The I/O thread waits on the copy's event, then hands the host buffer to Level-2. The
  checksum that guards the state on Level-2 is computed on the device, on the write stream
  (:func:`~asyncckpt.devices.base.word_digest`), and again after each read: a host checksum
  runs at a fraction of the link's speed and would bound the writes (docs/gpu.md).
- a prefetch reads Level-2 into a page-locked buffer on the I/O thread, then copies it to its
  device twin on a read stream, behind the event of the last copy out of that twin. A load
  queues the copy from the twin into the live state on the compute stream.
- operators are timed by events around their calls, read when they have completed, so the
  caller is not held up; each sweep ends with one wait for the compute stream.
"""
from __future__ import annotations

import statistics
import threading
from collections.abc import Sequence
from typing import Any

import numpy as np

from .._memory.buffers import padded
from ..devices import Device, Event, Stream
from ..devices.base import word_digest
from ..stats import Stats
from .timing import CallFit, DeviceTimer

#: Device bytes each staging and prefetch buffer holds beside its state: the word its digest
#: is computed into (a memory budget on a device counts them)
DIGEST_WORD_BYTES = 8

__all__ = ["DeviceLink"]


class DeviceLink:
    """Level-1 in ``device`` memory, Level-2 transfers through page-locked host buffers on
    streams of their own.

    Parameters
    ----------
    device : Device
    """

    def __init__(self, device: Device) -> None:
        self.device: Device | None = device
        self._device = device
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
        return (self._empty(nbytes), self._device.empty(DIGEST_WORD_BYTES),
                self._device.pinned(DIGEST_WORD_BYTES).view(np.uint64))

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

    def timer(self, stats: Stats, fit: CallFit) -> DeviceTimer:
        return DeviceTimer(stats, fit, self._device)

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
