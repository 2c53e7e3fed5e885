"""keep_forward=True: several reverse sweeps over one forward sweep, each with its own adjoint
seed, each bitwise equal to a fresh forward and reverse sweep with that seed, none running a
forward sweep (no Level-2 write, no forward time)."""
from __future__ import annotations

import pytest

from asyncckpt import AsyncCheckpointer
from asyncckpt.errors import TransferError, UsageError
from faults import FaultyFile, FaultyMemory
from workloads import Forward, RecurrentCell, Reverse

N, SEEDS = 40, (1.0, -2.0, 0.5)


def seeded(model: RecurrentCell, seed: float) -> None:
    """The adjoint's seed: another objective, another receiver line."""
    model.reset_adjoint()
    model.lam_h *= seed
    model.lam_c += seed


def fresh_gradients(seed: float, **options) -> list[bytes]:
    model = RecurrentCell(N)
    with AsyncCheckpointer(model, Forward(model), Reverse(model), N, l1_slots=2, **options) as ckp:
        ckp.apply_forward()
        seeded(model, seed)
        ckp.apply_reverse()
    return [g.tobytes() for g in model.gradients()]


@pytest.mark.parametrize("storage", [None, "disk"])
def test_three_seeds_reverse_one_forward_sweep(storage, tmp_path):
    options = {"interval": 6, "storage": None if storage is None else str(tmp_path)}
    expected = [fresh_gradients(seed, **options) for seed in SEEDS]
    model = RecurrentCell(N)
    with AsyncCheckpointer(model, Forward(model), Reverse(model), N, l1_slots=2,
                           keep_forward=True, **options) as ckp:
        ckp.apply_forward()
        for index, (seed, want) in enumerate(zip(SEEDS, expected)):
            seeded(model, seed)
            if index:  # the first reverse step is taped by the forward sweep's last call
                model.trace.calls.clear()
            ckp.apply_reverse()
            assert [g.tobytes() for g in model.gradients()] == want, seed
            model.trace.check_protocol(N)
            assert ckp.stats.reverse_steps == N
            if index:  # no forward sweep: nothing written to Level-2, no forward time
                assert ckp.stats.l2_writes == 0 and ckp.stats.forward_s == 0.0
                assert ckp.stats.l2_reads == len(range(0, N, 6))
        # a new run abandons the kept one and runs as a fresh checkpointer would
        model.reset()
        ckp.apply_forward()
        seeded(model, SEEDS[0])
        ckp.apply_reverse()
        assert [g.tobytes() for g in model.gradients()] == expected[0]


def test_without_keep_forward_a_second_reverse_is_refused():
    model = RecurrentCell(N)
    with AsyncCheckpointer(model, Forward(model), Reverse(model), N, l1_slots=2,
                           interval=6) as ckp:
        ckp.apply_forward()
        ckp.apply_reverse()
        with pytest.raises(UsageError, match="needs a completed apply_forward"):
            ckp.apply_reverse()


def test_keep_forward_needs_states_on_level2(tmp_path):
    model = RecurrentCell(N)
    with AsyncCheckpointer(model, Forward(model), Reverse(model), N, l1_slots=N,
                           keep_forward=True) as ckp:  # store-all in Level-1
        ckp.apply_forward()
        ckp.apply_reverse()
        with pytest.raises(UsageError, match="keeps none there"):
            ckp.apply_reverse()
    with pytest.raises(UsageError, match="keep_forward=True with run_dir"):
        AsyncCheckpointer(model, Forward(model), Reverse(model), N, l1_slots=2,
                          keep_forward=True, run_dir=tmp_path / "run")


@pytest.mark.parametrize("storage", ["dram", "disk"])
def test_a_transient_read_error_raises_once_and_the_next_reverse_is_exact(storage, tmp_path):
    """Under on_level2_error="raise", a read that fails once (an EIO on one get) raises on that
    apply_reverse(); the states on Level-2 are intact, so the next apply_reverse() runs from
    them, bitwise equal to a fresh run's (it raised "broken by an earlier failure" before)."""
    options = {"interval": 6}
    want = fresh_gradients(SEEDS[1], **options)
    level2 = FaultyMemory() if storage == "dram" else FaultyFile(tmp_path)
    model = RecurrentCell(N)
    with AsyncCheckpointer(model, Forward(model), Reverse(model), N, l1_slots=2,
                           keep_forward=True, storage=level2, **options) as ckp:
        ckp.apply_forward()
        level2.fail_get_at = level2.gets + 2  # the second read of the reverse sweep
        seeded(model, SEEDS[0])
        with pytest.raises(TransferError, match="Input/output error"):
            ckp.apply_reverse()
        for _ in range(2):  # the fault is gone: every further reverse sweep is exact
            seeded(model, SEEDS[1])
            ckp.apply_reverse()
            assert [g.tobytes() for g in model.gradients()] == want
            assert ckp.stats.reverse_steps == N and ckp.stats.l2_writes == 0
    level2.close()


def test_a_failed_forward_write_is_not_reversed_again():
    """The forward sweep's last write fails after apply_forward() returned (it is still under
    way then): the reverse that finds it raises, and so does every later one, never a
    gradient from a state that is not there."""
    stores = len(range(0, N, 6))
    level2 = FaultyMemory(fail_put_at=stores, delay=(0.05, 0.05))
    model = RecurrentCell(N)
    with AsyncCheckpointer(model, Forward(model), Reverse(model), N, l1_slots=2, interval=6,
                           keep_forward=True, storage=level2, transfers="background") as ckp:
        ckp.apply_forward()
        for _ in range(2):
            with pytest.raises(TransferError):
                ckp.apply_reverse()
