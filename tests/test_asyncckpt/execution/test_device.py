"""The device path (Level-1 in device memory, Level-2 in page-locked host memory, copies on
streams ordered by events), run on the CPU stand-in: its streams are threads, so every copy the
runtime queues really runs later and beside the compute, and a missing event shows up as a
wrong gradient (the negative control below proves the tests would see it)."""
from __future__ import annotations

import random
import subprocess
import sys
import textwrap
import threading

import numpy as np
import pytest

from asyncckpt import (
    ArrayCheckpoint,
    AsyncCheckpointer,
    FileStorage,
    InvalidTypeError,
    InvalidValueError,
    TieredStorage,
    TransferError,
)
from asyncckpt._memory.buffers import padded
from asyncckpt.compat import Revolver
from asyncckpt.devices import StandInDevice, device_of
from asyncckpt.devices.base import word_digest
from asyncckpt.devices.standin import StandInStream, StandInStreamError
from asyncckpt.storage import PinnedMemoryStorage
from asyncckpt.testing import StorageTests
from conftest import TESTS
from device_workloads import DeviceLeapfrog, DevicePyramid, DeviceRecurrentCell, \
    assert_level2_corruption_caught, digest_on
from schedules import simulate
from workloads import Forward, Leapfrog, Pyramid, RecurrentCell, Reverse, forward_reverse, \
    store_all_reference

HOST_TWIN = {DeviceLeapfrog: Leapfrog, DeviceRecurrentCell: RecurrentCell, DevicePyramid: Pyramid}


@pytest.fixture
def device():
    """A stand-in whose default stream is a thread, as a GPU's: every step runs later than
    the call that launched it, each operation after a random delay of up to 0.2 ms."""
    device = StandInDevice(asynchronous=True, delay=2e-4, seed=7)
    yield device
    device.close()


def assert_bitwise(got: list[np.ndarray], want: list[np.ndarray]) -> None:
    assert len(got) == len(want)
    for g, w in zip(got, want):
        assert g.dtype == w.dtype and g.shape == w.shape
        assert g.tobytes() == w.tobytes(), f"max difference {np.max(np.abs(g - w))}"


def run_device(model, **kwargs) -> tuple[list[np.ndarray], AsyncCheckpointer]:
    kwargs.setdefault("keep_trace", True)
    with AsyncCheckpointer(model, Forward(model), Reverse(model), model.n, **kwargs) as ckp:
        grads = forward_reverse(model, ckp)
        if kwargs["keep_trace"]:
            simulate(ckp.trace, n_steps=model.n, l1_slots=ckp.l1_slots, prefetch_slots=2,
                     taping=ckp.taping)
        return grads, ckp


def reference(model) -> list[np.ndarray]:
    host = HOST_TWIN[type(model)](model.n, **getattr(model, "options", {}))
    return store_all_reference(host)


# -- bitwise against store-all ------------------------------------------------------------------


def cases(count: int) -> list[tuple]:
    rng = random.Random(13)
    out = []
    for i in range(count):
        kind = rng.choice([DeviceLeapfrog, DeviceRecurrentCell, DevicePyramid])
        taping = True if kind is not DeviceLeapfrog else rng.random() < 0.5
        n = rng.randint(1, 40)
        interval = rng.choice([rng.randint(1, n), "auto", "adaptive"])
        slots = rng.randint(1, 4)
        storage = rng.choice(["pinned", "tiers", "disk"])
        out.append(pytest.param(kind, taping, n, interval, slots, storage, id=f"case{i}"))
    return out


@pytest.mark.parametrize("kind,taping,n,interval,slots,storage", cases(24))
def test_adjoint_is_bitwise_store_all(device, tmp_path, kind, taping, n, interval, slots,
                                      storage):
    model = kind(device, n)
    level2 = {"pinned": None,
              "tiers": TieredStorage([PinnedMemoryStorage(device), FileStorage(tmp_path)],
                                     capacities=[2, None]),
              "disk": str(tmp_path)}[storage]
    try:
        grads, ckp = run_device(model, l1_slots=slots, interval=interval, storage=level2,
                                taping=taping)
    finally:
        if isinstance(level2, TieredStorage):
            level2.close()
    assert_bitwise(grads, reference(model))
    if taping:
        model.trace.check_protocol(n)
    assert ckp.stats.device == "stand-in"


