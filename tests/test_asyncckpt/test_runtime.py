"""AsyncCheckpointer: bit-identical adjoints, the protocol, asynchrony, stats and errors."""
from __future__ import annotations

import threading
import time
from pathlib import Path

import numpy as np
import pytest

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from asyncckpt import ArrayCheckpoint, AsyncCheckpointer, HostMemoryStorage, Storage
from asyncckpt._tuning.tuner import PRIOR_TRANSFERS
from schedules import AsyncMultistage, simulate
from workloads import (Forward, Leapfrog, RecurrentCell, Reverse, forward_reverse,
                       store_all_reference)

SHM = Path("/dev/shm")


class DictStorage(Storage):
    """A user-defined Level-2: bytes in a dict (what a user's own backend would look like)."""

    def __init__(self) -> None:
        self.data: dict[int, bytes] = {}
        self.lock = threading.Lock()

    def put(self, key: int, buf: np.ndarray) -> None:
        with self.lock:
            assert key not in self.data
            self.data[key] = bytes(buf)

    def get(self, key: int, out: np.ndarray) -> None:
        with self.lock:
            out[:] = np.frombuffer(self.data[key], dtype=np.uint8)

    def delete(self, key: int) -> None:
        with self.lock:
            del self.data[key]

    def __contains__(self, key: object) -> bool:
        return key in self.data

    def close(self) -> None:
        self.data.clear()


def assert_bit_identical(got: list[np.ndarray], want: list[np.ndarray]) -> None:
    assert len(got) == len(want)
    for a, b in zip(got, want):
        assert a.dtype == b.dtype and a.shape == b.shape
        assert a.tobytes() == b.tobytes()


def storage_for(kind: str, root: Path):
    if kind == "dram":
        return None
    if kind == "tmpfs":
        return SHM if SHM.is_dir() else root
    if kind == "disk":
        return root
    return DictStorage()


MODELS = {"recurrent": RecurrentCell, "leapfrog": Leapfrog}


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(data=st.data())
def test_adjoints_equal_store_all_bit_for_bit(data: st.DataObject, tmp_path: Path) -> None:
    model_name = data.draw(st.sampled_from(sorted(MODELS)), label="model")
    n = data.draw(st.integers(1, 60), label="n")
    interval = data.draw(st.one_of(st.integers(1, n), st.just("auto")), label="interval")
    l1_slots = data.draw(st.integers(1, 6), label="l1_slots")
    kind = data.draw(st.sampled_from(["dram", "tmpfs", "disk", "user"]), label="storage")
    model = MODELS[model_name](n)
    reference = store_all_reference(model)
    with AsyncCheckpointer(model, Forward(model), Reverse(model), n, l1_slots=l1_slots,
                           interval=interval, storage=storage_for(kind, tmp_path)) as ckp:
        for _ in range(2):  # a second forward+reverse on the same checkpointer
            assert_bit_identical(forward_reverse(model, ckp), reference)
            model.trace.check_protocol(n)
            counts = simulate(ckp.schedule)
            assert (model.trace.forward_steps() == ckp.stats.forward_steps
                    == counts.forward_steps + ckp.stats.probe_steps)
            assert ckp.stats.reverse_steps == n
            assert ckp.stats.l2_writes == counts.l2_writes
            assert ckp.stats.l2_reads == counts.l2_reads
            assert ckp.stats.l1_peak_slots <= l1_slots


