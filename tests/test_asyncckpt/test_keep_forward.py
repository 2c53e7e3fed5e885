"""keep_forward=True: several reverse sweeps over one forward sweep, each with its own adjoint
seed, each bitwise equal to a fresh forward and reverse sweep with that seed, none running a
forward sweep (no Level-2 write, no forward time)."""
from __future__ import annotations

import pytest

from asyncckpt import AsyncCheckpointer
from asyncckpt.errors import UsageError
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
