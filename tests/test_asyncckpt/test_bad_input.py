"""Bad input is rejected at construction (or at the call) with an error naming the value."""
from __future__ import annotations

import re
from pathlib import Path

import numpy as np
import pytest

from asyncckpt import (ArrayCheckpoint, AsyncCheckpointer, CheckpointError, ScheduleError,
                       UsageError)
from workloads import Forward, RecurrentCell, Reverse


def make(n: int = 10, **overrides):
    model = RecurrentCell(max(n, 1) if isinstance(n, int) and not isinstance(n, bool) else 5)
    kwargs = dict(l1_slots=2, interval=2)
    kwargs.update(overrides)
    checkpoint = kwargs.pop("checkpoint", model)
    fwd = kwargs.pop("fwd", Forward(model))
    rev = kwargs.pop("rev", Reverse(model))
    return AsyncCheckpointer(checkpoint, fwd, rev, n, **kwargs)


@pytest.mark.parametrize(
    ("kwargs", "error", "message"),
    [
        (dict(n=0), ValueError, r"n_timesteps must be an int in \[1, \d+\], got 0"),
        (dict(n=-5), ValueError, r"n_timesteps must be an int in \[1, \d+\], got -5"),
        (dict(n=2.0), TypeError, "n_timesteps must be an int, got 2.0"),
        (dict(n="10"), TypeError, "n_timesteps must be an int"),
        (dict(l1_slots=0), ValueError, "l1_slots must be >= 1, got 0"),
        (dict(interval=-1), ValueError, r"interval must be an int in \[0, 10\], got -1"),
        (dict(interval=11), ValueError, r"interval must be an int in \[0, 10\], got 11"),
        (dict(interval="fast"), ValueError, r"interval must be an int in \[0, 10\] or 'auto' or "
                                            "'adaptive', got 'fast'"),
        (dict(interval=None), TypeError, "interval must be an int"),
        (dict(staging_buffers=0), ValueError, "staging_buffers must be >= 1, got 0"),
        (dict(transfers="sometimes"), ValueError, "transfers must be one of 'auto', 'background', "
                                                  "'inline', got 'sometimes'"),
        (dict(on_level2_error="ignore"), ValueError, "on_level2_error must be one of 'raise', "
                                                     "'recompute', got 'ignore'"),
        (dict(taping=0), TypeError, "taping must be True, False or None \\(decide\\), got 0"),
        (dict(fwd=object()), TypeError, "fwd_operator must have an apply"),
        (dict(rev=lambda t: t), TypeError, "rev_operator must have an apply"),
        (dict(storage=42), TypeError, "storage must be None or .dram. .* got int"),
    ],
)
def test_bad_arguments(kwargs: dict, error: type, message: str) -> None:
    """Each names the value and what is accepted, and is a CheckpointError as well as the
    built-in error a caller would catch."""
    n = kwargs.pop("n", 10)
    with pytest.raises(error, match=message) as raised:
        make(n, **kwargs)
    assert isinstance(raised.value, CheckpointError)


def test_storage_path_that_is_a_file(tmp_path: Path) -> None:
    target = tmp_path / "not-a-dir"
    target.write_text("")
    with pytest.raises(ValueError, match="is not a directory"):
        make(storage=target)


def test_storage_path_that_cannot_be_created() -> None:
    with pytest.raises(ValueError, match="cannot be created"):
        make(storage="/proc/no/such/place")


class Incomplete:
    size = 10
    dtype = np.float64

    def get_data(self, t: int) -> list[np.ndarray]:
        return [np.zeros(10)]


def test_descriptor_missing_methods() -> None:
    with pytest.raises(TypeError, match="lacks get_data_location"):
        make(checkpoint=Incomplete())
    with pytest.raises(TypeError, match="lacks size, dtype"):
        make(checkpoint=object())


class Mismatched(Incomplete):
    def __init__(self, arrays: list[np.ndarray], size: int = 10, dtype: type = np.float64) -> None:
        self.arrays, self.size, self.dtype = arrays, size, dtype

    def get_data(self, t: int) -> list[np.ndarray]:
        return self.arrays

    def get_data_location(self, t: int) -> list[np.ndarray]:
        return self.arrays