@pytest.mark.parametrize("taping", [True, False])
def test_second_run_and_torn_down_streams(device, taping):
    model = DeviceLeapfrog(device, 60)
    with AsyncCheckpointer(model, Forward(model), Reverse(model), 60, l1_slots=3, interval=7,
                           taping=taping) as ckp:
        first = forward_reverse(model, ckp)
        second = forward_reverse(model, ckp)
    assert_bitwise(first, reference(model))
    assert_bitwise(second, first)
    assert not [t for t in threading.enumerate() if t.name == "asyncckpt-standin-copy"]


def test_every_buffer_in_use_at_once(device):
    """One staging buffer and a Level-2 slower than the compute: stores wait for writes, the
    prefetch buffers are reused, and the twins are copied out of before they are refilled."""
    model = DeviceLeapfrog(device, 80)
    slow = StandInDevice(asynchronous=True, delay=1e-3, seed=3)
    try:
        grads, ckp = run_device(model, l1_slots=2, interval=3, staging_buffers=1,
                                storage=PinnedMemoryStorage(slow))
    finally:
        slow.close()
    assert_bitwise(grads, reference(model))
    assert ckp.stats.l2_writes == len(range(0, 80, 3))


def test_compat_revolver_on_device(device):
    model = DeviceLeapfrog(device, 50)
    revolver = Revolver(model, Forward(model), Reverse(model), 4, 50)
    try:
        grads = forward_reverse(model, revolver)
    finally:
        revolver.close()
    assert_bitwise(grads, reference(model))


# -- the events are what keeps it right ----------------------------------------------------------


def test_without_the_event_the_copy_races_the_compute(monkeypatch):
    """Negative control: the compute stream takes 2 ms per operation and the write stream
    none; with the wait on the state's event removed, the device-to-host copy reads the
    staging buffer before the state is in it, and the gradient is wrong."""
    device = StandInDevice(asynchronous=False)
    compute = StandInStream(device, delay=0.0, name="compute")
    slow_gather = device.gather

    def gather_late(arrays, buffer, stream):
        stream.enqueue(lambda: __import__("time").sleep(2e-3))
        slow_gather(arrays, buffer, stream)

    try:
        with device.use(compute):
            model = DeviceLeapfrog(device, 30)
            monkeypatch.setattr(device, "gather", gather_late)
            good, _ = run_device(model, l1_slots=2, interval=3)
            assert_bitwise(good, reference(model))
            monkeypatch.setattr(StandInStream, "wait_event", lambda self, event: None)
            bad, _ = run_device(model, l1_slots=2, interval=3, verify=False)
        assert any(b.tobytes() != g.tobytes() for b, g in zip(bad, good))
    finally:
        compute.close()
        device.close()


def test_no_host_synchronisation_per_store(device):
    """The caller waits on no device event while it stores: one wait for the compute stream
    ends each sweep, whatever n."""
    counts = {}
    for n in (40, 400):
        model = DeviceLeapfrog(device, n)
        with AsyncCheckpointer(model, Forward(model), Reverse(model), n, l1_slots=3,
                               interval=5, staging_buffers=64) as ckp:
            model.reset()
            device.host_syncs.clear()
            ckp.apply_forward()
            counts[n] = device.host_syncs["MainThread"]
            assert ckp.stats.l2_writes == len(range(0, n, 5))
            model.reset_adjoint()
            ckp.apply_reverse()
    assert counts == {40: 1, 400: 1}


def test_device_memory_is_flat_in_n(device):
    peaks, held = {}, {}
    for n in (30, 600):
        model = DeviceLeapfrog(device, n, points=1000)
        device.peak_bytes = device.allocated_bytes
        grads, ckp = run_device(model, l1_slots=4, interval=6, keep_trace=False)
        peaks[n] = device.peak_bytes
        held[n] = ckp.stats.device_bytes
        if n == 30:
            assert_bitwise(grads, reference(model))
    state = padded(ckp.nbytes)
    assert held[30] == held[600] == (4 + 2 + 2) * state  # slots, staging, prefetch twins
    assert peaks[30] == peaks[600]
    assert ckp.stats.l1_bytes == held[600]


def test_level2_is_page_locked(device):
    model = DeviceLeapfrog(device, 40)
    with AsyncCheckpointer(model, Forward(model), Reverse(model), 40, l1_slots=2,
                           interval=4) as ckp:
        model.reset()
        ckp.apply_forward()
        storage = ckp.storage
        assert isinstance(storage, PinnedMemoryStorage)
        ckp.drain()  # the forward sweep returns with its last writes still under way
        buffers = storage.buffers()
        assert len(buffers) >= 10 and all(device.is_pinned(b) for b in buffers)
        ckp.apply_reverse()


