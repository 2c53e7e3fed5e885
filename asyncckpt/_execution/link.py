"""The link between Level-1 and the host buffers that Level-2 transfers read and write: the
:class:`Link` protocol, its two implementations (:class:`~.host_link.HostLink`, Level-1 in host
memory; :class:`~.device_link.DeviceLink`, Level-1 in a device's memory) and the choice between
them (:func:`link_for`)."""
from __future__ import annotations

import statistics
import time
from collections.abc import Sequence
from typing import Any, Protocol

import numpy as np

from .._memory.buffers import SPLIT_COPY_BYTES
from ..checkpoint import check_arrays
from ..devices import Device, device_of
from ..errors import InvalidValueError
from ..stats import Stats
from .device_link import DeviceLink
from .host_link import HostLink
from .timing import CallFit, HostTimer

__all__ = ["Link", "HostLink", "DeviceLink", "link_for", "measure_copy"]


class Link(Protocol):
    """How states move between Level-1 and the host buffers of Level-2 transfers, and how the
    operators' calls are timed where Level-1 lives."""

    #: the device Level-1 lives on, or None for host memory
    device: Device | None

    def adapt(self, arrays: Sequence[Any]) -> list[Any]:
        """The live arrays as the link copies them."""

    def slot(self, nbytes: int) -> Any:
        """A Level-1 slot for a state of at most ``nbytes`` bytes."""

    def slots(self, nbytes: int, count: int) -> list[Any]:
        """``count`` Level-1 slots at once."""

    def release(self, buffers: list[Any]) -> None:
        """Let slots and engine buffers go."""

    def staging_buffer(self, nbytes: int) -> np.ndarray:
        """A host buffer a Level-2 write is staged in."""

    def prefetch_buffer(self, nbytes: int) -> np.ndarray:
        """A host buffer a Level-2 read lands in."""

    def copy_out(self, arrays: Sequence[Any], slot: Any) -> None:
        """Copy the live ``arrays`` into a Level-1 ``slot``."""

    def copy_in(self, slot: Any, arrays: Sequence[Any]) -> None:
        """Copy a Level-1 ``slot`` into the live ``arrays``."""

    def checksum(self, view: np.ndarray) -> int:
        """The checksum of a state in a host buffer, as the link's digests compute it."""

    def send(self, arrays: Sequence[Any], host: np.ndarray, nbytes: int, digest: bool) -> Any:
        """Start moving the live ``arrays`` into the staging buffer ``host``; return what
        :meth:`sent` waits on."""

    def sent(self, ticket: Any) -> tuple[float, int | None]:
        """On the I/O thread: wait until the staging buffer holds the state; the link's seconds
        and the checksum it computed (None: the caller computes it)."""

    def receive(self, host: np.ndarray, nbytes: int, digest: bool) -> tuple[float, int | None]:
        """On the I/O thread, after a Level-2 read into ``host``: make it ready to deliver."""

    def deliver(self, host: np.ndarray, arrays: Sequence[Any]) -> None:
        """Copy a received prefetch buffer into the live ``arrays``."""

    def keep(self, arrays: Sequence[Any], host: np.ndarray) -> None:
        """Put the live ``arrays`` where :meth:`deliver` takes them from."""

    def timer(self, stats: Stats, fit: CallFit) -> HostTimer:
        """What times the operators' calls during one sweep."""

    def settle(self) -> None:
        """Wait until the live state is what the calls so far made it."""

    def measure(self, nbytes: int) -> tuple[float, float]:
        """Seconds the link adds to a Level-2 write and a read of ``nbytes``."""

    @property
    def device_bytes(self) -> int:
        """Device memory held by the run's buffers."""

    def close(self) -> None:
        """Release what the link holds of its own (threads, streams)."""


def measure_copy(link: Link, arrays: Sequence[Any], targets: Sequence[Any],
                 repeats: int = 3) -> float:
    """Median seconds of one copy of ``arrays`` (a state) into a Level-1 buffer through
    ``link``: into each of ``targets`` in turn, so that several targets measure it cache-cold."""
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        for target in targets:
            link.copy_out(arrays, target)
        link.settle()
        times.append((time.perf_counter() - start) / len(targets))
    return statistics.median(times)


def link_for(checkpoint: Any, nbytes: int, dtype: np.dtype, transfers: str,
             node: int | None = None) -> tuple[Link, list[Any], str]:
    """The link of a checkpointer whose state u_0 is ``checkpoint.get_data(0)``: a
    :class:`DeviceLink` where its arrays are on a device, else a :class:`HostLink`; with
    u_0's arrays, checked against ``nbytes`` and ``dtype``, and where Level-2 transfers run (on
    a device always in the background: inline, the caller would wait for every copy). u_0 may
    be smaller than ``nbytes``: states may differ in size, the descriptor's being the
    largest. u_0's locations (``get_data_location(0)``) are checked too, unless the descriptor's
    ``locations_checked_in_run`` says to ask for none ahead of a load (pyrevolve's Revolver
    asks as pyrevolve does): then at their first load. ``node``: the NUMA node host buffers are
    bound to (``l1_node``; Level-1 on a device refuses one)."""
    first = checkpoint.get_data(0)
    device = device_of(first) if isinstance(first, (list, tuple)) else None
    if device is not None:
        if node is not None:
            raise InvalidValueError(
                f"l1_node={node} binds host memory to a NUMA node, but Level-1 is on "
                f"{device.name}; leave l1_node out, or give 'numa:{node}' as Level-2")
        first = device.adapt(first)
        if transfers == "inline":
            raise InvalidValueError(
                f"transfers='inline' would make the caller wait for every device copy; "
                f"states on {device.name} use 'background' (or 'auto')")
        transfers = "background"
    first = check_arrays(first, nbytes, dtype, "checkpoint.get_data(0)", exact=False,
                         device=device)
    if not getattr(checkpoint, "locations_checked_in_run", False):
        # where u_0 is restored into, checked now: not first when a state is written back
        locations = checkpoint.get_data_location(0)
        if device is not None and isinstance(locations, (list, tuple)):
            locations = device.adapt(locations)
        check_arrays(locations, nbytes, dtype, "checkpoint.get_data_location(0)",
                     exact=False, device=device)
    # a run of small states never asks whether to split a copy
    link: Link = (HostLink(split_copies=nbytes >= SPLIT_COPY_BYTES, node=node)
                  if device is None else DeviceLink(device))
    return link, first, transfers