@pytest.mark.parametrize("dtype", [np.float32, np.float64, np.complex128])
def test_dtypes_and_several_arrays(dtype: type) -> None:
    n = 25
    a = np.zeros(7, dtype=dtype)
    b = np.zeros((3, 4), dtype=dtype)
    log: list[tuple[int, int]] = []

    class Fwd:
        def apply(self, *, t_start: int, t_end: int) -> None:
            for t in range(t_start, t_end):
                a[...] = a * 0.9 + (t + 1)
                b[...] = b + a[:4] * 0.5j if np.iscomplexobj(b) else b + a[:4] * 0.5

    seen: list[np.ndarray] = []

    class Rev:
        def apply(self, *, t_start: int, t_end: int) -> None:
            log.append((t_start, t_end))
            seen.append(np.concatenate([a.ravel(), b.ravel()]))

    def reference() -> list[np.ndarray]:
        a[...] = 0
        b[...] = 0
        states = []
        for t in range(n):
            Fwd().apply(t_start=t, t_end=t + 1)
            states.append(np.concatenate([a.ravel(), b.ravel()]))
        return states[::-1]

    want = reference()
    a[...] = 0
    b[...] = 0
    with AsyncCheckpointer(ArrayCheckpoint([a, b]), Fwd(), Rev(), n, l1_slots=2, interval=4) as ckp:
        ckp.apply_forward()
        ckp.apply_reverse()
    assert [x.tobytes() for x in seen] == [x.tobytes() for x in want]
    assert log == [(t, t + 1) for t in range(n - 1, -1, -1)]


class GatedStorage(HostMemoryStorage):
    """A DRAM Level-2 whose writes wait until the test opens the gate."""

    def __init__(self) -> None:
        super().__init__()
        self.gate = threading.Event()
        self.started = threading.Semaphore(0)

    def put(self, key: int, buf: np.ndarray) -> None:
        self.started.release()
        assert self.gate.wait(30), "the test never opened the gate"
        super().put(key, buf)

    def adopt(self, key: int, buffer: np.ndarray, nbytes: int) -> np.ndarray:
        self.started.release()
        assert self.gate.wait(30), "the test never opened the gate"
        return super().adopt(key, buffer, nbytes)


def test_forward_sweep_advances_while_writes_are_pending() -> None:
    n, interval, staging = 40, 4, 3
    model = RecurrentCell(n)
    storage = GatedStorage()
    steps_done: list[int] = []

    class Fwd(Forward):
        def apply(self, *, t_start: int, t_end: int) -> None:
            super().apply(t_start=t_start, t_end=t_end)
            steps_done.append(t_end)

    ckp = AsyncCheckpointer(model, Fwd(model), Reverse(model), n, l1_slots=2, interval=interval,
                            storage=storage, staging_buffers=staging)
    forward = threading.Thread(target=ckp.apply_forward, name="test-forward")
    try:
        forward.start()
        # The worker is blocked inside the first put: the forward sweep goes on until the one
        # write in progress plus the staging buffers behind it are all taken, then waits.
        assert storage.started.acquire(timeout=10)
        forward.join(timeout=1.0)
        assert forward.is_alive(), "the forward sweep should wait for a staging buffer"
        assert steps_done and max(steps_done) == staging * interval
        storage.gate.set()
        forward.join(timeout=30)
        assert not forward.is_alive()
        assert ckp.stats.write_stall_s > 0
        model.reset_adjoint()
        ckp.apply_reverse()
    finally:
        storage.gate.set()
        forward.join(timeout=30)
        ckp.close()
        storage.close()


def test_stats_describe_the_run() -> None:
    n = 100
    model = RecurrentCell(n)
    with AsyncCheckpointer(model, Forward(model), Reverse(model), n, l1_slots=3, interval=10) as ckp:
        forward_reverse(model, ckp)
        stats = ckp.stats
    counts = simulate(AsyncMultistage(n, 10, 3))
    assert stats.forward_steps == counts.forward_steps
    assert stats.recompute_factor == pytest.approx((counts.forward_steps - n) / n)
    assert stats.l2_writes == 10 and stats.l2_reads == 10
    assert stats.bytes_written == 10 * model.size * 8
    assert stats.interval == 10 and stats.l2_peak_states == 10
    assert stats.forward_s > 0 and stats.reverse_s > 0
    assert stats.l1_bytes == (3 + 2 + 2) * 4096
    assert set(stats.as_dict()) >= {"recompute_factor", "write_stall_s", "read_stall_s"}


