"""The storage conformance suite: check a Level-2 backend against the contract of
:class:`~asyncckpt.storage.Storage`.

Subclass :class:`StorageTests` in a pytest module and override one method::

    from asyncckpt.testing import StorageTests

    class TestMyStorage(StorageTests):
        def make_storage(self, tmp_path):
            return MyStorage(tmp_path)

pytest then runs every ``test_*`` method below against fresh instances. Importing this module
does not import pytest; the tests use only ``tmp_path``, which pytest provides.
"""
from __future__ import annotations

import threading
from pathlib import Path
from typing import Any

import numpy as np

from .errors import StorageError
from .storage import Storage, from_config

__all__ = ["StorageTests"]

#: State sizes the round trips use: a byte, odd sizes about a page, and a few MiB.
SIZES = (1, 4095, 4096, 4097, 3 * 2**20 + 5)


def _random(nbytes: int, seed: int) -> np.ndarray:
    return np.random.default_rng(seed).integers(0, 256, nbytes, dtype=np.uint8)


def _raises(kind: type[BaseException], call: Any, *args: Any) -> BaseException:
    """Call ``call(*args)``; return what it raised, or fail naming the call."""
    try:
        call(*args)
    except kind as exc:
        return exc
    raise AssertionError(f"{getattr(call, '__qualname__', call)}{args!r} did not raise "
                         f"{kind.__name__}")