@pytest.mark.parametrize(
    ("checkpoint", "error", "message"),
    [
        (Mismatched([np.zeros(11)]), ValueError, "holds 88 bytes, more than the checkpoint "
                                                 "declares: 80"),
        (Mismatched([np.zeros(10, np.float32)]), TypeError, "dtype float32, the checkpoint declares float64"),
        (Mismatched([[0.0] * 10]), TypeError, r"get_data\(0\)\[0\] is a list, expected numpy.ndarray"),
        (Mismatched([np.zeros(10)], size=0), ValueError, "checkpoint.size must be a positive int, got 0"),
        (Mismatched([np.zeros(10)], dtype="not-a-dtype"), TypeError, "is not a numpy dtype"),
    ],
)
def test_descriptor_arrays_disagree(checkpoint: object, error: type, message: str) -> None:
    with pytest.raises(error, match=message):
        make(checkpoint=checkpoint)


def test_array_checkpoint_validation() -> None:
    with pytest.raises(ValueError, match="at least one array"):
        ArrayCheckpoint([])
    with pytest.raises(TypeError, match="of different dtypes are stored as their bytes"):
        ArrayCheckpoint([np.zeros(2), np.zeros((4, 4), np.float32)[:, 1]])
    with pytest.raises(TypeError, match=r"arrays\[1\] must be a numpy.ndarray"):
        ArrayCheckpoint([np.zeros(2), [1.0]])


def test_non_contiguous_arrays_are_copied_correctly() -> None:
    n = 12
    base = np.zeros((6, 8))
    view = base[::2, 1::3]  # not contiguous
    seen: list[bytes] = []

    class Fwd:
        def apply(self, *, t_start: int, t_end: int) -> None:
            for t in range(t_start, t_end):
                view[...] = view * 0.5 + t

    class Rev:
        def apply(self, *, t_start: int, t_end: int) -> None:
            seen.append(view.tobytes())

    expected = []
    for t in range(n):
        Fwd().apply(t_start=t, t_end=t + 1)
        expected.append(view.tobytes())
    base[...] = 0
    with AsyncCheckpointer(ArrayCheckpoint([view]), Fwd(), Rev(), n, l1_slots=2, interval=3) as ckp:
        ckp.apply_forward()
        ckp.apply_reverse()
    assert seen == expected[::-1]


def test_reverse_before_forward_and_after_close() -> None:
    ckp = make()
    with pytest.raises(UsageError, match="needs a completed apply_forward"):
        ckp.apply_reverse()
    ckp.close()
    with pytest.raises(UsageError, match="closed"):
        ckp.apply_forward()
    with pytest.raises(ValueError, match="closed"):  # as before the hierarchy
        ckp.apply_reverse()
    ckp.close()  # twice is fine


def test_one_base_catches_every_library_error() -> None:
    import asyncckpt

    errors = [getattr(asyncckpt, name) for name in asyncckpt.__all__ if name.endswith("Error")]
    assert len(errors) == 12
    for error in errors:
        assert issubclass(error, asyncckpt.CheckpointError), error
    for error, builtin in [("InvalidValueError", ValueError), ("InvalidTypeError", TypeError),
                           ("ScheduleError", ValueError), ("UsageError", ValueError),
                           ("StorageKeyError", KeyError), ("MemoryBudgetError", MemoryError)]:
        assert issubclass(getattr(asyncckpt, error), builtin), error


def test_a_prefetch_beyond_the_buffers_is_a_schedule_error() -> None:
    """A schedule that prefetches more states than there are buffers is refused on the
    caller's thread, naming the state and the buffers in use, with no read started."""
    from asyncckpt import HostMemoryStorage
    from asyncckpt._execution.engine import TransferEngine

    with HostMemoryStorage() as storage:
        engine = TransferEngine(storage, 64, staging_buffers=1, prefetch_buffers=1,
                                io_threads=1, verify=True, on_error="raise")
        engine.buffers.equip()
        try:
            state = [np.arange(8, dtype=np.float64)]
            engine.store(0, state)
            engine.store(1, state)
            engine.prefetch(1)
            with pytest.raises(ScheduleError, match=r"prefetch of u_0: every prefetch buffer is "
                                                    r"in use \(holding \[1\]\)"):
                engine.prefetch(0)
            assert engine.counters.reads == 1
        finally:
            engine.close()


@pytest.mark.parametrize("verify", [None, 0, "", [], 1, "yes"])
def test_verify_must_be_a_bool_not_something_falsy(verify) -> None:
    """A falsy non-bool used to turn checksums off silently (a corrupting Level-2 then gives a
    wrong gradient with no error)."""
    with pytest.raises(CheckpointError, match="verify must be True or False"):
        make(verify=verify)


@pytest.mark.parametrize(("kwargs", "message"), [
    (dict(n=2**70), "n_timesteps must be an int in"),
    (dict(blas_threads=2**70), "blas_threads must be an int in"),
    (dict(transfers=np.array([1, 2])), "transfers must be one of"),
    (dict(transfers=np.array(["inline"])), "transfers must be one of"),
])
def test_huge_and_array_values_get_a_checkpoint_error_naming_them(kwargs, message) -> None:
    with pytest.raises(CheckpointError, match=message):
        make(**kwargs)