def test_stats_count_the_descriptors_calls_apart() -> None:
    # a descriptor that takes 2 ms a call (Devito's takes tens of microseconds)
    class SlowDescriptor(RecurrentCell):
        calls = 0

        def get_data(self, t: int) -> list[np.ndarray]:
            SlowDescriptor.calls += 1
            time.sleep(0.002)
            return super().get_data(t)

        get_data_location = get_data

    n = 20
    model = SlowDescriptor(n)
    with AsyncCheckpointer(model, Forward(model), Reverse(model), n, l1_slots=n) as ckp:
        SlowDescriptor.calls = 0  # the constructor looked at u_0's arrays once
        forward_reverse(model, ckp)
        stats = ckp.stats
    # one call per copy in or out of Level-1, and the time they took counted apart
    assert SlowDescriptor.calls == stats.copies > 0
    assert 0.002 * stats.copies <= stats.descriptor_s < stats.total_s


def test_level1_footprint_does_not_grow_with_n() -> None:
    sizes = set()
    for n in (10, 1000, 100000):
        model = RecurrentCell(n)
        with AsyncCheckpointer(model, Forward(model), Reverse(model), n, l1_slots=4,
                               interval=min(n, 10)) as ckp:
            sizes.add(ckp.l1_bytes)
    assert len(sizes) == 1


def test_file_storage_leaves_nothing_behind(disk_dir: Path) -> None:
    n = 30
    model = Leapfrog(n)
    with AsyncCheckpointer(model, Forward(model), Reverse(model), n, l1_slots=2, interval=3,
                           storage=disk_dir) as ckp:
        model.reset()
        ckp.apply_forward()
        assert ckp.stats.l2_writes > 0
        assert list(disk_dir.iterdir()) == []  # the Level-2 file has no name
    assert list(disk_dir.iterdir()) == []


def test_forward_again_without_reverse_starts_a_new_run(shm_dir: Path) -> None:
    n = 20
    model = RecurrentCell(n)
    reference = store_all_reference(model)
    with AsyncCheckpointer(model, Forward(model), Reverse(model), n, l1_slots=2, interval=5,
                           storage=shm_dir) as ckp:
        model.reset()
        ckp.apply_forward()
        assert_bit_identical(forward_reverse(model, ckp), reference)


def test_auto_interval_calibrates_and_records_its_prediction() -> None:
    n = 200
    model = RecurrentCell(n)
    reference = store_all_reference(model)
    # Level-2 in DRAM by name: with l1_slots alone, storage=None keeps no state resident
    with AsyncCheckpointer(model, Forward(model), Reverse(model), n, l1_slots=3,
                           storage="dram") as ckp:
        for run_number in range(2):
            assert_bit_identical(forward_reverse(model, ckp), reference)
            calibration = ckp.stats.calibration
            assert 1 <= calibration["interval"] == ckp.stats.interval <= n
            assert calibration["tf_s"] > 0 and calibration["tw_s"] >= 0
            assert calibration["tb_measured"] is (run_number == 1)
            assert calibration["measured_over_predicted"] > 0
            assert calibration["tcall_s"] >= 0 and calibration["learned_runs"] == run_number
            # the probe runs 10 steps from u_0 on the first run only, then the schedule as it is
            assert ckp.stats.probe_steps == (10 if run_number == 0 else 0)
            assert model.trace.forward_steps() == ckp.stats.forward_steps == simulate(
                ckp.schedule).forward_steps + ckp.stats.probe_steps
            # the first run probed: priced from the probes, it is never doubted
            doubted = calibration["doubted"]
            assert doubted is False or run_number == 1
    assert "interval='auto'" in repr(ckp)
    # the next checkpointer of the same operators and state size starts from what was learned
    with AsyncCheckpointer(model, Forward(model), Reverse(model), n, l1_slots=3,
                           storage="dram") as ckp:
        assert_bit_identical(forward_reverse(model, ckp), reference)
        # (a second run beyond DOUBT times its prediction waits for the next to confirm it)
        learned = 1 if doubted else 2
        assert ckp.stats.probe_steps == 0 and ckp.stats.calibration["learned_runs"] == learned


@pytest.mark.parametrize("slots, interval, taping", [(12, "auto", True), (12, "auto", False),
                                                     (30, "auto", True), (6, 4, True),
                                                     (6, 4, False)])
