"""One wait discipline: every Storage call the caller's thread makes or waits on has a deadline.

Each Storage method is made to block forever (an Event that only the test's teardown sets) at
each place the runtime calls it: construction (the probe of ``interval="auto"``, ``reserve``),
the forward and reverse sweeps with transfers on I/O threads or inline, recompute's retry of a
failed write and its reread of a corrupted state, and ``close()`` after a failure. Each must end
in a :class:`~asyncckpt.CheckpointError` within ``transfer_timeout`` + 5 s (``close()`` within
its 2 s), leaving behind only the threads abandoned to the blocked calls, which end once the
teardown lets them return (the autouse leak check of conftest.py waits for that).
"""
from __future__ import annotations

import threading
import time
from collections import Counter

import pytest

from asyncckpt import AsyncCheckpointer, CheckpointError, TransferError
from asyncckpt._execution.bounded import ABANDON_S
from faults import FaultyMemory
from workloads import Forward, RecurrentCell, Reverse

pytestmark = pytest.mark.timeout(60)

N, TIMEOUT = 40, 1.0
#: the behavioural deadline: past transfer_timeout, a CheckpointError within this
BOUND_S = TIMEOUT + 5.0
METHODS = ("put", "get", "delete", "__contains__", "reserve")


class Blocking(FaultyMemory):
    """DRAM Level-2 whose ``method`` blocks until ``release`` is set, from its ``block_from``-th
    call after :meth:`arm` (faults of :class:`FaultyMemory` as well)."""

    def __init__(self, method: str, block_from: int = 1, **faults) -> None:
        super().__init__(**faults)
        self.method, self.block_from = method, block_from
        self.release, self.entered = threading.Event(), threading.Event()
        self.armed = False
        self.counts: Counter[str] = Counter()

    def arm(self) -> None:
        self.armed, self.counts = True, Counter()

    def _gate(self, name: str) -> None:
        self.counts[name] += 1
        if self.armed and name == self.method and self.counts[name] >= self.block_from:
            self.entered.set()
            self.release.wait()

    def put(self, key, buf):
        self._gate("put")
        super().put(key, buf)

    def get(self, key, out):
        self._gate("get")
        super().get(key, out)

    def delete(self, key):
        self._gate("delete")
        super().delete(key)

    def __contains__(self, key):
        self._gate("__contains__")
        return super().__contains__(key)

    def reserve(self, nbytes, count):
        self._gate("reserve")
        super().reserve(nbytes, count)

    def room_for(self, nbytes):
        self._gate("room_for")  # a statvfs of a hung mount
        return super().room_for(nbytes)


@pytest.fixture
def blocking():
    made: list[Blocking] = []

    def make(method: str, **kwargs) -> Blocking:
        made.append(Blocking(method, **kwargs))
        return made[-1]

    yield make
    for storage in made:  # the abandoned threads return, and end
        storage.release.set()
        storage.close()


def make(storage: Blocking, tiered: bool = False, **options) -> AsyncCheckpointer:
    """A checkpointer on ``storage``, where ``tiered`` the first tier before DRAM."""
    model = RecurrentCell(N)
    options = {"l1_slots": 2, "interval": 4, "transfer_timeout": TIMEOUT, **options}
    return AsyncCheckpointer(model, Forward(model), Reverse(model), N,
                             storage=[storage, "dram"] if tiered else storage, **options)


def assert_stalled(error: BaseException, started: float) -> None:
    assert time.monotonic() - started < BOUND_S
    assert isinstance(error, CheckpointError)
    assert isinstance(error.__cause__, TimeoutError), repr(error.__cause__)


def closes_in_time(ckp: AsyncCheckpointer) -> None:
    start = time.monotonic()
    ckp.close()
    assert time.monotonic() - start < ABANDON_S + 0.5


@pytest.mark.parametrize("method,interval,tiered", [
    *[(method, "auto", False) for method in METHODS[:4]],
    *[(method, 4, tiered) for method in ("reserve", "room_for") for tiered in (False, True)]])
def test_construction(blocking, method: str, interval: int | str, tiered: bool) -> None:
    """The probe of Level-2 by ``interval="auto"`` (put, get, delete, ``in``), and at a fixed
    interval the ``reserve`` and ``room_for`` (a statvfs, which the plan asks of Level-2 or of
    each tier, and a TieredStorage of a tier to split its reserve), at construction."""
    storage = blocking(method)
    storage.arm()
    start = time.monotonic()
    with pytest.raises(CheckpointError) as info:
        make(storage, tiered, interval=interval)
    assert storage.entered.is_set()
    assert_stalled(info.value, start)


