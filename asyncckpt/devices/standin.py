"""A CPU stand-in for an accelerator, so the device path runs where there is none (CI).

Its memory is host memory, but its streams are real: each asynchronous stream is a thread that
runs the work queued on it in order, optionally after a random delay per operation, and its
events fire when that thread reaches them. Work the runtime queues is therefore really
concurrent with the caller and with the other streams, and a missing ``wait_event`` or a
buffer reused too early shows up as a wrong state, as it would on a GPU.

Operators that use it queue their work on the current stream with :meth:`StandInDevice.launch`
(as GPU code launches kernels); with ``asynchronous=False`` (the default) the default stream
runs work at once on the caller's thread, so plain numpy code on stand-in arrays is correct.
"""
from __future__ import annotations

import contextlib
import queue
import random
import threading
import time
import weakref
from collections import Counter
from collections.abc import Callable, Iterator, Sequence
from typing import Any

import numpy as np

from .._memory.buffers import aligned_buffer, copy_in, copy_out
from .base import Device, Event, Stream, word_digest

__all__ = ["StandInArray", "StandInDevice", "StandInStream"]


class StandInArray(np.ndarray):
    """A numpy array that lives in a :class:`StandInDevice`'s memory (views keep the device)."""

    owner: "StandInDevice | None"  # not ``device``, which numpy arrays have already

    def __array_finalize__(self, obj: Any) -> None:
        self.owner = getattr(obj, "owner", None)


class StandInStreamError(RuntimeError):
    """Work queued on a stand-in stream failed (as a CUDA error surfaces at a synchronisation)."""


class _StandInEvent(Event):
    def __init__(self, stream: "StandInStream") -> None:
        self._stream = stream
        self._fired = threading.Event()
        self.time = 0.0

    def fire(self) -> None:
        self.time = time.perf_counter()
        self._fired.set()

    def synchronize(self) -> None:
        self._stream.device.count_sync()
        while not self._fired.wait(0.05):  # awake, so that Ctrl-C lands on a stalled stream
            pass
        self._stream.raise_error()

    def query(self) -> bool:
        return self._fired.is_set()


class StandInStream(Stream):
    """A stream of the stand-in: a thread running queued work in order, or (``synchronous``)
    the caller's thread running it at once.

    Parameters
    ----------
    device : StandInDevice
    synchronous : bool
        Run work at once on the caller's thread (the default stream of a synchronous device).
    delay : float
        Sleep a random 0 to ``delay`` seconds before each operation, widening every race.
    seed : int
        Seed of those delays.
    """

    def __init__(self, device: "StandInDevice", *, synchronous: bool = False, delay: float = 0.0,
                 seed: int = 0, name: str = "stream") -> None:
        self.device = device
        self.synchronous = synchronous
        self.error: BaseException | None = None
        self._random = random.Random(seed)
        self._delay = delay
        self._queue: queue.SimpleQueue[Callable[[], object] | None] = queue.SimpleQueue()
        self._thread: threading.Thread | None = None
        if not synchronous:
            self._thread = threading.Thread(target=self._serve, name=f"asyncckpt-standin-{name}",
                                            daemon=True)
            self._thread.start()

    def enqueue(self, work: Callable[[], object]) -> None:
        """Queue ``work`` (run at once on a synchronous stream)."""
        if self._thread is None:
            if self.synchronous:
                work()
                return
            raise StandInStreamError("the stand-in stream is closed")
        self._queue.put(work)

    def _serve(self) -> None:
        while True:
            work = self._queue.get()
            if work is None:
                return
            if self._delay:
                time.sleep(self._random.uniform(0.0, self._delay))
            try:
                work()
            except BaseException as exc:  # noqa: BLE001 - kept, raised at the next sync
                if self.error is None:
                    self.error = exc

    def raise_error(self) -> None:
        if self.error is not None:
            raise StandInStreamError(f"work on a stand-in stream failed: {self.error!r}") \
                from self.error

    def record(self) -> Event:
        event = _StandInEvent(self)
        self.enqueue(event.fire)
        return event

    def wait_event(self, event: Event) -> None:
        assert isinstance(event, _StandInEvent)
        if self.synchronous:
            event.synchronize()  # the default stream is the host: this is a host wait
        else:
            self.enqueue(event._fired.wait)

    def synchronize(self) -> None:
        self.record().synchronize()

    def close(self) -> None:
        if self._thread is not None:
            self._queue.put(None)
            self._thread.join()
            self._thread = None