def test_level1_slots_are_faulted_in_before_the_sweep_and_the_run_counts_them(
        slots, interval, taping) -> None:
    from asyncckpt._memory.pool import POOL
    from asyncckpt.storage import release_memory

    n = 12
    model = Leapfrog(n, points=1 << 16)
    reference = store_all_reference(model)
    release_memory()
    made_before_first_call = []

    class Counting(Forward):
        def apply(self, *, t_start: int, t_end: int) -> None:
            if not made_before_first_call:
                made_before_first_call.append(POOL.faults()[0])
            super().apply(t_start=t_start, t_end=t_end)

    with AsyncCheckpointer(model, Counting(model), Reverse(model), n, l1_slots=slots,
                           interval=interval, taping=taping) as ckp:
        made = POOL.faults()[0]
        assert_bit_identical(forward_reverse(model, ckp), reference)
        # store-all in Level-1 (12 or more slots): 11 states with taping (u_11 is never
        # stored), 12 without; interval 4: 2 with taping, 3 without
        held = ckp.schedule.l1_peak
        assert held == {(12, True): 11, (12, False): 12, (30, True): 11, (6, True): 2,
                        (6, False): 3}[slots, taping]
        # every slot it holds was faulted in before the first step, beside any the
        # checkpointer made at construction (to time a staging copy), and with Level-2 the
        # engine's 2 staging and 2 prefetch buffers
        made_by_run = made_before_first_call[0] - made
        engine = 0 if interval == "auto" else 4
        assert held - 1 <= made_by_run - engine <= held
        if interval == "auto":  # no Level-2 at all: nothing else is faulted in
            assert POOL.faults()[0] - made == made_by_run == ckp.stats.fresh_buffers


def test_auto_prices_the_first_touch_of_memory_and_the_next_run_finds_it_warm() -> None:
    from asyncckpt.storage import release_memory

    n = 24
    model = Leapfrog(n, points=1 << 19)  # states of 4 MiB: the fault probe makes 8 of them
    release_memory()
    reference = store_all_reference(model)
    runs = []
    for _ in range(2):
        with AsyncCheckpointer(model, Forward(model), Reverse(model), n, l1_slots=2,
                               storage="dram") as ckp:  # owned: closed into the pool
            assert_bit_identical(forward_reverse(model, ckp), reference)
            runs.append((dict(ckp.stats.calibration), ckp.stats.l2_writes, ckp.stats))
    (first, writes, stats), (second, _, again) = runs
    assert first["fault_s"] > 0 and first["predicted_faults_s"] >= 0
    assert stats.fresh_buffers > 0 and stats.fresh_s > 0  # 23 states, 8 buffers from the probe
    # not probed again: remembered, and revised by the buffers the first run faulted in
    assert second["fault_s"] == pytest.approx(
        (PRIOR_TRANSFERS * first["fault_s"] + stats.fresh_s)
        / (PRIOR_TRANSFERS + stats.fresh_buffers))
    assert again.fresh_buffers == 0 and again.fresh_s == 0.0  # the second run's memory was warm
    # each Level-2 state of the first run had a buffer of its own, now in the pool
    assert writes > 0 and second["warm_buffers"] >= writes
    assert first["measured_over_predicted"] > 0 and second["measured_over_predicted"] > 0


def test_auto_interval_with_one_step() -> None:
    model = Leapfrog(1)
    reference = store_all_reference(model)
    with AsyncCheckpointer(model, Forward(model), Reverse(model), 1, l1_slots=1) as ckp:
        assert_bit_identical(forward_reverse(model, ckp), reference)
        assert ckp.stats.interval == 0  # u_0 fits in Level-1: no Level-2 at all
        assert ckp.stats.l2_writes == ckp.stats.l2_reads == 0


def test_interval_names_the_accepted_values() -> None:
    model = RecurrentCell(5)
    with pytest.raises(ValueError, match=r"interval must be an int in \[0, 5\] or 'auto' or 'adaptive', got 'fast'"):
        AsyncCheckpointer(model, Forward(model), Reverse(model), 5, l1_slots=1, interval="fast")
