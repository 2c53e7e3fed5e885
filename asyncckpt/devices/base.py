"""What the runtime needs of an accelerator: device memory, page-locked host memory, copies
queued on streams, and events that order streams and time them.

The engine speaks only to :class:`Device`, so the same ordering logic drives CuPy on a GPU
(:class:`~asyncckpt.devices.CupyDevice`) and the CPU stand-in that CI runs
(:class:`~asyncckpt.devices.StandInDevice`).
"""
from __future__ import annotations

import abc
from collections.abc import Sequence
from typing import Any

import numpy as np

__all__ = ["Device", "Event", "Stream", "word_digest"]

_DIGEST_CHUNK = 1 << 20  # words per step of the host version, bounding its temporaries


def _mix(z: np.ndarray) -> np.ndarray:
    """splitmix64's finaliser, over uint64 arrays (wrapping)."""
    z = (z ^ (z >> np.uint64(30))) * np.uint64(0xBF58476D1CE4E5B9)
    z = (z ^ (z >> np.uint64(27))) * np.uint64(0x94D049BB133111EB)
    return z ^ (z >> np.uint64(31))


def word_digest(view: np.ndarray) -> int:
    """The checksum a :class:`Device` computes of a state in its memory, here on the host.

    The bytes are read as little-endian 32-bit words ``w_i`` (the last one padded with zero
    bytes); the digest is the sum, modulo 2**64, of ``mix((i << 32) ^ w_i)`` with splitmix64's
    finaliser as ``mix``. A sum is independent of the order its terms are added in, so a device
    computes it with atomic adds across thousands of threads and still gets this exact value,
    while each term depends on both a word and its place: flipped bits, zeroed pages and moved
    words all change it.
    """
    data = np.ascontiguousarray(view).view(np.uint8).reshape(-1)
    tail = (-data.size) % 4
    if tail:
        data = np.concatenate([data, np.zeros(tail, np.uint8)])
    words = data.view("<u4")
    total = 0
    for start in range(0, words.size, _DIGEST_CHUNK):
        chunk = words[start:start + _DIGEST_CHUNK].astype(np.uint64)
        index = np.arange(start, start + chunk.size, dtype=np.uint64)
        total += int(_mix((index << np.uint64(32)) ^ chunk).sum(dtype=np.uint64))
    return total % 2**64


class Event(abc.ABC):
    """A point in a stream's queue of work."""

    @abc.abstractmethod
    def synchronize(self) -> None:
        """Block the calling thread until the work before this point has run."""

    @abc.abstractmethod
    def query(self) -> bool:
        """Whether the work before this point has run, without waiting."""


class Stream(abc.ABC):
    """A queue of device work that runs in order, asynchronously to the host."""

    @abc.abstractmethod
    def record(self) -> Event:
        """A new event at the end of this stream's queue."""

    @abc.abstractmethod
    def wait_event(self, event: Event) -> None:
        """Make this stream's later work wait for ``event`` (the host does not wait)."""

    @abc.abstractmethod
    def synchronize(self) -> None:
        """Block the calling thread until this stream's queue has run."""

    def close(self) -> None:
        """Release the stream (after its queued work)."""


class Device(abc.ABC):
    """An accelerator whose memory is Level-1 and whose host's page-locked memory is Level-2.

    Buffers are one-dimensional ``uint8`` arrays: device buffers of the device's array type,
    host buffers numpy arrays. Every copy is queued on a stream and returns at once.
    """

    #: A short name for messages and ``stats``: "cuda:0", "stand-in".
    name: str

    # -- arrays ----------------------------------------------------------------------------------

    @abc.abstractmethod
    def owns(self, array: Any) -> bool:
        """Whether ``array`` lives in this device's memory (after :meth:`adapt`)."""

    def adapt(self, arrays: Sequence[Any]) -> list[Any]:
        """The descriptor's arrays as this device's array type (torch tensors through DLPack,
        sharing memory); others are returned as they are, for the caller to check."""
        return list(arrays)

    @abc.abstractmethod
    def empty(self, nbytes: int) -> Any:
        """A device buffer of ``nbytes`` bytes, allocated now."""

    @abc.abstractmethod
    def pinned(self, nbytes: int) -> np.ndarray:
        """A page-aligned, page-locked host buffer of ``nbytes`` bytes."""

    def is_pinned(self, buffer: np.ndarray) -> bool:  # pragma: no cover - informative only
        """Whether ``buffer`` (or the memory it views) came from :meth:`pinned`."""
        return False

    # -- streams and events ----------------------------------------------------------------------

    @abc.abstractmethod
    def current_stream(self) -> Stream:
        """The stream the user's operators queue their work on now."""

    @abc.abstractmethod
    def new_stream(self) -> Stream:
        """A stream of the runtime's own, for transfers beside the compute."""

    @abc.abstractmethod
    def elapsed(self, start: Event, end: Event) -> float:
        """Seconds between two completed events."""

    # -- copies, each queued on ``stream`` -------------------------------------------------------

    @abc.abstractmethod
    def gather(self, arrays: Sequence[Any], buffer: Any, stream: Stream) -> None:
        """Copy ``arrays``, one after another, into the front of the device ``buffer``."""

    @abc.abstractmethod
    def scatter(self, buffer: Any, arrays: Sequence[Any], stream: Stream) -> None:
        """Copy the front of the device ``buffer`` into ``arrays``: the inverse of
        :meth:`gather`."""

    @abc.abstractmethod
    def to_host(self, buffer: Any, host: np.ndarray, nbytes: int, stream: Stream) -> None:
        """Copy the first ``nbytes`` of the device ``buffer`` into the host buffer."""

    @abc.abstractmethod
    def to_device(self, host: np.ndarray, buffer: Any, nbytes: int, stream: Stream) -> None:
        """Copy the first ``nbytes`` of the host buffer into the device ``buffer``."""

    def warm_up(self) -> None:
        """Build what the device's copies and digests need (kernels compiled at run time), so
        that the first store of a run does not pay for it."""

    @abc.abstractmethod
    def digest(self, buffer: Any, nbytes: int, scratch: Any, out: np.ndarray,
               stream: Stream) -> None:
        """Queue the :func:`word_digest` of the first ``nbytes`` of the device ``buffer``,
        summed on the device into ``scratch`` (a device buffer of 8 bytes) and copied into
        ``out`` (a page-locked ``uint64`` host array of one element) when ``stream`` gets there:
        states are checked where they live, and the host never reads them whole."""

    def __repr__(self) -> str:
        return f"{type(self).__name__}({self.name!r})"
