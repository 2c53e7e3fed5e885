"""What a new user meets first: a stats line that reads at any n, errors shown under the
module that exports them, and annotations their type checker sees."""
from __future__ import annotations

import traceback
from pathlib import Path

import numpy as np
import pytest

import asyncckpt
import schedules
from asyncckpt import ArrayCheckpoint, AsyncCheckpointer, InvalidValueError

from workloads import Forward, RecurrentCell, Reverse, forward_reverse, store_all_reference


def test_the_stats_repr_is_one_short_line_at_any_n():
    model = RecurrentCell(5000)
    with AsyncCheckpointer(model, Forward(model), Reverse(model), 5000, l1_slots=4,
                           interval=3) as ckp:
        forward_reverse(model, ckp)
    text = repr(ckp.stats)
    assert len(ckp.stats.interval_starts) > 1000
    assert len(text) < 600 and "\n" not in text
    assert "interval=3" in text and "n_timesteps=5000" in text


def test_errors_are_shown_as_asyncckpts():
    with pytest.raises(InvalidValueError) as caught:
        model = RecurrentCell(4)
        AsyncCheckpointer(model, Forward(model), Reverse(model), -1)
    shown = "".join(traceback.format_exception_only(caught.type, caught.value))
    assert shown.startswith("asyncckpt.errors.InvalidValueError:"), shown
    assert schedules.InvalidValueError is asyncckpt.InvalidValueError


@pytest.mark.parametrize("package", [asyncckpt, schedules])
def test_the_packages_carry_py_typed(package):
    assert (Path(package.__file__).parent / "py.typed").is_file()


class Counted:
    """A state of a float64 field, a float32 field and an int64 step counter, advanced in
    place; its reverse records what it finds live (u_{t+1}, after its taping step)."""

    def __init__(self) -> None:
        self.p = np.linspace(0.0, 1.0, 50)
        self.u = np.ones((4, 5), np.float32)
        self.k = np.zeros(1, np.int64)
        self.seen: dict[int, bytes] = {}

    def reset(self) -> None:
        self.p[:] = np.linspace(0.0, 1.0, 50)
        self.u[:] = 1
        self.k[:] = 0

    def step(self) -> None:
        self.p[:] = np.sin(self.p) + 0.01 * self.k[0]
        self.u *= np.float32(1.01)
        self.k += 1

    def live(self) -> bytes:
        return self.p.tobytes() + self.u.tobytes() + self.k.tobytes()


def test_an_array_checkpoint_of_mixed_dtypes_restores_every_state_exactly():
    state, n = Counted(), 40
    plain = []
    for _ in range(n):
        state.step()
        plain.append(state.live())

    class Fwd:
        def apply(self, *, t_start, t_end):
            for _ in range(t_start, t_end):
                state.step()

    class Rev:
        def apply(self, *, t_start, t_end):
            state.seen[t_start] = state.live()

    checkpoint = ArrayCheckpoint([state.p, state.u, state.k])
    assert checkpoint.dtype == np.uint8 and checkpoint.size == 50 * 8 + 20 * 4 + 8
    assert "int64" in repr(checkpoint)
    state.reset()
    with AsyncCheckpointer(checkpoint, Fwd(), Rev(), n, l1_slots=3, interval=7) as ckp:
        ckp.apply_forward()
        ckp.apply_reverse()
    assert ckp.stats.l2_writes > 0
    assert [state.seen[t] for t in range(n)] == plain


def test_mixed_dtypes_that_cannot_be_viewed_as_bytes_are_named():
    field = np.zeros((6, 6))[:, ::2]
    with pytest.raises(TypeError, match=r"arrays\[0\] \(shape \(6, 3\).*is not"):
        ArrayCheckpoint([field, np.zeros(1, np.int64)])


def test_autos_first_run_probes_ten_steps_from_u0_and_an_interval_skips_them():
    # README: "its first run probes the forward operator with ten steps from u_0 ... an
    # interval of your own skips it"
    n = 60
    reference = store_all_reference(RecurrentCell(n))
    for interval, probed in (("auto", 10), (6, 0)):
        model = RecurrentCell(n)
        with AsyncCheckpointer(model, Forward(model), Reverse(model), n, l1_slots=3,
                               interval=interval) as ckp:
            gradients = forward_reverse(model, ckp)
        forward_calls = [call for call in model.trace.calls if call[0] == "fwd"]
        assert ckp.stats.probe_steps == probed
        if probed:
            # one step twice, then eight: from u_0 each time, which is restored after them
            assert forward_calls[:3] == [("fwd", 0, 1), ("fwd", 1, 2), ("fwd", 2, 10)]
            assert forward_calls[3][1] == 0
        else:
            assert forward_calls[0][1] == 0 and forward_calls[1][1] > 0
        for ours, theirs in zip(gradients, reference):
            assert ours.tobytes() == theirs.tobytes()