class StandInDevice(Device):
    """The stand-in device.

    Parameters
    ----------
    asynchronous : bool
        Make the default stream a thread too, as on a GPU: operators must then queue their work
        with :meth:`launch`, and the host reads results only after a synchronisation.
    delay : float
        Each asynchronous stream sleeps a random 0 to ``delay`` seconds before each operation.
    seed : int
        Seed of the streams' delays.

    Attributes
    ----------
    host_syncs : collections.Counter
        Host synchronisations (event or stream ``synchronize``) by the name of the thread that
        waited: what "no host synchronisation per store" is checked on.
    peak_bytes : int
        The most device bytes :meth:`empty` buffers held at once.
    """

    name = "stand-in"

    def __init__(self, *, asynchronous: bool = False, delay: float = 0.0, seed: int = 0) -> None:
        self._lock = threading.Lock()
        self._seed = seed
        self._delay = delay
        self._streams: list[StandInStream] = []
        self.default_stream = self._stream(synchronous=not asynchronous, name="default")
        self._local = threading.local()
        self.host_syncs: Counter[str] = Counter()
        self._allocated = 0
        self.peak_bytes = 0
        self._pinned: dict[int, int] = {}  # address -> bytes of each pinned buffer

    def _stream(self, *, synchronous: bool, name: str) -> StandInStream:
        with self._lock:
            self._seed += 1
            stream = StandInStream(self, synchronous=synchronous, delay=self._delay,
                                   seed=self._seed, name=name)
            if not synchronous:
                self._streams.append(stream)
        return stream

    @property
    def streams(self) -> list[StandInStream]:
        """The asynchronous streams made so far and not yet torn down (a test injects faults
        into them)."""
        with self._lock:
            return list(self._streams)

    def count_sync(self) -> None:
        with self._lock:
            self.host_syncs[threading.current_thread().name] += 1

    # -- arrays ----------------------------------------------------------------------------------

    def array(self, values: Any) -> StandInArray:
        """A stand-in device array holding a copy of ``values`` (for a user's state)."""
        values = np.asarray(values)
        out = np.ndarray.__new__(StandInArray, values.shape, values.dtype)
        out.owner = self
        np.copyto(out, values)
        return out

    def owns(self, array: Any) -> bool:
        return isinstance(array, StandInArray) and array.owner is self

    def empty(self, nbytes: int) -> StandInArray:
        buffer = np.ndarray.__new__(StandInArray, (nbytes,), np.uint8)
        buffer.owner = self
        buffer.fill(0)
        with self._lock:
            self._allocated += nbytes
            self.peak_bytes = max(self.peak_bytes, self._allocated)
        weakref.finalize(buffer, self._freed, nbytes)
        return buffer

    def _freed(self, nbytes: int) -> None:
        with self._lock:
            self._allocated -= nbytes

    def pinned(self, nbytes: int) -> np.ndarray:
        buffer = aligned_buffer(nbytes)[:nbytes]
        address = buffer.ctypes.data
        with self._lock:
            self._pinned[address] = nbytes
        weakref.finalize(buffer.base if buffer.base is not None else buffer,
                         self._unpin, address)
        return buffer

    def _unpin(self, address: int) -> None:
        with self._lock:
            self._pinned.pop(address, None)

    def is_pinned(self, buffer: np.ndarray) -> bool:
        address = buffer.ctypes.data
        with self._lock:
            return any(start <= address < start + size for start, size in self._pinned.items())

    @property
    def allocated_bytes(self) -> int:
        with self._lock:
            return self._allocated

    # -- streams ---------------------------------------------------------------------------------

    def current_stream(self) -> Stream:
        stack = getattr(self._local, "stack", None)
        return stack[-1] if stack else self.default_stream

    def new_stream(self) -> StandInStream:
        return self._stream(synchronous=False, name="copy")

    @contextlib.contextmanager
    def use(self, stream: Stream) -> Iterator[Stream]:
        """Make ``stream`` the calling thread's current stream inside the block."""
        stack = self._local.__dict__.setdefault("stack", [])
        stack.append(stream)
        try:
            yield stream
        finally:
            stack.pop()

    def launch(self, work: Callable[..., object], *args: Any) -> None:
        """Queue ``work(*args)`` on the current stream, as a kernel launch."""
        stream = self.current_stream()
        assert isinstance(stream, StandInStream)
        stream.enqueue(lambda: work(*args))

    def synchronize(self) -> None:
        """Wait for the current stream (as ``cupy.cuda.get_current_stream().synchronize()``)."""
        self.current_stream().synchronize()

    def elapsed(self, start: Event, end: Event) -> float:
        assert isinstance(start, _StandInEvent) and isinstance(end, _StandInEvent)
        return max(0.0, end.time - start.time)

    def close(self) -> None:
        """Stop every asynchronous stream's thread (after its queued work)."""
        with self._lock:
            streams, self._streams = self._streams, []
        for stream in streams:
            stream.close()

    # -- copies ----------------------------------------------------------------------------------

    def gather(self, arrays: Sequence[Any], buffer: Any, stream: Stream) -> None:
        assert isinstance(stream, StandInStream)
        arrays = tuple(arrays)
        stream.enqueue(lambda: copy_out(arrays, buffer))

    def scatter(self, buffer: Any, arrays: Sequence[Any], stream: Stream) -> None:
        assert isinstance(stream, StandInStream)
        arrays = tuple(arrays)
        stream.enqueue(lambda: copy_in(buffer, arrays))

    def to_host(self, buffer: Any, host: np.ndarray, nbytes: int, stream: Stream) -> None:
        assert isinstance(stream, StandInStream)
        stream.enqueue(lambda: np.copyto(host[:nbytes], buffer[:nbytes].view(np.ndarray)))

    def to_device(self, host: np.ndarray, buffer: Any, nbytes: int, stream: Stream) -> None:
        assert isinstance(stream, StandInStream)
        stream.enqueue(lambda: np.copyto(buffer[:nbytes], host[:nbytes]))

    def digest(self, buffer: Any, nbytes: int, scratch: Any, out: np.ndarray,
               stream: Stream) -> None:
        assert isinstance(stream, StandInStream)
        stream.enqueue(lambda: out.__setitem__(0, word_digest(buffer[:nbytes].view(np.ndarray))))
