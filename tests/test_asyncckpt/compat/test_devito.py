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


# -- Devito's other wavesolvers: TTI (two coupled wavefields) and viscoacoustic (a memory
# variable beside the pressure), each on its own default path and through Level-2 -------------


def _nt_setup(setup, nt: int):
    kwargs = dict(shape=(31, 31), spacing=(10.0, 10.0), space_order=4, nbl=10)
    tn = setup(tn=1.0, **kwargs).model.critical_dt * (nt - 1)
    solver = setup(tn=tn, **kwargs)
    assert solver.geometry.nt == nt
    return solver


@pytest.fixture(scope="module", params=["tti", "viscoacoustic"])
def other_solver(request):
    """(wavesolver module, a gradient function, its full-history gradient) of each solver."""
    from devito import configuration

    configuration["log-level"] = "WARNING"
    if request.param == "tti":
        from examples.seismic.tti import tti_setup, wavesolver

        solver = _nt_setup(tti_setup, NT)
        rec, u, v, _ = solver.forward(save=True)

        def gradient(checkpointing: bool) -> np.ndarray:
            return solver.jacobian_adjoint(rec, u, v, checkpointing=checkpointing)[0].data.copy()
    else:
        from examples.seismic.viscoacoustic import viscoacoustic_setup, wavesolver

        solver = _nt_setup(viscoacoustic_setup, NT)
        rec, p, _, _ = solver.forward(save=True)

        def gradient(checkpointing: bool) -> np.ndarray:
            return solver.jacobian_adjoint(rec, p, checkpointing=checkpointing)[0].data.copy()
    full_history = gradient(False)
    assert np.abs(full_history).max() > 0  # a gradient to compare, not zeros
    return wavesolver, gradient, full_history


class FewSlots(asyncckpt.compat.Revolver):
    """Three Level-1 slots and I = 5: states go through Level-2 and come back by prefetch, and
    the reverse sweep advances inside each interval."""

    def __init__(self, cp, fwd, rev, n_checkpoints, n_timesteps):
        super().__init__(cp, fwd, rev, 3, n_timesteps, interval=5)


@pytest.mark.timeout(600)
@pytest.mark.parametrize("taping", ["1", "0"])
def test_other_wavesolvers_equal_full_history_bit_for_bit(other_solver, monkeypatch,
                                                          taping: str) -> None:
    wavesolver, gradient, full_history = other_solver
    if taping == "0" and wavesolver.__name__.endswith("viscoacoustic.wavesolver"):
        pytest.skip("its gradient reads p[t+1]: taping-free does not apply (see the next test)")
    monkeypatch.setenv("ASYNCCKPT_TAPING", taping)
    for revolver in (asyncckpt.compat.Revolver, FewSlots):  # default path, then Level-2
        monkeypatch.setattr(wavesolver, "Revolver", revolver)
        assert np.array_equal(gradient(True), full_history), revolver


@pytest.mark.timeout(600)
def test_viscoacoustic_gradient_needs_the_taping_step(other_solver, monkeypatch) -> None:
    """Why docs/migration.md keeps the viscoacoustic solver on the taping protocol: its gradient
    update ``grad + p.dt * pa.dt`` reads p[t+1], which the checkpoint of u_t does not hold (the
    taping step computes it). Once the reverse sweep advances inside an interval, a taping-free
    run reads a stale level there and its gradient differs."""
    wavesolver, gradient, full_history = other_solver
    if not wavesolver.__name__.endswith("viscoacoustic.wavesolver"):
        pytest.skip("the TTI gradient reads only what its checkpoint holds")
    monkeypatch.setenv("ASYNCCKPT_TAPING", "0")
    monkeypatch.setattr(wavesolver, "Revolver", FewSlots)
    assert not np.array_equal(gradient(True), full_history)


UNEDITED = """
import numpy as np
import devito
from devito import configuration
from examples.seismic.acoustic import acoustic_setup

configuration["log-level"] = "ERROR"
solver = acoustic_setup(shape=(41, 41), spacing=(10.0, 10.0), tn=400.0, space_order=4, nbl=10)
rec, u, _ = solver.forward(save=True)
checkpointed, _ = solver.jacobian_adjoint(rec, u, checkpointing=True)
full_history, _ = solver.jacobian_adjoint(rec, u, checkpointing=False)
assert np.abs(full_history.data).max() > 0
print(devito.Revolver.__module__, np.array_equal(checkpointed.data, full_history.data))
"""


@pytest.mark.timeout(600)
def test_devito_runs_on_asyncckpt_through_the_switch_unedited(tmp_path) -> None:
    """``python -m asyncckpt.compat program.py``: Devito imports pyrevolve and gets compat's
    Revolver, with no edit to Devito or to the program."""
    import subprocess
    import sys

    program = tmp_path / "gradient.py"
    program.write_text(UNEDITED)
    done = subprocess.run([sys.executable, "-m", "asyncckpt.compat", str(program)],
                          capture_output=True, text=True, timeout=540)
    assert done.returncode == 0, done.stderr[-3000:]
    assert done.stdout.split()[-2:] == ["asyncckpt.compat._revolver", "True"]


