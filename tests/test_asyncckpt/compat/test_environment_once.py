"""The ``ASYNCCKPT_*`` variables a ``compat.Revolver`` is built with are the ones its runs use:
its checkpointer is built later (at the first ``apply_forward()``), and a variable changed in
between changes nothing."""
from __future__ import annotations

import pytest

from asyncckpt import HostMemoryStorage, TieredStorage
from asyncckpt.compat import Revolver
from asyncckpt.planning import state_bytes
from workloads import Forward, RecurrentCell, Reverse


def _state(model: RecurrentCell) -> bytes:
    return b"".join(array.tobytes() for array in model.get_data(0))


class LiveStateWitness:
    """A reverse operator that declares no protocol and checks, at every call, that the live
    state of ``model`` is u_t (taping-free) or u_{t+1} (taped), byte for byte."""

    def __init__(self, model: RecurrentCell, taping: bool) -> None:
        self.model, self.taping, self.checked = model, taping, 0
        model.reset()
        self.states = [_state(model)]
        for t in range(model.n):
            model.step(t)
            self.states.append(_state(model))

    def apply(self, *, t_start: int, t_end: int) -> None:
        t = t_start
        want = t + 1 if self.taping else t
        assert _state(self.model) == self.states[want], (
            f"reverse {t}: the live state is not u_{want}")
        self.checked += 1


@pytest.mark.parametrize(("built", "run", "taping"), [("0", None, False), (None, "0", True),
                                                      ("1", "0", True)])
def test_the_taping_variable_a_revolver_is_built_with_is_the_one_its_run_uses(
        monkeypatch, built: str | None, run: str | None, taping: bool) -> None:
    """``ASYNCCKPT_TAPING=0`` set while the Revolver is built and unset before
    ``apply_forward()`` gave a taped run to a reverse operator that expects u_t (reverse 63: the
    live state is not u_63), and the other way round."""
    n = 64
    model = RecurrentCell(n)
    witness = LiveStateWitness(model, taping)
    for value in (built, run):
        if value is None:
            monkeypatch.delenv("ASYNCCKPT_TAPING", raising=False)
        else:
            monkeypatch.setenv("ASYNCCKPT_TAPING", value)
        if value is built:
            revolver = Revolver(model, Forward(model), witness, 4, n)
    with revolver:
        model.reset()
        revolver.apply_forward()
        revolver.apply_reverse()
        assert revolver.stats.taping is taping
        if built is not None:
            assert revolver.stats.taping_reason == f"ASYNCCKPT_TAPING={built}"
    assert witness.checked == n


def test_the_default_bound_a_revolver_is_built_with_is_the_one_its_run_uses(
        monkeypatch, tmp_path) -> None:
    """``ASYNCCKPT_MEMORY_BUDGET`` of 8 states set while the Revolver is built bounds its DRAM
    Level-2 (the rest spills to the temporary directory) though it is unset before the
    checkpointer is built; set only then, it bounds nothing."""
    n = 50
    model = RecurrentCell(n)
    bound = 8 * state_bytes(model.size * model.dtype.itemsize)
    monkeypatch.setattr("tempfile.tempdir", str(tmp_path))
    monkeypatch.delenv("ASYNCCKPT_STORAGE", raising=False)
    monkeypatch.setenv("ASYNCCKPT_MEMORY_BUDGET", str(bound))
    bounded = Revolver(model, Forward(model), Reverse(model), 2, n, storage="dram",
                       interval=5)
    monkeypatch.delenv("ASYNCCKPT_MEMORY_BUDGET")
    free = Revolver(model, Forward(model), Reverse(model), 2, n, storage="dram", interval=5)
    monkeypatch.setenv("ASYNCCKPT_MEMORY_BUDGET", str(bound))
    with bounded, free:
        assert isinstance(bounded.checkpointer.storage, TieredStorage)
        assert isinstance(free.checkpointer.storage, HostMemoryStorage)
        for revolver in (bounded, free):
            model.reset()
            revolver.apply_forward()
            model.reset_adjoint()
            revolver.apply_reverse()
        assert bounded.stats.l2_tiers[1]["writes"] > 0  # beyond the bound: the directory