def test_memory_budget_counts_device_memory(device):
    model = DeviceLeapfrog(device, 200, points=2048)
    budget = 12 * padded(model.size * model.dtype.itemsize)
    device.peak_bytes = device.allocated_bytes
    base = device.allocated_bytes
    grads, ckp = run_device(model, memory_budget=budget, keep_trace=False)
    assert_bitwise(grads, reference(model))
    assert ckp.stats.l1_bytes <= budget
    assert device.peak_bytes - base <= budget
    assert ckp.stats.interval >= 1  # 200 states do not fit: Level-2 is used


def test_host_memory_budget_bounds_pinned_level2(device, tmp_path):
    """Level-2 in pinned memory up to host_memory_budget, the rest in a file tier."""
    model = DeviceLeapfrog(device, 120, points=2048)
    state = padded(model.size * model.dtype.itemsize)
    grads, ckp = run_device(model, l1_slots=2, interval=4, host_memory_budget=9 * state,
                            keep_trace=False)
    assert_bitwise(grads, reference(model))
    tiers = ckp.stats.l2_tiers
    assert [t["writes"] for t in tiers] == [9 - 4, 30 - 5]  # 4 pinned engine buffers
    with pytest.raises(InvalidValueError, match="host_memory_budget is for states on a device"):
        host = Leapfrog(10)
        AsyncCheckpointer(host, Forward(host), Reverse(host), 10, l1_slots=2,
                          host_memory_budget="1MiB")


# -- checksums computed on the device ------------------------------------------------------------


def plain_digest(data: bytes) -> int:
    """word_digest written out word by word, from its definition."""
    def mix(z: int) -> int:
        mask = 2**64 - 1
        z = ((z ^ (z >> 30)) * 0xBF58476D1CE4E5B9) & mask
        z = ((z ^ (z >> 27)) * 0x94D049BB133111EB) & mask
        return z ^ (z >> 31)

    data = data + bytes(-len(data) % 4)
    words = [int.from_bytes(data[i:i + 4], "little") for i in range(0, len(data), 4)]
    return sum(mix((i << 32) ^ w) for i, w in enumerate(words)) % 2**64


@pytest.mark.parametrize("nbytes", [0, 1, 3, 4, 7, 4096, 10_001])
def test_word_digest_follows_its_definition(device, nbytes):
    data = np.random.default_rng(nbytes).integers(0, 256, nbytes, dtype=np.uint8)
    assert word_digest(data) == plain_digest(data.tobytes())
    buffer = device.empty(nbytes + 64)
    buffer[:nbytes] = data
    buffer[nbytes:] = 255  # bytes past the state are not part of it
    assert digest_on(device, buffer, nbytes) == word_digest(data)


def test_word_digest_sees_flips_and_moves():
    data = np.random.default_rng(0).integers(0, 256, 1 << 16, dtype=np.uint8)
    base = word_digest(data)
    flipped = data.copy()
    flipped[12345] ^= 0x10
    moved = data.copy().view(np.uint32)
    moved[[7, 900]] = moved[[900, 7]]
    zeroed = data.copy()
    zeroed[4096:8192] = 0
    assert len({base, word_digest(flipped), word_digest(moved.view(np.uint8)),
                word_digest(zeroed)}) == 4
    big = np.random.default_rng(1).integers(0, 256, 3 << 20, dtype=np.uint8)  # several chunks
    assert word_digest(big) == word_digest(big.copy())


def test_device_states_are_checked_on_the_device(device, monkeypatch):
    """No host checksum on the device path: the write stream digests each staging buffer and
    the read stream each arrival; a byte changed on Level-2 is caught on the caller."""
    import xxhash

    def no_host_checksum(*args):
        raise AssertionError("a device state was checksummed on the host")

    monkeypatch.setattr(xxhash, "xxh3_64_intdigest", no_host_checksum)
    model = DeviceLeapfrog(device, 40)
    grads, _ = run_device(model, l1_slots=2, interval=4, keep_trace=False)
    assert_bitwise(grads, reference(model))
    with AsyncCheckpointer(model, Forward(model), Reverse(model), 40, l1_slots=2,
                           interval=4) as ckp:
        model.reset()
        ckp.apply_forward()
        assert_level2_corruption_caught(ckp, model.reset_adjoint)


