"""Level-1 buffers: allocated once, page-aligned, touched, reused for the whole run."""
from __future__ import annotations

import mmap
from collections.abc import Sequence

import numpy as np

from ..errors import InvalidValueError
from .numa import bind

__all__ = ["PAGE", "HUGE_PAGE", "SPLIT_COPY_BYTES", "aligned_buffer", "touched", "padded",
           "copy_out", "copy_in", "copy_halves", "copy_pieces", "check_size"]

#: Alignment and size granule of every buffer: what O_DIRECT asks of memory, offsets and lengths.
PAGE = 4096
#: Transparent huge page size: buffers this large come from mappings advised to use them.
HUGE_PAGE = 2 << 20
#: States of this many bytes or more are copied in two halves, one on a helper thread (see
#: :func:`copy_halves`): one core's memory bandwidth bounds a copy, and below this size the
#: handoff to the helper eats the gain (docs/measurements.md).
SPLIT_COPY_BYTES = 4 << 20

#: (destination, source) byte ranges of one copy
Pieces = list[tuple[np.ndarray, np.ndarray]]


def padded(nbytes: int) -> int:
    """Round ``nbytes`` up to whole pages."""
    return -(-nbytes // PAGE) * PAGE


def _advise(mapping: mmap.mmap, offset: int, nbytes: int) -> None:
    """Advise huge pages for the whole huge pages of the buffer at ``offset`` and none for the
    rest of ``mapping``: a tail advised too would be backed by a whole 2 MiB page, more than
    the :func:`padded` bytes every budget charges (a state of 2 MiB + 4 KiB held 4 MiB)."""
    whole = nbytes // HUGE_PAGE * HUGE_PAGE
    for start, length, advice in ((offset, whole, mmap.MADV_HUGEPAGE),
                                  (0, offset, mmap.MADV_NOHUGEPAGE),
                                  (offset + whole, len(mapping) - offset - whole,
                                   mmap.MADV_NOHUGEPAGE)):
        if length:
            try:
                mapping.madvise(advice, start, length)
            except OSError:
                pass  # huge pages disabled: ordinary pages still work


def _mapped(nbytes: int, node: int | None = None) -> np.ndarray:
    """``nbytes`` of untouched anonymous memory on a huge-page boundary, its whole huge pages
    advised to use them (faulting them in runs several times faster than with 4 KiB pages),
    so that the kernel backs exactly ``padded(nbytes)`` bytes of it; with ``node``, bound to
    that NUMA node before any page is touched. Buffers under a huge page start on a page.
    The mapping is unmapped when the array is collected."""
    huge = nbytes >= HUGE_PAGE
    mapping = mmap.mmap(-1, padded(nbytes) + (HUGE_PAGE if huge else 0),
                        flags=mmap.MAP_PRIVATE | mmap.MAP_ANONYMOUS)
    raw = np.frombuffer(mapping, dtype=np.uint8)
    if node is not None:
        bind(raw.ctypes.data, len(mapping), node)
    offset = (-raw.ctypes.data) % HUGE_PAGE if huge else 0
    if hasattr(mmap, "MADV_HUGEPAGE"):
        _advise(mapping, offset, padded(nbytes))
    return raw[offset:offset + nbytes]


def touched(nbytes: int, align: int = 64, node: int | None = None) -> np.ndarray:
    """Return a zero-filled uint8 array of ``nbytes`` starting on an ``align``-byte boundary;
    with ``node``, in pages of that NUMA node (a mapping of its own, whatever its size: heap
    pages are shared with other allocations and cannot be bound).

    Filling touches every page now, so the run never pays for first-touch page faults (fresh
    memory copies an order of magnitude slower than touched memory).
    """
    if node is not None or (nbytes >= HUGE_PAGE and hasattr(mmap, "MADV_HUGEPAGE")):
        buffer = _mapped(nbytes, node)
    else:
        raw = np.empty(nbytes + align, dtype=np.uint8)
        offset = (-raw.ctypes.data) % align
        buffer = raw[offset:offset + nbytes]
    buffer.fill(0)
    return buffer


def aligned_buffer(nbytes: int, node: int | None = None) -> np.ndarray:
    """Return a zero-filled uint8 array of ``padded(nbytes)`` bytes starting on a page boundary
    (what O_DIRECT needs), with ``node`` in pages of that NUMA node."""
    return touched(padded(nbytes), align=PAGE, node=node)


def copy_out(arrays: Sequence[np.ndarray], buffer: np.ndarray) -> None:
    """Copy ``arrays``, one after another, into the front of the byte ``buffer``.

    Non-contiguous arrays are copied element-wise into a contiguous view, so any layout works.
    """
    offset = 0
    for array in arrays:
        # one constructor call makes the view (a third of slicing, view and reshape), and
        # assignment copies with less call overhead than np.copyto: states of small arrays
        # are copied every step
        np.ndarray(array.shape, array.dtype, buffer, offset)[...] = array
        offset += array.nbytes


def copy_in(buffer: np.ndarray, arrays: Sequence[np.ndarray]) -> None:
    """Copy the front of the byte ``buffer`` into ``arrays``, the inverse of :func:`copy_out`."""
    offset = 0
    for array in arrays:
        # np.copyto, not assignment: a subclass's __setitem__ (Devito's Data) must not run
        np.copyto(array, np.ndarray(array.shape, array.dtype, buffer, offset))
        offset += array.nbytes


def _bytes_of(array: np.ndarray) -> np.ndarray:
    """A C-contiguous array's bytes as a plain uint8 array (no subclass code runs)."""
    return np.ndarray((array.nbytes,), np.uint8, array)


def copy_halves(arrays: Sequence[np.ndarray], buffer: np.ndarray,
                out: bool) -> tuple[Pieces, Pieces] | None:
    """The copy :func:`copy_out` (``out``) or :func:`copy_in` would make, as two halves of
    about equal bytes for two threads to copy at once; None where it is not worth splitting
    (under :data:`SPLIT_COPY_BYTES`) or an array is not C-contiguous."""
    total = sum(array.nbytes for array in arrays)
    if total < SPLIT_COPY_BYTES or not all(array.flags.c_contiguous for array in arrays):
        return None
    middle = total // 2 // PAGE * PAGE
    first: Pieces = []
    second: Pieces = []
    offset = 0
    for array in arrays:
        if not array.nbytes:
            continue
        mine = _bytes_of(array)
        theirs = buffer[offset:offset + array.nbytes]
        pair = (theirs, mine) if out else (mine, theirs)
        cut = min(max(middle - offset, 0), array.nbytes)
        if cut:
            first.append((pair[0][:cut], pair[1][:cut]))
        if cut < array.nbytes:
            second.append((pair[0][cut:], pair[1][cut:]))
        offset += array.nbytes
    return first, second


def copy_pieces(pieces: Pieces) -> None:
    """Copy each (destination, source) pair of :func:`copy_halves`."""
    for destination, source in pieces:
        destination[...] = source


def check_size(step: int, stored: int, arrays: Sequence[np.ndarray], where: str) -> None:
    """Raise unless ``arrays``, about to receive u_step from ``where``, hold exactly the
    ``stored`` bytes it was stored with (states may differ in size from step to step)."""
    total = sum(a.nbytes for a in arrays)
    if total != stored:
        raise InvalidValueError(
            f"checkpoint.get_data_location({step}) holds {total} bytes, but u_{step} was stored "
            f"in {where} with {stored} bytes: the arrays for a step must match what was stored "
            "for it")