def test_an_array_instead_of_a_list_of_arrays_is_named() -> None:
    with pytest.raises(CheckpointError, match=r"a list of the arrays.*ArrayCheckpoint\(\[array\]\)"):
        ArrayCheckpoint(np.zeros(4))


class Positional:
    def apply(self, a, b):  # pyrevolve's protocol passes t_start= and t_end=
        pass


class KeywordOnly:
    def apply(self, *, t_start, t_end, **rest):
        pass


def test_an_apply_that_cannot_take_the_keywords_fails_at_construction() -> None:
    with pytest.raises(CheckpointError, match=r"fwd_operator.apply\(a, b\) cannot be called"):
        make(fwd=Positional())
    with pytest.raises(CheckpointError, match=r"rev_operator.apply"):
        make(rev=Positional())
    make(fwd=KeywordOnly(), rev=KeywordOnly()).close()


@pytest.mark.parametrize("spec", ["ram", "memory", "Memory", "ckpts", "$ASYNCCKPT_NOT_SET_X",
                                  "$ASYNCCKPT_NOT_SET_X/deeper"])
def test_storage_specs_that_look_like_typos_are_refused_with_the_accepted_forms(
        spec, tmp_path: Path, monkeypatch) -> None:
    monkeypatch.chdir(tmp_path)
    monkeypatch.delenv("ASYNCCKPT_NOT_SET_X", raising=False)
    with pytest.raises(CheckpointError, match="storage="):
        make(storage=spec)
    assert list(tmp_path.iterdir()) == []  # no directory made under the current one


def test_home_and_environment_variables_are_expanded(tmp_path: Path, monkeypatch) -> None:
    monkeypatch.setenv("ASYNCCKPT_TEST_LEVEL2", str(tmp_path / "level2"))
    monkeypatch.setenv("HOME", str(tmp_path))
    for spec, where in (("$ASYNCCKPT_TEST_LEVEL2", tmp_path / "level2"),
                        ("~/ckpts", tmp_path / "ckpts")):
        with make(storage=spec) as ckp:
            assert Path(ckp.storage.path) == where
            ckp.apply_forward()
            ckp.apply_reverse()
        assert not where.exists()  # made for the run, removed by close()


class Reentrant(Forward):
    """A forward operator that calls back into its checkpointer."""

    def __init__(self, model, call: str) -> None:
        super().__init__(model)
        self.call, self.checkpointer = call, None

    def apply(self, *, t_start, t_end):
        if t_end >= 4 and self.checkpointer is not None:
            getattr(self.checkpointer, self.call)()
        super().apply(t_start=t_start, t_end=t_end)


@pytest.mark.parametrize("call", ["apply_forward", "apply_reverse", "close"])
def test_a_call_from_inside_an_operator_is_a_usage_error(call: str) -> None:
    model = RecurrentCell(10)
    fwd = Reentrant(model, call)
    with AsyncCheckpointer(model, fwd, Reverse(model), 10, l1_slots=2, interval=2) as ckp:
        fwd.checkpointer = ckp
        with pytest.raises(UsageError, match=f"{call}\\(\\) from inside an operator"):
            ckp.apply_forward()
        fwd.checkpointer = None
        ckp.apply_forward()  # still usable: the refused call changed nothing
        ckp.apply_reverse()


def test_a_call_from_another_thread_during_a_sweep_is_a_usage_error() -> None:
    import threading

    model = RecurrentCell(10)
    started, release = threading.Event(), threading.Event()

    class Slow(Forward):
        def apply(self, *, t_start, t_end):
            if t_end >= 4 and not release.is_set():
                started.set()
                release.wait(10)
            super().apply(t_start=t_start, t_end=t_end)

    with AsyncCheckpointer(model, Slow(model), Reverse(model), 10, l1_slots=2,
                           interval=2) as ckp:
        runner = threading.Thread(target=ckp.apply_forward)
        runner.start()
        try:
            assert started.wait(10)
            for call in (ckp.apply_forward, ckp.apply_reverse, ckp.close):
                with pytest.raises(UsageError, match="from another thread"):
                    call()
        finally:
            release.set()
            runner.join(10)
        ckp.apply_reverse()