# -- the protocol decided from the operators' expressions (no ASYNCCKPT_TAPING) --------------


class Recorded(asyncckpt.compat.Revolver):
    """compat's Revolver on its own default path, keeping each run's stats."""

    seen: list = []

    def apply_reverse(self) -> None:
        super().apply_reverse()
        Recorded.seen.append(self.stats)


@pytest.mark.timeout(600)
def test_acoustic_gradient_is_decided_taping_free_and_bitwise(problem, monkeypatch) -> None:
    solver, rec, u_saved, full_history = problem
    monkeypatch.delenv("ASYNCCKPT_TAPING", raising=False)
    monkeypatch.setattr(examples.wavesolver, "Revolver", Recorded)
    grad, _ = solver.jacobian_adjoint(rec, u_saved, checkpointing=True)
    assert np.array_equal(grad.data, full_history)
    stats = Recorded.seen[-1]
    assert stats.taping is False
    assert stats.taping_reason == "the reverse reads u[t]; the checkpoint holds u[t-1], u[t]"


@pytest.mark.timeout(600)
def test_tti_and_viscoacoustic_are_decided_from_what_their_gradients_read(other_solver,
                                                                          monkeypatch) -> None:
    wavesolver, gradient, full_history = other_solver
    monkeypatch.delenv("ASYNCCKPT_TAPING", raising=False)
    visco = wavesolver.__name__.endswith("viscoacoustic.wavesolver")

    class FewSlotsRecorded(Recorded):  # through Level-2, advancing inside intervals
        def __init__(self, cp, fwd, rev, n_checkpoints, n_timesteps):
            super().__init__(cp, fwd, rev, 3, n_timesteps, interval=5)

    for revolver in (Recorded, FewSlotsRecorded):
        monkeypatch.setattr(wavesolver, "Revolver", revolver)
        assert np.array_equal(gradient(True), full_history), revolver
        stats = Recorded.seen[-1]
        assert stats.taping is visco, stats.taping_reason
    if visco:  # its update grad + p.dt * pa.dt reads p[t+1]
        assert stats.taping_reason.startswith("the reverse reads p[t+1], which the checkpoint")
    else:
        assert stats.taping_reason == ("the reverse reads u0[t], v0[t]; the checkpoint holds "
                                       "u0[t-1], u0[t], v0[t-1], v0[t]")


@pytest.mark.timeout(600)
def test_a_reverse_of_your_own_reading_u_forward_stays_taped_and_is_pyrevolves() -> None:
    """A gradient update reading u[t+1] (which the checkpoint of u_t does not hold): kept on
    the taping protocol, and bit for bit pyrevolve's gradient of the same operators."""
    pyrevolve = pytest.importorskip("pyrevolve")
    from devito import Eq, Function, Operator, TimeFunction, solve
    from devito.checkpointing import CheckpointOperator, DevitoCheckpoint
    from examples.seismic import Model, RickerSource, TimeAxis

    model = Model(vp=np.full((31, 31), 1.5, np.float32), origin=(0.0, 0.0),
                  spacing=(10.0, 10.0), shape=(31, 31), space_order=4, nbl=6, bcs="damp")
    time = TimeAxis(start=0.0, stop=300.0, step=model.critical_dt)
    src = RickerSource(name="src", grid=model.grid, f0=0.01, time_range=time, npoint=1)
    src.coordinates.data[:] = 150.0
    u = TimeFunction(name="u", grid=model.grid, time_order=2, space_order=4)
    v = TimeFunction(name="v", grid=model.grid, time_order=2, space_order=4)
    grad = Function(name="grad", grid=model.grid)
    pde = model.m * u.dt2 - u.laplace + model.damp * u.dt
    forward = Operator([Eq(u.forward, solve(pde, u.forward))]
                       + src.inject(field=u.forward, expr=src * model.critical_dt ** 2))
    adjoint_pde = model.m * v.dt2 - v.laplace + model.damp * v.dt.T
    reverse = Operator([Eq(v.backward, solve(adjoint_pde, v.backward)),
                        Eq(grad, grad + u.forward * v + u * v.backward)]
                       + src.inject(field=v.backward, expr=src * model.critical_dt ** 2))
    nt = time.num - 2
    results = []
    for revolver in (pyrevolve.Revolver, Recorded):
        for f in (u, v, grad):
            f.data[:] = 0
        cp = DevitoCheckpoint([u])
        fwd = CheckpointOperator(forward, u=u, src=src, dt=model.critical_dt)
        rev = CheckpointOperator(reverse, u=u, v=v, grad=grad, src=src, dt=model.critical_dt)
        run = revolver(cp, fwd, rev, 5, nt)
        run.apply_forward()
        run.apply_reverse()
        results.append(grad.data.copy())
    assert np.abs(results[0]).max() > 0
    assert np.array_equal(results[0], results[1])
    stats = Recorded.seen[-1]
    assert stats.taping is True
    assert stats.taping_reason.startswith("the reverse reads u[t+1], which the checkpoint")
