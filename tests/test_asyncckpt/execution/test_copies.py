"""Copies of large states in two halves, one on the link's helper thread: the same bytes as one
copy, and no thread left once the link closes."""
from __future__ import annotations

import threading

import numpy as np
import pytest

from asyncckpt import AsyncCheckpointer
from asyncckpt._memory.buffers import (PAGE, SPLIT_COPY_BYTES, aligned_buffer, copy_halves, copy_in,
                                copy_out)
from asyncckpt._execution.link import HostLink
from workloads import Forward, Leapfrog, Reverse, forward_reverse, store_all_reference


class Guarded(np.ndarray):
    """Like Devito's Data: item assignment runs code of its own, which a copy must not call."""

    def __setitem__(self, index: object, value: object) -> None:
        raise AssertionError("the copy ran the subclass's __setitem__")


def _state(rng: np.random.Generator) -> list[np.ndarray]:
    """Arrays of three dtypes and odd sizes, more than SPLIT_COPY_BYTES in all."""
    big = rng.standard_normal(SPLIT_COPY_BYTES // 4 + 12345).astype(np.float32).view(Guarded)
    return [rng.integers(0, 9, 1001).astype(np.int16), big, rng.standard_normal((3, 5))]


def _copy_threads() -> list[str]:
    return [t.name for t in threading.enumerate() if t.name.startswith("asyncckpt-copy")]


def test_a_split_copy_moves_the_same_bytes_as_one_copy() -> None:
    rng = np.random.default_rng(0)
    arrays = _state(rng)
    nbytes = sum(a.nbytes for a in arrays)
    link = HostLink(split_copies=True)
    try:
        split, whole = aligned_buffer(nbytes), aligned_buffer(nbytes)
        link.copy_out(arrays, split)
        copy_out(arrays, whole)
        assert split[:nbytes].tobytes() == whole[:nbytes].tobytes()
        assert _copy_threads()  # it was split
        source = aligned_buffer(nbytes)
        source[:nbytes] = rng.integers(0, 256, nbytes, dtype=np.uint8)
        plain = [np.array(a) for a in arrays]
        link.copy_in(source, arrays)
        copy_in(source, plain)
        assert all(a.tobytes() == b.tobytes() for a, b in zip(arrays, plain))
    finally:
        link.close()
    assert _copy_threads() == []


def test_the_halves_cover_every_byte_once_and_about_evenly() -> None:
    arrays = _state(np.random.default_rng(1))
    nbytes = sum(a.nbytes for a in arrays)
    halves = copy_halves(arrays, aligned_buffer(nbytes), out=True)
    assert halves is not None
    sizes = [sum(destination.nbytes for destination, _ in half) for half in halves]
    assert sum(sizes) == nbytes
    assert abs(sizes[0] - sizes[1]) <= 2 * PAGE
    offsets = [destination.ctypes.data for half in halves for destination, _ in half]
    assert offsets == sorted(offsets)  # in order, none twice


@pytest.mark.parametrize("case", ["small", "strided"])
def test_small_or_strided_states_are_copied_whole(case: str) -> None:
    if case == "small":
        arrays = [np.ones(SPLIT_COPY_BYTES // 8 - 1)]
    else:
        arrays = [np.ones((SPLIT_COPY_BYTES // 4, 2))[:, 0]]
    nbytes = sum(a.nbytes for a in arrays)
    assert copy_halves(arrays, aligned_buffer(nbytes), out=True) is None
    link = HostLink(split_copies=True)
    buffer = aligned_buffer(nbytes)
    link.copy_out(arrays, buffer)
    assert (buffer[:nbytes].view(np.float64) == 1).all()
    assert _copy_threads() == []
    link.close()


@pytest.mark.parametrize("taping", [True, False])
def test_a_checkpointer_with_states_copied_in_halves_equals_store_all(taping: bool) -> None:
    """States of two time levels of 2^19 float32 (4 MiB): every copy is split, and the
    adjoints equal the store-everything reference bit for bit."""
    n = 12
    model = Leapfrog(n, points=1 << 19)
    reference = store_all_reference(model)
    with AsyncCheckpointer(model, Forward(model), Reverse(model), n, l1_slots=2, interval=3,
                           taping=taping) as ckp:
        got = forward_reverse(model, ckp)
        assert _copy_threads()
    assert [g.tobytes() for g in got] == [r.tobytes() for r in reference]
    assert _copy_threads() == []