class _Rebinding:
    """A leapfrog whose forward step rebinds its names to new arrays instead of writing the
    descriptor's arrays: the checkpointer would store and restore u_0 at every step."""

    def __init__(self) -> None:
        self.prev, self.cur = np.zeros(64), np.linspace(0.0, 1.0, 64)
        self.checkpoint = ArrayCheckpoint([self.prev, self.cur])

    def apply(self, *, t_start: int, t_end: int) -> None:
        for _ in range(t_start, t_end):
            new = 2.0 * self.cur - self.prev + 0.01 * np.roll(self.cur, 1)
            self.prev, self.cur = self.cur, new


class _InPlaceFromZeros:
    """The same leapfrog in place, from a state of zeros until a source at step 3."""

    def __init__(self) -> None:
        self.prev, self.cur = np.zeros(64), np.zeros(64)
        self.checkpoint = ArrayCheckpoint([self.prev, self.cur])

    def apply(self, *, t_start: int, t_end: int) -> None:
        for t in range(t_start, t_end):
            new = 2.0 * self.cur - self.prev + 0.01 * np.roll(self.cur, 1) + (t == 3)
            self.prev[:] = self.cur
            self.cur[:] = new


class _Nothing:
    def apply(self, *, t_start: int, t_end: int) -> None:
        pass


@pytest.mark.parametrize("interval", [0, 4, "auto"])
def test_a_forward_step_that_rebinds_its_arrays_is_refused(interval) -> None:
    """It gave an adjoint off by over 100% with no error."""
    model = _Rebinding()
    with AsyncCheckpointer(model.checkpoint, model, _Nothing(), 20, l1_slots=3,
                           interval=interval) as ckp:
        with pytest.raises(UsageError, match="update the state in place") as raised:
            ckp.apply_forward()
        assert re.search(r"\bsteps? 0\b", str(raised.value)), raised.value


def test_a_state_of_zeros_is_watched_until_a_step_starts_from_something_else() -> None:
    """A state of zeros may stay so for steps (a source that starts later): not refused."""
    model = _InPlaceFromZeros()
    with AsyncCheckpointer(model.checkpoint, model, _Nothing(), 12, l1_slots=2,
                           interval=1) as ckp:
        ckp.apply_forward()
        assert model.cur.any()
        ckp.apply_reverse()


class _SettlingFromZeros:
    """u -> sin(u) + 1 in place from zeros: within a few dozen steps it settles, bit for bit, to
    a cycle of two states, as a simulation settling to a steady state may."""

    def __init__(self) -> None:
        self.state = np.zeros(16)
        self.checkpoint = ArrayCheckpoint([self.state])

    def apply(self, *, t_start: int, t_end: int) -> None:
        for _ in range(t_start, t_end):
            np.sin(self.state, out=self.state)
            np.add(self.state, 1.0, out=self.state)


def test_a_state_that_settles_after_a_first_call_from_zeros_is_not_refused() -> None:
    """The first call (from zeros) changed the state, which proves the operator writes in place;
    the second (100 steps) leaves the settled state as it was. It was refused ('update the
    state in place'), since calls from zeros decided nothing."""
    model = _SettlingFromZeros()
    model.apply(t_start=0, t_end=100)
    settled = model.state.copy()
    model.apply(t_start=100, t_end=200)
    assert np.array_equal(model.state, settled)  # steps 100 to 199 leave u_100 as it was
    model.state[:] = 0.0
    with AsyncCheckpointer(model.checkpoint, model, _Nothing(), 400, l1_slots=2,
                           interval=100) as ckp:
        ckp.apply_forward()
        ckp.apply_reverse()


class _FixedPoint:
    """Steps that leave a non-zero state exactly as it was (u = 1 is a fixed point of
    u -> 0.5 u + 0.5), in place."""

    updates_in_place = True

    def __init__(self) -> None:
        self.state = np.ones(16)
        self.checkpoint = ArrayCheckpoint([self.state])

    def apply(self, *, t_start: int, t_end: int) -> None:
        for _ in range(t_start, t_end):
            np.multiply(self.state, 0.5, out=self.state)
            np.add(self.state, 0.5, out=self.state)


def test_an_operator_that_declares_it_updates_in_place_is_not_watched() -> None:
    """A fixed point looks like rebound arrays; the operator's updates_in_place says it is not
    (the torch and JAX adapters' operators declare it)."""
    model = _FixedPoint()
    with AsyncCheckpointer(model.checkpoint, model, _Nothing(), 12, l1_slots=2,
                           interval=3) as ckp:
        ckp.apply_forward()
        ckp.apply_reverse()
    model.updates_in_place = False
    with AsyncCheckpointer(model.checkpoint, model, _Nothing(), 12, l1_slots=2,
                           interval=3) as ckp:
        with pytest.raises(UsageError, match="set updates_in_place = True"):
            ckp.apply_forward()

