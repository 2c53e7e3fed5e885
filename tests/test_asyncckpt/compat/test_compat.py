"""asyncckpt.compat.Revolver against pyrevolve.Revolver on the same user objects."""
from __future__ import annotations

import importlib.util
import subprocess
import sys

import numpy as np
import pytest

from asyncckpt import FileStorage, UsageError
from asyncckpt.compat import Checkpoint, Operator, Revolver, choose_l1_slots
from workloads import (Forward, Leapfrog, RecurrentCell, Reverse, forward_reverse,
                       store_all_reference)

pyrevolve = pytest.importorskip("pyrevolve")


class PyrevolveLeapfrog(pyrevolve.Checkpoint):
    """A user's checkpoint written for pyrevolve: subclasses pyrevolve's own class."""

    def __init__(self, model: Leapfrog) -> None:
        self.model = model

    @property
    def size(self) -> int:
        return self.model.size

    @property
    def dtype(self):
        return self.model.dtype

    def get_data(self, timestep: int):
        return self.model.get_data(timestep)

    def get_data_location(self, timestep: int):
        return self.model.get_data_location(timestep)


def run(revolver_class, model, checkpoint, slots: int, n: int) -> list[np.ndarray]:
    model.reset()
    model.trace.calls.clear()
    revolver = revolver_class(checkpoint, Forward(model), Reverse(model), slots, n)
    revolver.apply_forward()
    model.reset_adjoint()
    revolver.apply_reverse()
    model.trace.check_protocol(n)
    if hasattr(revolver, "close"):
        revolver.close()
    return model.gradients()


@pytest.mark.parametrize(("slots", "n"), [(1, 2), (2, 10), (3, 37), (5, 100), (10, 250), (30, 31)])
@pytest.mark.parametrize("workload", ["leapfrog", "recurrent"])
def test_same_adjoints_as_pyrevolve(slots: int, n: int, workload: str) -> None:
    if workload == "leapfrog":
        model = Leapfrog(n)
        checkpoint = PyrevolveLeapfrog(model)
    else:
        model = RecurrentCell(n)
        checkpoint = model
    theirs = run(pyrevolve.Revolver, model, checkpoint, slots, n)
    ours = run(Revolver, model, checkpoint, slots, n)
    for a, b in zip(ours, theirs):
        assert a.tobytes() == b.tobytes()


class CountedSteps:
    """An operator that counts the steps it is asked to run."""

    def __init__(self, operator, steps: dict[str, int], key: str) -> None:
        self.operator, self.steps, self.key = operator, steps, key

    def apply(self, **steps: int) -> None:
        self.steps[self.key] += steps["t_end"] - steps["t_start"]
        self.operator.apply(**steps)


class Counted:
    """What a pyrevolve program can observe of a revolver: its calls of the checkpoint's methods
    and the steps its operators are asked for, after construction, the forward and the reverse."""

    def __init__(self, model: RecurrentCell) -> None:
        self.model, self.stores, self.loads = model, 0, 0
        self.size, self.dtype = model.size, model.dtype
        self.steps = {"fwd": 0, "rev": 0}

    def get_data(self, timestep: int):
        self.stores += 1
        return self.model.get_data(timestep)

    def get_data_location(self, timestep: int):
        self.loads += 1
        return self.model.get_data_location(timestep)

    def observe(self, revolver_class, slots: int, n: int, **options) -> tuple[list, list]:
        """The counts after each phase, and the gradients."""
        fwd = CountedSteps(Forward(self.model), self.steps, "fwd")
        rev = CountedSteps(Reverse(self.model), self.steps, "rev")
        self.model.reset()
        revolver = revolver_class(self, fwd, rev, slots, n, **options)
        counts = [(self.stores, self.loads, dict(self.steps))]
        revolver.apply_forward()
        counts.append((self.stores, self.loads, dict(self.steps)))
        self.model.reset_adjoint()
        revolver.apply_reverse()
        counts.append((self.stores, self.loads, dict(self.steps)))
        if hasattr(revolver, "close"):
            revolver.close()
        return counts, [g.copy() for g in self.model.gradients()]


@pytest.mark.parametrize(("n", "slots"), [(10, 2), (10, 4), (10, 9), (10, 12), (50, 3),
                                          (100, 7), (2, 1)])