@pytest.mark.parametrize("method", ["reserve", "room_for"])
@pytest.mark.parametrize("tiered", [False, True])
def test_reserve_of_the_first_auto_run(blocking, method: str, tiered: bool) -> None:
    """"auto" asks Level-2 (or each tier) for its room and reserves it for the interval it
    picks before the first run."""
    storage = blocking(method)
    run(storage, make(storage, tiered, interval="auto"), "forward")


def run(storage: Blocking, ckp: AsyncCheckpointer, arm: str) -> None:
    """A forward and a reverse sweep, ``storage`` armed before the sweep ``arm``, the error
    expected by the end of the sweep; then a close within its bound."""
    start = time.monotonic()
    try:
        with pytest.raises(TransferError) as info:
            if arm == "forward":
                storage.arm()
                start = time.monotonic()
            ckp.apply_forward()
            if arm == "reverse":
                storage.arm()
                start = time.monotonic()
            ckp.apply_reverse()
        assert storage.entered.is_set()
        assert_stalled(info.value, start)
    finally:
        closes_in_time(ckp)


@pytest.mark.parametrize("transfers", ["background", "inline"])
@pytest.mark.parametrize("method,sweep", [("put", "forward"), ("get", "reverse"),
                                          ("delete", "reverse")])
def test_sweeps(blocking, method: str, sweep: str, transfers: str) -> None:
    """Writes, prefetches and the deletes of ``engine.free``, on I/O threads and inline, under
    either policy (a stall is never recomputed around)."""
    for policy in ("raise", "recompute"):
        storage = blocking(method)
        run(storage, make(storage, transfers=transfers, on_level2_error=policy), sweep)


@pytest.mark.parametrize("transfers", ["background", "inline"])
def test_recompute_retry_of_a_failed_write(blocking, transfers: str) -> None:
    """Under "recompute" a failed put is tried again on the caller's thread."""
    storage = blocking("put", fail_put_at=2, block_from=3)  # the retry of u_4's write
    run(storage, make(storage, transfers=transfers, on_level2_error="recompute"), "forward")


@pytest.mark.parametrize("transfers", ["background", "inline"])
def test_recompute_reread_of_a_corrupted_state(blocking, transfers: str) -> None:
    """Under "recompute" a corrupted read is read again on the caller's thread."""
    storage = blocking("get", flip_get_at=1, block_from=2)
    run(storage, make(storage, transfers=transfers, on_level2_error="recompute"), "forward")


def test_close_after_a_failure(blocking) -> None:
    """close() deletes what a failed run wrote (each key it may have written, with no ``in``
    first), bounded by close's 2 s however the delete stalls."""
    storage = blocking("delete", fail_put_at=3)
    ckp = make(storage)
    with pytest.raises(TransferError):
        ckp.apply_forward()
        ckp.apply_reverse()
    storage.arm()
    closes_in_time(ckp)
    assert storage.entered.is_set()


def test_close_after_a_stalled_write_is_within_its_bound(blocking) -> None:
    """close() after a stalled write waited the deadline for it, then as long again for the I/O
    thread: 4.0 s where 2 s were promised (transfer_timeout 2)."""
    storage = blocking("put", block_from=3)
    storage.arm()
    ckp = make(storage, transfer_timeout=2.0)
    with pytest.raises(TransferError):
        ckp.apply_forward()
    closes_in_time(ckp)


def test_a_stalled_run_is_abandoned_by_the_next(blocking) -> None:
    """A new run after a stalled one starts within the bound, and close() stays bounded."""
    storage = blocking("put", block_from=2)
    storage.arm()
    ckp = make(storage)
    try:
        with pytest.raises(TransferError):
            ckp.apply_forward()
        start = time.monotonic()
        with pytest.raises(TransferError):  # the device is stalled still
            ckp.apply_forward()
        assert time.monotonic() - start < BOUND_S + ABANDON_S
    finally:
        closes_in_time(ckp)


def test_the_run_after_stalled_deletes_stops_at_the_first(blocking) -> None:
    """The reverse sweep's deletes stall: every key of the run is left stale, and the next run
    deleted them first, each within its own deadline (10 keys: 10 s). A device that stalls
    once is not asked again: the next run is a TransferError within one deadline."""
    storage = blocking("delete")
    ckp = make(storage)
    try:
        ckp.apply_forward()
        storage.arm()
        with pytest.raises(TransferError):
            ckp.apply_reverse()
        start = time.monotonic()
        with pytest.raises(TransferError) as info:
            ckp.apply_forward()
        assert_stalled(info.value, start)
    finally:
        closes_in_time(ckp)
