"""What crosses a host callback of a checkpointed scan: one array of 32-bit words.

JAX places each of a callback's arguments on the host device one by one before the callback
runs, which costs some 25 us an argument on a CPU whatever its size (an ``io_callback`` of one
8-byte array 42 us, of two 65 us, of four 104 us, against 11 us with none). So the carry and
the ids the host needs (the run's key, the segment) travel as the words of one array: the
forward sweep's callback takes one argument where it took two ids and a leaf each. Words, not
bytes: a 64 KiB argument of uint8 cost 125 to 230 us, of uint32 52 to 56 us, of float64 53 to 71.
"""
from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import jax.numpy as jnp
import numpy as np
from jax import lax

__all__ = ["HEADER_WORDS", "ids", "leaf_bytes", "pack", "shared_dtype", "unpack"]

#: The run's key and the segment, two int32s, ahead of the carry's words.
HEADER_WORDS = 2
_WORD = np.dtype(np.uint32)


def ids(key: Any, segment: Any) -> Any:
    """The run's key and the segment as one int32 array of two (traced)."""
    return jnp.stack([jnp.asarray(key, jnp.int32), jnp.asarray(segment, jnp.int32)])


def _words(leaf: Any) -> Any:
    """``leaf``'s bytes as uint32 words, zeros after them up to a whole word (traced)."""
    if jnp.issubdtype(leaf.dtype, jnp.complexfloating):
        # bitcasts refuse complex values; real and imaginary parts interleaved are their layout
        leaf = jnp.stack([jnp.real(leaf), jnp.imag(leaf)], axis=-1)
    itemsize = np.dtype(leaf.dtype).itemsize
    if itemsize >= _WORD.itemsize:
        return lax.bitcast_convert_type(leaf, jnp.uint32).reshape(-1)
    per_word = _WORD.itemsize // itemsize
    flat = leaf.reshape(-1)
    flat = jnp.pad(flat, (0, -flat.size % per_word))
    return lax.bitcast_convert_type(flat.reshape(-1, per_word), jnp.uint32)


def shared_dtype(dtypes: Sequence[Any]) -> np.dtype | None:
    """The dtype the leaves share, or None where they differ: the host then keeps the carry as
    one buffer of bytes (a checkpoint's arrays share one dtype)."""
    found = {np.dtype(dtype) for dtype in dtypes}
    return found.pop() if len(found) == 1 else None


def leaf_bytes(shape: tuple[int, ...], dtype: Any) -> int:
    """The bytes of a leaf of this shape and dtype."""
    return int(np.prod(shape)) * np.dtype(dtype).itemsize


def pack(key: Any, segment: Any, leaves: Sequence[Any]) -> Any:
    """The ids (:func:`ids`) and ``leaves``' bytes, in their order, each padded to whole
    words, as one uint32 array (traced)."""
    header = lax.bitcast_convert_type(ids(key, segment), jnp.uint32)
    return jnp.concatenate([header, *(_words(leaf) for leaf in leaves)])


def unpack(packed: np.ndarray, shapes: Sequence[tuple[int, ...]],
           dtypes: Sequence[str]) -> tuple[int, int, list[np.ndarray]]:
    """The key, the segment and the leaves of :func:`pack`'s array on the host: views of its
    bytes (copy them to keep them beyond the callback)."""
    words = np.ascontiguousarray(packed).view(_WORD)
    sizes = [leaf_bytes(shape, dtype) for shape, dtype in zip(shapes, dtypes)]
    expected = HEADER_WORDS + sum(-(-size // _WORD.itemsize) for size in sizes)
    if words.size != expected:
        raise ValueError(f"a packed carry of {words.size} words, expected {expected}")
    key, segment = (int(value) for value in words[:HEADER_WORDS].view(np.int32))
    buffer = words.view(np.uint8)
    leaves, offset = [], HEADER_WORDS * _WORD.itemsize
    for shape, dtype, size in zip(shapes, dtypes, sizes):
        leaves.append(buffer[offset:offset + size].view(dtype).reshape(shape))
        offset += -(-size // _WORD.itemsize) * _WORD.itemsize
    return key, segment, leaves