def test_with_its_slots_alone_it_is_pyrevolves_revolver(n: int, slots: int) -> None:
    """No Level-2 named: Revolve in the slots, as pyrevolve; nothing is called at construction,
    the forward sweep stores as often and advances as far, and the run as a whole recomputes as
    much (where several splits are optimal the stores of the reverse sweep may differ)."""
    ours, got = Counted(RecurrentCell(n)).observe(Revolver, slots, n)
    theirs, want = Counted(RecurrentCell(n)).observe(
        pyrevolve.Revolver, min(slots, max(n - 1, 1)), n)
    assert ours[0] == theirs[0] == (0, 0, {"fwd": 0, "rev": 0})
    assert ours[1] == theirs[1]
    assert ours[2][2] == theirs[2][2]
    assert ours[2][1] >= ours[2][0] - ours[1][0]  # every state stored is read back
    assert all(a.tobytes() == b.tobytes() for a, b in zip(got, want))


def test_a_named_level2_makes_it_asynchronous(disk_dir) -> None:
    n, slots = 40, 2
    codec = ([{"compression_params": {"scheme": "blosc"}}]
             if importlib.util.find_spec("blosc2") else [])  # the compression extra's
    for options in ({"interval": 4}, {"storage": disk_dir}, {"memory_budget": 10**7}, *codec):
        model = RecurrentCell(n)
        reference = store_all_reference(model)
        with Revolver(model, Forward(model), Reverse(model), slots, n, **options) as revolver:
            got = forward_reverse(model, revolver)
            assert revolver.stats.interval > 0, options
            assert revolver.stats.l2_writes > 0, options
        assert all(a.tobytes() == b.tobytes() for a, b in zip(got, reference))
    with Revolver(model, Forward(model), Reverse(model), slots, n) as alone:
        forward_reverse(model, alone)
        assert alone.stats.interval == 0 and alone.stats.l2_writes == 0
        assert alone.stats.l1_peak_slots == slots


def test_a_revolver_closed_before_its_first_run() -> None:
    model = RecurrentCell(5)
    revolver = Revolver(model, Forward(model), Reverse(model), 2, 5)
    revolver.close()
    with pytest.raises(UsageError, match="the Revolver is closed"):
        revolver.apply_forward()
    assert "not yet run" in repr(revolver)


def test_first_reverse_step_directly_follows_the_forward_sweep() -> None:
    n = 20
    model = RecurrentCell(n)
    with Revolver(model, Forward(model), Reverse(model), 3, n, interval=4) as revolver:
        model.reset()
        revolver.apply_forward()
        last_forward = model.trace.calls[-1]
        assert last_forward[0] == "fwd" and last_forward[2] == n
        count = len(model.trace.calls)
        revolver.apply_reverse()
        assert model.trace.calls[count] == ("rev", n - 1)


def test_ratio_matches_pyrevolves_definition() -> None:
    n, slots = 100, 5
    model = RecurrentCell(n)
    theirs = pyrevolve.Revolver(model, Forward(model), Reverse(model), slots, n)
    with Revolver(model, Forward(model), Reverse(model), slots, n, interval=n) as ours:
        # interval n: one interval, so Revolve with one more slot than pyrevolve's
        flat = pyrevolve.Revolver(model, Forward(model), Reverse(model), slots + 1, n)
        assert ours.ratio == pytest.approx(flat.ratio)
    assert theirs.ratio > 0
    with Revolver(model, Forward(model), Reverse(model), slots, n) as same:
        assert same.ratio == pytest.approx(theirs.ratio)  # pyrevolve's Revolve in its slots
    with Revolver(model, Forward(model), Reverse(model), slots, n, interval="auto") as auto:
        assert np.isnan(auto.ratio)
        model.reset()
        auto.apply_forward()
        assert auto.ratio >= 1.0 - 1 / n


def test_a_second_forward_starts_a_new_run() -> None:
    n = 15
    model = RecurrentCell(n)
    with Revolver(model, Forward(model), Reverse(model), 2, n) as revolver:
        model.reset()
        revolver.apply_forward()
        model.reset()
        revolver.apply_forward()
        model.reset_adjoint()
        revolver.apply_reverse()
        model.trace.check_protocol(n)


def test_zero_checkpoints_and_one_step() -> None:
    model = RecurrentCell(5)
    with pytest.raises(ValueError, match="n_checkpoints must be >= 1"):
        Revolver(model, Forward(model), Reverse(model), 0, 5)
    with pytest.raises(TypeError, match="n_checkpoints must be an int, got '3'"):
        Revolver(model, Forward(model), Reverse(model), "3", 5)  # before any apply_forward
    with Revolver(model, Forward(model), Reverse(model), 2, None) as unknown:
        with pytest.raises(UsageError, match=r"n_timesteps=None: apply_forward\(stop=callable\)"):
            unknown.apply_forward()
    single = RecurrentCell(1)
    with Revolver(single, Forward(single), Reverse(single), 1, 1) as revolver:
        single.reset()
        revolver.apply_forward()
        single.reset_adjoint()
        revolver.apply_reverse()
    single.trace.check_protocol(1)


