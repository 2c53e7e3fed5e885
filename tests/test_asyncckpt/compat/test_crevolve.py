"""pyrevolve's classic API (``pyrevolve.crevolve``) and its two examples through compat: the same
actions with the same ``capo``, ``oldcapo`` and ``check``, the same ``adjust``; a descriptor
that declares another dtype than its arrays' stored as pyrevolve stores it."""
from __future__ import annotations

import importlib.util
import subprocess
import sys
import warnings

import numpy as np
import pytest

from asyncckpt import AsyncCheckpointer, InvalidTypeError, InvalidValueError
from asyncckpt.compat import Revolver, crevolve
from conftest import TESTS
from schedules import simulate
from schedules.actions import Advance, EndForward, EndReverse, Free, Load, Reverse, Store, Tier
from schedules.classic import ClassicAction, ClassicRevolve
from schedules.revolve import optimal_forward_steps

EXAMPLES = TESTS / "pyrevolve_examples"
needs_pyrevolve = pytest.mark.skipif(importlib.util.find_spec("pyrevolve") is None,
                                     reason="needs the 'test' extra (pyrevolve)")


def classic_trace(module, steps: int, snaps: int) -> list[tuple[str, int, int, int]]:
    revolver = module.CRevolve(snaps, steps)
    trace = []
    while True:
        action = revolver.revolve()
        trace.append((action.name, revolver.capo, revolver.oldcapo, revolver.check))
        if action.name == "terminate":
            return trace


def as_schedule(steps: int, snaps: int) -> list:
    """The classic actions as the runtime's, for the validator: slots by index, the taping
    step of each adjoint step its own advance."""
    revolver, actions, slots = ClassicRevolve(snaps, steps), [], {}
    while (action := revolver.next()) is not ClassicAction.TERMINATE:
        if action is ClassicAction.ADVANCE:
            actions.append(Advance(start=revolver.oldcapo, end=revolver.capo))
        elif action is ClassicAction.TAKESHOT:
            if revolver.check in slots:
                actions.append(Free(step=slots[revolver.check], tier=Tier.L1))
            slots[revolver.check] = revolver.capo
            actions.append(Store(step=revolver.capo, tier=Tier.L1))
        elif action is ClassicAction.RESTORE:
            actions.append(Load(step=revolver.capo, tier=Tier.L1))
        else:
            actions.append(Advance(start=revolver.capo, end=revolver.capo + 1))
            if action is ClassicAction.FIRSTRUN:  # the forward sweep's last step, then adjoints
                actions.append(EndForward())
            actions.append(Reverse(step=revolver.capo))
    actions.extend(Free(step=step, tier=Tier.L1) for step in slots.values())
    return actions + [EndReverse()]


@pytest.mark.parametrize("steps, snaps", [(1, 1), (2, 1), (10, 2), (20, 3), (100, 5), (100, 10),
                                          (1000, 10), (1000, 50)])
def test_the_classic_schedule_is_valid_and_optimal(steps: int, snaps: int) -> None:
    counts = simulate(as_schedule(steps, snaps))
    assert counts.reverse_steps == steps
    assert counts.forward_steps == optimal_forward_steps(steps, snaps)
    assert counts.l1_peak <= snaps


def test_the_classic_api_refuses_what_compat_does_not_offer() -> None:
    with pytest.raises(InvalidValueError, match="online"):
        crevolve.CRevolve(4)
    with pytest.raises(InvalidValueError, match="two-level"):
        crevolve.CRevolve(4, 100, 2)
    with pytest.raises(InvalidTypeError):
        crevolve.CRevolve(4.5, 100)