# -- errors --------------------------------------------------------------------------------------


def test_a_failing_device_copy_raises_on_the_caller(device, monkeypatch):
    model = DeviceLeapfrog(device, 40)
    calls = {"n": 0}
    real = device.to_host

    def failing(buffer, host, nbytes, stream):
        calls["n"] += 1
        if calls["n"] == 3:
            stream.enqueue(lambda: (_ for _ in ()).throw(RuntimeError("DMA engine fault")))
        real(buffer, host, nbytes, stream)

    monkeypatch.setattr(device, "to_host", failing)
    for policy in ("raise", "recompute"):  # a device fault is never rewritten from garbage
        calls["n"] = 0
        with pytest.raises((TransferError, StandInStreamError)) as info:
            run_device(model, l1_slots=2, interval=4, on_level2_error=policy)
        chain = []
        error: BaseException | None = info.value
        while error is not None:
            chain.append(repr(error))
            error = error.__cause__
        assert any("DMA engine fault" in c for c in chain), chain
        device.default_stream.error = None
        for stream in device.streams:
            stream.error = None


def test_an_operator_failing_on_the_stream_reaches_the_caller(device):
    model = DeviceLeapfrog(device, 30)

    class Broken(Forward):
        def apply(self, *, t_start, t_end):
            if t_start >= 12:
                device.launch(lambda: 1 / 0)
            super().apply(t_start=t_start, t_end=t_end)

    with AsyncCheckpointer(model, Broken(model), Reverse(model), 30, l1_slots=2,
                           interval=4) as ckp:
        model.reset()
        with pytest.raises(StandInStreamError, match="ZeroDivisionError"):
            ckp.apply_forward()


def test_arrays_must_all_be_on_the_device(device):
    model = DeviceLeapfrog(device, 10)

    class Mixed:
        size, dtype = model.size, model.dtype

        def get_data(self, t):
            return [model.levels[0], np.zeros(16, np.float32)]

        get_data_location = get_data

    with pytest.raises(InvalidTypeError, match="outside stand-in"):
        AsyncCheckpointer(Mixed(), Forward(model), Reverse(model), 10, l1_slots=2, interval=2)
    with pytest.raises(InvalidValueError, match="transfers='inline'"):
        AsyncCheckpointer(model, Forward(model), Reverse(model), 10, l1_slots=2, interval=2,
                          transfers="inline")


def test_array_checkpoint_of_device_arrays(device):
    model = DeviceLeapfrog(device, 30)
    state = ArrayCheckpoint([model.levels])  # all three levels: a superset of u_t
    with AsyncCheckpointer(state, Forward(model), Reverse(model), 30, l1_slots=2,
                           interval=4) as ckp:
        assert_bitwise(forward_reverse(model, ckp), reference(model))
        assert ckp.device is device


def test_device_of_recognises_each_kind(device):
    assert device_of([np.zeros(3)]) is None
    assert device_of([device.array(np.zeros(3))]) is device
    assert device_of([]) is None


def test_neither_cupy_nor_torch_is_imported(tmp_path):
    """Host states and the stand-in import neither CuPy nor torch (the extra "gpu")."""
    script = textwrap.dedent("""
        import sys
        sys.path.insert(0, {tests!r})
        from asyncckpt import AsyncCheckpointer
        from asyncckpt.devices import StandInDevice
        from device_workloads import DeviceLeapfrog
        from workloads import Forward, Leapfrog, Reverse, forward_reverse
        host = Leapfrog(20)
        device = StandInDevice(asynchronous=True)
        model = DeviceLeapfrog(device, 20)
        for m in (host, model):
            with AsyncCheckpointer(m, Forward(m), Reverse(m), 20, l1_slots=2, interval=3) as c:
                forward_reverse(m, c)
        device.close()
        print(sorted(k for k in sys.modules if k.split(".")[0] in ("cupy", "torch")))
    """).format(tests=str(TESTS))
    out = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True,
                         timeout=120, check=True)
    assert out.stdout.strip() == "[]"


class TestPinnedMemoryStorage(StorageTests):
    """The storage contract holds for page-locked Level-2."""

    def make_storage(self, tmp_path):
        return PinnedMemoryStorage(StandInDevice())