def test_none_checkpoints_chooses_from_free_memory() -> None:
    assert choose_l1_slots(1000, 50, available=10**9) == 50
    assert choose_l1_slots(10**8, 10**6, available=4 * 10**9) == 9 - 4  # 9 padded states fit
    with pytest.raises(MemoryError, match="no room for a Level-1 slot"):
        choose_l1_slots(10**9, 10, available=10**9)
    model = RecurrentCell(8)
    with Revolver(model, Forward(model), Reverse(model), None, 8) as revolver:
        assert revolver.n_checkpoints == 7  # store-all in Level-1: n - 1 states under taping
        assert revolver.checkpointer.in_level1


def test_none_checkpoints_takes_a_memory_budget(monkeypatch, tmp_path) -> None:
    """``n_checkpoints=None`` runs within a budget ($ASYNCCKPT_MEMORY_BUDGET, else a quarter of
    the available memory) shared by Level-1 and DRAM Level-2, spilling the rest."""
    from asyncckpt import TieredStorage
    from asyncckpt._memory.buffers import padded
    from asyncckpt.checkpoint import check_descriptor
    from asyncckpt.compat import default_budget
    from asyncckpt.planning import engine_buffers

    model = RecurrentCell(120)
    buffer = padded(check_descriptor(model))
    monkeypatch.setenv("ASYNCCKPT_MEMORY_BUDGET", str(20 * buffer))
    monkeypatch.setenv("ASYNCCKPT_STORAGE", "")
    monkeypatch.setattr("tempfile.tempdir", str(tmp_path))
    with Revolver(model, Forward(model), Reverse(model), None, 120) as revolver:
        ckp = revolver.checkpointer
        assert ckp.memory_budget == 20 * buffer
        assert isinstance(ckp.storage, TieredStorage)
        model.reset()
        revolver.apply_forward()
        model.reset_adjoint()
        revolver.apply_reverse()

        def held(slots: int, interval: int) -> int:
            # Level-1 alone (interval 0, which "auto" may choose after a run) holds no engine
            # buffers and writes nothing to the DRAM tier
            if interval == 0:
                return slots * buffer
            return (slots + engine_buffers()) * buffer + ckp.storage.byte_limits[0]
        assert held(ckp.stats.l1_slots, ckp.stats.interval) <= 20 * buffer  # the run
        assert held(ckp.l1_slots, ckp.interval) <= 20 * buffer  # the next run's plan
    monkeypatch.setenv("ASYNCCKPT_MEMORY_BUDGET", "a lot")
    with pytest.raises(ValueError, match="ASYNCCKPT_MEMORY_BUDGET must be a number of bytes"):
        Revolver(model, Forward(model), Reverse(model), None, 120)
    monkeypatch.delenv("ASYNCCKPT_MEMORY_BUDGET")
    assert default_budget(1000, available=4 * 10**9) == 10**9
    with pytest.raises(MemoryError, match="no room for a Level-1 slot"):
        default_budget(10**9, available=10**9)


def test_storage_and_interval_from_the_environment(monkeypatch, disk_dir) -> None:
    monkeypatch.setenv("ASYNCCKPT_STORAGE", str(disk_dir))
    monkeypatch.setenv("ASYNCCKPT_INTERVAL", "3")
    model = RecurrentCell(10)
    with Revolver(model, Forward(model), Reverse(model), 2, 10) as revolver:
        assert revolver.checkpointer.interval == 3
        storage = revolver.checkpointer.storage
        assert isinstance(storage, FileStorage) and storage.path == disk_dir
    assert list(disk_dir.iterdir()) == []


def test_bad_interval_in_the_environment(monkeypatch) -> None:
    monkeypatch.setenv("ASYNCCKPT_INTERVAL", "often")
    model = RecurrentCell(10)
    with pytest.raises(ValueError, match="ASYNCCKPT_INTERVAL must be an int >= 0 or "
                                         "'auto' or 'adaptive', got 'often'"):
        Revolver(model, Forward(model), Reverse(model), 2, 10)


def test_base_classes() -> None:
    class Fwd(Operator):
        def apply(self, **kwargs) -> None:
            pass

    Fwd().apply(t_start=0, t_end=1)
    with pytest.raises(TypeError):
        Operator()  # type: ignore[abstract]

    class Desc(Checkpoint):
        size = 4
        dtype = np.float32

        def get_data(self, t):
            return [np.zeros(4, np.float32)]

        def get_data_location(self, t):
            return self.get_data(t)

    assert Desc().nbytes == 16


def test_compat_does_not_import_pyrevolve() -> None:
    code = "import sys, asyncckpt.compat; print('pyrevolve' in sys.modules)"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "False"