@needs_pyrevolve
def test_every_action_and_counter_equals_pyrevolves() -> None:
    import pyrevolve.crevolve as theirs

    for steps in [*range(1, 80), 333, 1000, 2048]:
        for snaps in [*range(1, 9), 20, 50]:
            assert classic_trace(crevolve, steps, snaps) == classic_trace(theirs, steps, snaps), \
                (steps, snaps)
    assert [crevolve.adjust(n) for n in range(1, 5000)] == [theirs.adjust(n)
                                                            for n in range(1, 5000)]
    for steps in (1, 7, 100, 5000):
        for snaps in (1, 3, 30):
            assert crevolve.numforw(steps, snaps) == theirs.numforw(steps, snaps)
            assert crevolve.expense(steps, snaps) == pytest.approx(theirs.expense(steps, snaps))


@needs_pyrevolve
@pytest.mark.parametrize("example", ["use_classic.py", "use_modernised.py"])
def test_pyrevolves_examples_print_what_they_print_under_pyrevolve(example: str) -> None:
    def run(*switch: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run([sys.executable, *switch, example], cwd=EXAMPLES,
                              capture_output=True, text=True, timeout=120)

    theirs, ours = run(), run("-m", "asyncckpt.compat")
    assert theirs.returncode == 0, theirs.stderr
    assert ours.returncode == 0, ours.stderr
    assert ours.stdout == theirs.stdout
    assert ("declares dtype float32 but its arrays hold float64" in ours.stderr) \
        == (example == "use_modernised.py")


class Declared:
    """A descriptor written for pyrevolve that declares float32 over float64 arrays."""

    def __init__(self, state: np.ndarray) -> None:
        self.state, self.size, self.dtype = state, state.size, np.float32

    def get_data(self, t):
        return [self.state]

    def get_data_location(self, t):
        return [self.state]


class Step:
    def __init__(self, state: np.ndarray, log: list) -> None:
        self.state, self.log = state, log

    def apply(self, *, t_start: int, t_end: int) -> None:
        for _ in range(t_start, t_end):
            self.state *= 1.1
            self.state += 1 / 3


class Adjoint:
    def __init__(self, state: np.ndarray, log: list) -> None:
        self.state, self.log = state, log

    def apply(self, *, t_start: int, t_end: int) -> None:
        self.log.append(self.state.copy())


def declared_run(revolver_class, slots: int) -> list[np.ndarray]:
    state, log = np.linspace(0, 1, 7), []
    revolver = revolver_class(Declared(state), Step(state, log), Adjoint(state, log), slots, 40)
    revolver.apply_forward()
    revolver.apply_reverse()
    return log


@pytest.mark.parametrize("slots", [2, 5])
def test_a_declared_dtype_is_stored_as_pyrevolve_stores_it_with_one_warning(slots: int) -> None:
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        ours = declared_run(Revolver, slots)
    notes = [str(w.message) for w in caught if "declares dtype" in str(w.message)]
    assert len(notes) == 1 and "float32" in notes[0] and "float64" in notes[0]
    assert "rounded" in notes[0]
    exact = []
    state = np.linspace(0, 1, 7)
    for _ in range(40):
        exact.append(state.copy())
        state = state * 1.1 + 1 / 3
    exact.append(state)
    # restored states are rounded to float32, and the adjoints see them so, as under pyrevolve
    # (whose schedule restores other states: the roundings differ, not their size)
    runs = {"asyncckpt.compat": ours}
    if importlib.util.find_spec("pyrevolve") is not None:
        import pyrevolve

        runs["pyrevolve"] = declared_run(pyrevolve.Revolver, slots)
    for name, seen in runs.items():
        assert len(seen) == 40
        assert not all(np.array_equal(a, b) for a, b in zip(seen, exact[40:0:-1])), name
        for got, want in zip(seen, exact[40:0:-1]):
            np.testing.assert_allclose(got, want, rtol=1e-6, err_msg=name)


def test_the_checkpointer_itself_refuses_a_declared_dtype_its_arrays_do_not_hold() -> None:
    state = np.zeros(7)
    with pytest.raises(InvalidTypeError, match="float64"):
        AsyncCheckpointer(Declared(state), Step(state, []), Adjoint(state, []), 10, l1_slots=2)
