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

__all__ = ["Device", "Event", "Stream"]


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

    def __repr__(self) -> str:
        return f"{type(self).__name__}({self.name!r})"