class StorageTests:
    """The contract of :class:`asyncckpt.storage.Storage`, as pytest tests.

    One instance of the backend holds values of one size at a time; every test makes fresh
    instances with :meth:`make_storage` and closes them.
    """

    def make_storage(self, tmp_path: Path) -> Storage:
        """Return a fresh, empty backend; ``tmp_path`` is a private directory it may use."""
        raise NotImplementedError("override make_storage(self, tmp_path) to return a new "
                                  "instance of the backend under test")

    def _fresh(self, tmp_path: Path) -> Storage:
        storage = self.make_storage(tmp_path)
        assert isinstance(storage, Storage), (
            f"make_storage returned a {type(storage).__name__}, not an asyncckpt Storage")
        return storage

    def test_round_trips_of_several_sizes(self, tmp_path: Path) -> None:
        """Page-aligned and unaligned buffers alike (numpy slices start anywhere)."""
        for nbytes in SIZES:
            for offset in (0, 3):
                storage = self._fresh(tmp_path)
                try:
                    storage.reserve(nbytes, 3)
                    values = {key: _random(nbytes, seed=key + nbytes) for key in (0, 7, 1000)}
                    for key, value in values.items():
                        source = np.empty(nbytes + offset, dtype=np.uint8)[offset:]
                        source[:] = value
                        storage.put(key, source)
                    for key, value in values.items():
                        out = np.zeros(nbytes + offset, dtype=np.uint8)[offset:]
                        storage.get(key, out)
                        assert np.array_equal(out, value), (
                            f"get({key}) of {nbytes} bytes (buffer offset {offset}) returned "
                            "other bytes than put stored")
                finally:
                    storage.close()

    def test_more_than_reserved(self, tmp_path: Path) -> None:
        """More states than ``reserve`` announced are stored and read back whole."""
        storage = self._fresh(tmp_path)
        try:
            storage.reserve(5000, 2)
            for key in range(6):
                storage.put(key, np.full(5000, key, dtype=np.uint8))
            out = np.empty(5000, dtype=np.uint8)
            for key in range(6):
                storage.get(key, out)
                assert (out == key).all(), f"key {key} differs beyond the reserved count"
        finally:
            storage.close()

    def test_put_copies_the_buffer(self, tmp_path: Path) -> None:
        """What was put stays, whatever the caller does to its buffer afterwards."""
        storage = self._fresh(tmp_path)
        try:
            value = _random(8192, seed=1)
            kept = value.copy()
            storage.put(3, value)
            value[:] = 0
            out = np.zeros_like(kept)
            storage.get(3, out)
            assert np.array_equal(out, kept), "the stored bytes changed with the caller's buffer"
        finally:
            storage.close()

    def test_delete_then_put_returns_the_new_bytes(self, tmp_path: Path) -> None:
        """A key deleted and put again reads back the new bytes, never stale ones."""
        storage = self._fresh(tmp_path)
        try:
            for round_ in range(3):
                value = _random(10_000, seed=round_)
                storage.put(5, value)
                out = np.zeros_like(value)
                storage.get(5, out)
                assert np.array_equal(out, value), (
                    f"round {round_}: get after delete and put returned stale bytes")
                storage.delete(5)
        finally:
            storage.close()

    def test_contains(self, tmp_path: Path) -> None:
        """``in`` is true from a key's ``put`` to its ``delete``, and false for other keys."""
        storage = self._fresh(tmp_path)
        try:
            assert 4 not in storage
            storage.put(4, _random(100, seed=4))
            assert 4 in storage and 5 not in storage
            storage.delete(4)
            assert 4 not in storage
        finally:
            storage.close()

    def test_missing_and_duplicate_keys_raise_key_errors(self, tmp_path: Path) -> None:
        """``get`` or ``delete`` of a missing key, and ``put`` of a stored one, raise
        :class:`~asyncckpt.StorageKeyError`; the refused put leaves the stored value."""
        storage = self._fresh(tmp_path)
        try:
            out = np.zeros(64, dtype=np.uint8)
            _raises(KeyError, storage.get, 9, out)
            _raises(KeyError, storage.delete, 9)
            storage.put(9, _random(64, seed=9))
            error = _raises(KeyError, storage.put, 9, _random(64, seed=10))
            storage.get(9, out)
            assert np.array_equal(out, _random(64, seed=9)), "a refused put replaced the value"
            assert isinstance(error, StorageError), (
                f"a duplicate put raised {type(error).__name__}, not a StorageError")
        finally:
            storage.close()

    def test_adopt_stores_the_buffer_and_returns_one_to_reuse(self, tmp_path: Path) -> None:
        """``adopt`` stores the buffer's first bytes and returns a buffer the caller may write into
        without changing what was stored."""
        storage = self._fresh(tmp_path)
        try:
            nbytes = 5000
            buffer = np.zeros(8192, dtype=np.uint8)
            buffer[:nbytes] = _random(nbytes, seed=2)
            spare = storage.adopt(2, buffer, nbytes)
            assert spare.nbytes >= nbytes, "adopt returned a buffer smaller than a state"
            spare[:] = 0xFF  # the caller stages the next state into it
            out = np.zeros(nbytes, dtype=np.uint8)
            storage.get(2, out)
            assert np.array_equal(out, _random(nbytes, seed=2)), (
                "writing into the buffer adopt returned changed the stored state")
        finally:
            storage.close()

    def test_close_twice(self, tmp_path: Path) -> None:
        """A second ``close`` does nothing."""
        storage = self._fresh(tmp_path)
        storage.put(1, _random(100, seed=1))
        storage.close()
        storage.close()

    def test_use_after_close_raises(self, tmp_path: Path) -> None:
        """``put`` and ``get`` after ``close`` raise :class:`~asyncckpt.StorageError`."""
        storage = self._fresh(tmp_path)
        storage.put(1, _random(100, seed=1))
        storage.close()
        _raises(StorageError, storage.put, 2, _random(100, seed=2))
        _raises(StorageError, storage.get, 1, np.zeros(100, dtype=np.uint8))

    def test_distinct_keys_from_several_threads(self, tmp_path: Path) -> None:
        """Six threads putting, getting and deleting keys of their own at once lose or mix none."""
        storage = self._fresh(tmp_path)
        nbytes, threads, per_thread = 70_001, 6, 12
        failures: list[BaseException] = []
        start = threading.Barrier(threads)

        def work(worker: int) -> None:
            try:
                start.wait()
                out = np.empty(nbytes, dtype=np.uint8)
                for i in range(per_thread):
                    key = worker * per_thread + i
                    storage.put(key, _random(nbytes, seed=key))
                    storage.get(key, out)
                    assert np.array_equal(out, _random(nbytes, seed=key)), f"key {key} differs"
                    if i % 3 == 0:
                        storage.delete(key)
            except BaseException as exc:  # noqa: BLE001 - reported on the test's thread
                failures.append(exc)

        try:
            storage.reserve(nbytes, threads * per_thread)
            pool = [threading.Thread(target=work, args=(w,)) for w in range(threads)]
            for thread in pool:
                thread.start()
            for thread in pool:
                thread.join(60)
            assert not any(thread.is_alive() for thread in pool), "a thread hung"
            assert not failures, f"{len(failures)} threads failed, the first with {failures[0]!r}"
            out = np.empty(nbytes, dtype=np.uint8)
            for key in range(threads * per_thread):
                assert (key in storage) == (key % per_thread % 3 != 0)
                if key in storage:
                    storage.get(key, out)
                    assert np.array_equal(out, _random(nbytes, seed=key)), f"key {key} differs"
        finally:
            storage.close()

    def test_config_round_trip(self, tmp_path: Path) -> None:
        """Where the backend describes itself (``get_config()`` is not None), ``from_config``
        rebuilds one of the same type with the same description."""
        storage = self._fresh(tmp_path)
        try:
            config = storage.get_config()
            if config is None:
                return
            rebuilt = from_config(config)
            try:
                assert type(rebuilt) is type(storage)
                assert rebuilt.get_config() == config
            finally:
                rebuilt.close()
        finally:
            storage.close()
