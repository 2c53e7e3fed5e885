"""A real client: Devito's acoustic wavesolver, unmodified, with asyncckpt's Revolver in place of
pyrevolve's, on its own default path (``n_checkpoints=None``) and a run long enough to matter."""
from __future__ import annotations

import numpy as np
import pytest

pytest.importorskip("devito")
examples = pytest.importorskip("examples.seismic.acoustic")

import asyncckpt.compat  # noqa: E402

NT = 1200


@pytest.fixture(scope="module")
def problem():
    from devito import configuration

    configuration["log-level"] = "WARNING"
    shape, spacing = (41, 41), (10.0, 10.0)
    probe = examples.acoustic_setup(shape=shape, spacing=spacing, tn=1.0, space_order=4, nbl=10)
    tn = probe.model.critical_dt * (NT - 1)
    solver = examples.acoustic_setup(shape=shape, spacing=spacing, tn=tn, space_order=4, nbl=10)
    assert solver.geometry.nt == NT
    rec, u_saved, _ = solver.forward(save=True)
    full_history, _ = solver.jacobian_adjoint(rec, u_saved, checkpointing=False)
    return solver, rec, u_saved, full_history.data.copy()


@pytest.mark.timeout(600)
@pytest.mark.parametrize("taping", ["1", "0"])
def test_wavesolver_gradient_equals_full_history_bit_for_bit(problem, monkeypatch,
                                                             taping: str) -> None:
    solver, rec, u_saved, full_history = problem
    seen = []

    class Recorded(asyncckpt.compat.Revolver):
        def apply_reverse(self) -> None:
            super().apply_reverse()
            seen.append(self.stats)

    monkeypatch.setattr(examples.wavesolver, "Revolver", Recorded)
    monkeypatch.setenv("ASYNCCKPT_TAPING", taping)
    for _ in range(2):  # the second gradient starts from the costs the first one measured
        grad, _ = solver.jacobian_adjoint(rec, u_saved, checkpointing=True)
        assert np.array_equal(grad.data, full_history)
    assert all(stats.n_timesteps == NT - 2 and stats.reverse_steps == NT - 2 for stats in seen)
    assert seen[-1].taping is (taping == "1")
    assert seen[-1].calibration.get("learned_runs", 1) >= 1 or seen[-1].interval == 0


@pytest.mark.timeout(600)
@pytest.mark.parametrize("taping", ["1", "0"])
def test_wavesolver_gradient_through_level2_equals_full_history(problem, monkeypatch,
                                                                 taping: str) -> None:
    # few Level-1 slots, so the states go through Level-2 on disk and come back by prefetch
    solver, rec, u_saved, full_history = problem

    class FewSlots(asyncckpt.compat.Revolver):
        def __init__(self, cp, fwd, rev, n_checkpoints, n_timesteps):
            super().__init__(cp, fwd, rev, 4, n_timesteps, interval=7)
            assert self.checkpointer.interval == 7

    monkeypatch.setattr(examples.wavesolver, "Revolver", FewSlots)
    monkeypatch.setenv("ASYNCCKPT_TAPING", taping)
    monkeypatch.setenv("ASYNCCKPT_STORAGE", "/tmp")
    grad, _ = solver.jacobian_adjoint(rec, u_saved, checkpointing=True)
    assert np.array_equal(grad.data, full_history)
