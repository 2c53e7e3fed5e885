"""Reuse after any failure: whichever Level-2 call fails (put, get, delete, __contains__,
reserve), on whichever backend, the next run of the same checkpointer (or, where construction
failed, of the next one on the same backend) finds keys and buffers as a fresh checkpointer's
would, and gives the store-all gradient bit for bit."""
from __future__ import annotations

import errno
import threading
from pathlib import Path

import numpy as np
import pytest

from asyncckpt import AsyncCheckpointer, CheckpointError, FileStorage, HostMemoryStorage
from asyncckpt.storage import Storage, TieredStorage, WrapperStorage
from workloads import Forward, RecurrentCell, Reverse, forward_reverse, store_all_reference

pytestmark = pytest.mark.timeout(60)

N, INTERVAL, SLOTS = 40, 4, 2


class Trigger:
    """Makes the first call of each of ``methods`` fail, once, across every backend sharing it."""

    def __init__(self, methods: list[str]) -> None:
        self.armed, self.fired = list(methods), []

    def __call__(self, method: str, key: object) -> None:
        if method in self.armed:
            self.armed.remove(method)
            self.fired.append(method)
            raise OSError(errno.EIO, f"injected failure of {method}({key})")


class FailsOnce(WrapperStorage):
    """A real backend whose calls fail where its :class:`Trigger` says."""

    def __init__(self, inner: Storage, trigger: Trigger) -> None:
        super().__init__(inner)
        self.trigger = trigger

    def put(self, key: int, buf: np.ndarray) -> None:
        self.trigger("put", key)
        super().put(key, buf)

    def get(self, key: int, out: np.ndarray) -> None:
        self.trigger("get", key)
        super().get(key, out)

    def delete(self, key: int) -> None:
        self.trigger("delete", key)
        super().delete(key)

    def __contains__(self, key: object) -> bool:
        self.trigger("__contains__", key)
        return super().__contains__(key)

    def reserve(self, nbytes: int, count: int) -> None:
        self.trigger("reserve", count)
        super().reserve(nbytes, count)


def level2(backend: str, trigger: Trigger, tmp_path: Path) -> tuple[Storage, list[Storage]]:
    """The Level-2 a checkpointer is given, and the real backends under it."""
    if backend == "dram":
        inner: list[Storage] = [HostMemoryStorage()]
    elif backend == "file":
        inner = [FileStorage(tmp_path)]
    else:  # two states in DRAM, the rest on the disk; either tier may fail
        inner = [HostMemoryStorage(), FileStorage(tmp_path)]
    faulty = [FailsOnce(real, trigger) for real in inner]
    storage = faulty[0] if len(faulty) == 1 else TieredStorage(faulty, [2, None])
    return storage, inner


#: the calls that fail in the first run, the first of them the one that fails it; a call of
#: the clean-up after a failure (or of a tier asked whether a failed put left a state), the
#: second
FAULTS = {"put": ["put"], "get": ["get"], "delete": ["delete"], "reserve": ["reserve"],
          "contains-in-clean-up": ["get", "__contains__"],
          "put-then-contains": ["put", "__contains__"],
          "delete-in-clean-up": ["get", "delete"], "put-then-delete": ["put", "delete"]}


def checkpointer(model: RecurrentCell, storage: Storage) -> AsyncCheckpointer:
    return AsyncCheckpointer(model, Forward(model), Reverse(model), N, l1_slots=SLOTS,
                             interval=INTERVAL, storage=storage)


def held(backends: list[Storage]) -> list[int]:
    """Every key (a state's, a probe's) the real backends hold."""
    return [key for real in backends for key in range(-64, N + 1) if key in real]


@pytest.fixture(scope="module")
def fresh(tmp_path_factory) -> dict[str, int]:
    """What a fresh checkpointer holds after one run: engine buffers."""
    model = RecurrentCell(N)
    storage, _ = level2("tiers", Trigger([]), tmp_path_factory.mktemp("fresh"))
    with checkpointer(model, storage) as ckp:
        forward_reverse(model, ckp)
        buffers = ckp._parts.engine.buffers_held
    storage.close()
    return {"buffers": buffers}


@pytest.mark.parametrize("backend", ["dram", "file", "tiers"])
@pytest.mark.parametrize("fault", FAULTS)
def test_the_run_after_a_failed_storage_call_is_a_fresh_checkpointers(
        fault: str, backend: str, tmp_path: Path, fresh: dict[str, int]) -> None:
    """One failed delete (engine.free) made the next run fail with 'key already stored' (the
    engine forgot the key before the delete; a tier forgot it too); a failed __contains__ or
    delete in the clean-up of a failed run left the state behind the same way."""
    model = RecurrentCell(N)
    reference = store_all_reference(model)
    trigger = Trigger(FAULTS[fault])
    storage, backends = level2(backend, trigger, tmp_path)
    ckp = None
    try:
        with pytest.raises((CheckpointError, OSError)):
            ckp = checkpointer(model, storage)
            forward_reverse(model, ckp)
        assert trigger.fired[:1] == FAULTS[fault][:1]  # the fault did fail the first run
        if ckp is None:  # construction failed: the next checkpointer on the same backend
            ckp = checkpointer(model, storage)
        for got, want in zip(forward_reverse(model, ckp), reference, strict=True):
            assert got.tobytes() == want.tobytes()
        assert held(backends) == []
        assert ckp._parts.engine.buffers_held == fresh["buffers"]
        for got, want in zip(forward_reverse(model, ckp), reference, strict=True):
            assert got.tobytes() == want.tobytes()
    finally:
        if ckp is not None:
            ckp.close()
        storage.close()


class StallsOnce(WrapperStorage):
    """A real backend whose first put of ``key`` stalls until :attr:`release` is set."""

    def __init__(self, inner: Storage, key: int) -> None:
        super().__init__(inner)
        self.key = key
        self.stalled, self.release, self.landed = (threading.Event(), threading.Event(),
                                                   threading.Event())

    def put(self, key: int, buf: np.ndarray) -> None:
        if key != self.key or self.stalled.is_set():
            super().put(key, buf)
            return
        self.stalled.set()
        self.release.wait(30)
        try:
            super().put(key, buf)
        finally:
            self.landed.set()


def test_a_stalled_write_that_lands_in_the_next_run_never_replaces_its_state() -> None:
    """The write of an abandoned run, stalled until the next run has written the same key,
    lands late: it must neither replace the new state (its bytes are the old run's) nor be
    lost track of."""
    model = RecurrentCell(N)
    reference = store_all_reference(model)
    inner = HostMemoryStorage()
    storage = StallsOnce(inner, key=8)
    try:
        with AsyncCheckpointer(model, Forward(model), Reverse(model), N, l1_slots=SLOTS,
                               interval=INTERVAL, storage=storage, io_threads=2,
                               transfer_timeout=1) as ckp:
            model.reset()
            model.h += 1.0  # the abandoned run's states differ from the next one's
            with pytest.raises(CheckpointError, match="stalled"):
                ckp.apply_forward()
            assert storage.stalled.is_set()
            model.reset()
            ckp.apply_forward()  # u_8 written anew, on the other I/O thread
            ckp.drain()
            storage.release.set()
            assert storage.landed.wait(10)
            model.reset_adjoint()
            ckp.apply_reverse()
            for got, want in zip(model.gradients(), reference, strict=True):
                assert got.tobytes() == want.tobytes()
            for got, want in zip(forward_reverse(model, ckp), reference, strict=True):
                assert got.tobytes() == want.tobytes()
            assert held([inner]) == []
    finally:
        storage.release.set()
        storage.close()
