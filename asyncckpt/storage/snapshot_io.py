"""A run directory's snapshots moved between a file and the program's own arrays in chunks, the
checksum taken over the same chunks: no copy of a snapshot is ever made in process memory.

A C-contiguous array is written from, and read into, its own bytes; any other layout moves
through one buffer of :data:`CHUNK` bytes at most, a piece of its leading axes at a time, in the
order :func:`~asyncckpt._memory.buffers.copy_out` lays it out (C order, one array after
another).
"""
from __future__ import annotations

import os
from collections.abc import Iterator, Sequence

import numpy as np
import xxhash

__all__ = ["CHUNK", "check_file", "read_into", "write_from"]

#: Bytes moved by one system call, and the most a non-contiguous array's piece copies
CHUNK = 1 << 20


def _leaves(array: np.ndarray) -> Iterator[np.ndarray]:
    """``array`` in C order as pieces that are C-contiguous or of :data:`CHUNK` bytes at most
    (a piece of its leading axis, or one index of it, recursively)."""
    if array.flags.c_contiguous or array.nbytes <= CHUNK or array.ndim == 0:
        yield array
        return
    rows = array.shape[0]
    per_row = array.nbytes // max(rows, 1)
    if per_row > CHUNK:
        for row in range(rows):
            yield from _leaves(array[row])
        return
    step = max(1, CHUNK // max(per_row, 1))
    for start in range(0, rows, step):
        yield array[start:start + step]


def _byte_view(array: np.ndarray) -> np.ndarray:
    """A C-contiguous array's bytes as a plain uint8 array sharing its memory (no subclass's
    code runs)."""
    return np.ndarray((array.nbytes,), np.uint8, array)


def _spans(view: np.ndarray) -> Iterator[memoryview]:
    for start in range(0, view.nbytes, CHUNK):
        yield view[start:start + CHUNK].data.cast("B")


def write_from(fd: int | None, arrays: Sequence[np.ndarray]) -> tuple[int, int]:
    """Write the bytes of ``arrays``, one after another, to ``fd`` (no flush; None: only
    hash them); their size and checksum (xxh3, as a one-shot hash of the same bytes gives)."""
    hasher, size = xxhash.xxh3_64(), 0
    for array in arrays:
        array = np.asarray(array)
        for leaf in _leaves(array):
            view = _byte_view(leaf if leaf.flags.c_contiguous else np.ascontiguousarray(leaf))
            for span in _spans(view):
                hasher.update(span)
                while fd is not None and span.nbytes:
                    span = span[os.write(fd, span):]
            size += leaf.nbytes
    return size, hasher.intdigest()


def _read_exactly(fd: int, span: memoryview) -> int:
    """Fill ``span`` from ``fd``; the bytes read (fewer at the end of the file)."""
    got = 0
    while got < span.nbytes:
        count = os.readv(fd, [span[got:]])
        if count == 0:
            break
        got += count
    return got


def check_file(fd: int) -> tuple[int, int]:
    """The size and checksum of what ``fd`` holds from its offset on, read in chunks into one
    buffer."""
    hasher, size = xxhash.xxh3_64(), 0
    buffer = memoryview(bytearray(CHUNK))
    while True:
        got = _read_exactly(fd, buffer)
        hasher.update(buffer[:got])
        size += got
        if got < CHUNK:
            return size, hasher.intdigest()


def read_into(fd: int, arrays: Sequence[np.ndarray]) -> tuple[int, int]:
    """Read ``fd`` from its offset on into ``arrays``, one after another; the bytes read into
    them and their checksum (a file cut short leaves the rest of the arrays as they were)."""
    hasher, size = xxhash.xxh3_64(), 0
    for array in arrays:
        for leaf in _leaves(array):
            target = leaf if leaf.flags.c_contiguous else np.empty(leaf.shape, leaf.dtype)
            view = _byte_view(target)
            for span in _spans(view):
                got = _read_exactly(fd, span)
                hasher.update(span[:got])
                size += got
                if got < span.nbytes:
                    return size, hasher.intdigest()
            if target is not leaf:
                np.copyto(leaf, target)
    return size, hasher.intdigest()
