"""A Devito field is a ring of time levels: a forward step from u_t leaves u_t's rows as they
were, and a load of u_t right after it copies nothing. Proven from the operators or not used:
each gradient stays bitwise pyrevolve's, loads kept or not."""
from __future__ import annotations

from typing import Any

import numpy as np
import pytest

pytest.importorskip("devito")
pyrevolve = pytest.importorskip("pyrevolve")

import asyncckpt._build  # noqa: E402
import asyncckpt.compat  # noqa: E402
from asyncckpt._planning.devito_ring import devito_ring  # noqa: E402


class Interval2(asyncckpt.compat.Revolver):
    """Three slots and I = 2: every other load of the reverse sweep follows a forward step
    from the state it loads; keeps each run's stats."""

    seen: list[Any] = []

    def __init__(self, cp, fwd, rev, n_checkpoints, n_timesteps):
        super().__init__(cp, fwd, rev, 3, n_timesteps, interval=2)

    def apply_reverse(self) -> None:
        super().apply_reverse()
        Interval2.seen.append(self.stats)


def _problem(save: Any = None, forward_extra=(), reverse_extra=(), also: bool = False):
    """The operators of an acoustic gradient of ``u`` (``save``: its buffer), with equations
    added to either; ``also``: the checkpoint holds a field the forward never writes."""
    from devito import Eq, Function, Operator, TimeFunction, solve
    from devito.checkpointing import CheckpointOperator, DevitoCheckpoint
    from examples.seismic import Model, RickerSource, TimeAxis

    model = Model(vp=np.full((31, 31), 1.5, np.float32), origin=(0.0, 0.0),
                  spacing=(10.0, 10.0), shape=(31, 31), space_order=4, nbl=6, bcs="damp")
    time = TimeAxis(start=0.0, stop=300.0, step=model.critical_dt)
    src = RickerSource(name="src", grid=model.grid, f0=0.01, time_range=time, npoint=1)
    src.coordinates.data[:] = 150.0
    u = TimeFunction(name="u", grid=model.grid, time_order=2, space_order=4, save=save)
    w = TimeFunction(name="w", grid=model.grid, time_order=2, space_order=4)
    v = TimeFunction(name="v", grid=model.grid, time_order=2, space_order=4)
    grad = Function(name="grad", grid=model.grid)
    for f in (u, w, v, grad):
        f.data[:] = 0
    pde = model.m * u.dt2 - u.laplace + model.damp * u.dt
    forward = Operator([Eq(u.forward, solve(pde, u.forward)),
                        *(e(u, grad) for e in forward_extra)]
                       + src.inject(field=u.forward, expr=src * model.critical_dt ** 2))
    adjoint_pde = model.m * v.dt2 - v.laplace + model.damp * v.dt.T
    reverse = Operator([Eq(v.backward, solve(adjoint_pde, v.backward)),
                        Eq(grad, grad + u * v.dt2), *(e(u, grad) for e in reverse_extra)]
                       + src.inject(field=v.backward, expr=src * model.critical_dt ** 2))

    def gradient(revolver: type) -> np.ndarray:
        for f in (u, w, v, grad):
            f.data[:] = 0
        cp = DevitoCheckpoint([u, w] if also else [u])
        fwd = CheckpointOperator(forward, u=u, src=src, dt=model.critical_dt)
        rev = CheckpointOperator(reverse, u=u, v=v, grad=grad, src=src, dt=model.critical_dt)
        run = revolver(cp, fwd, rev, 5, time.num - 2)
        run.apply_forward()
        run.apply_reverse()
        return grad.data.copy()

    def operators():
        cp = DevitoCheckpoint([u, w] if also else [u])
        fwd = CheckpointOperator(forward, u=u, src=src, dt=model.critical_dt)
        rev = CheckpointOperator(reverse, u=u, v=v, grad=grad, src=src, dt=model.critical_dt)
        return cp, fwd, rev

    return gradient, operators, u


@pytest.mark.timeout(600)
@pytest.mark.parametrize("save, slack", [(None, 1), ("buffer4", 2)])
def test_kept_loads_copy_nothing_and_the_gradient_is_pyrevolves(save, slack, monkeypatch):
    from devito import Buffer

    monkeypatch.delenv("ASYNCCKPT_TAPING", raising=False)
    gradient, operators, _ = _problem(Buffer(4) if save else None)
    ring = devito_ring(*operators())
    assert ring is not None and ring.slack == slack
    reference = gradient(pyrevolve.Revolver)
    assert np.abs(reference).max() > 0
    assert np.array_equal(gradient(Interval2), reference)
    kept = Interval2.seen[-1]
    assert kept.taping is False and kept.loads_kept > 0
    # the same run copying every load: the kept loads were the only copies saved
    monkeypatch.setattr(asyncckpt._build, "live_ring", lambda *args: None)
    assert np.array_equal(gradient(Interval2), reference)
    copied = Interval2.seen[-1]
    assert copied.loads_kept == 0
    assert copied.copies == kept.copies + kept.loads_kept


@pytest.mark.timeout(600)
def test_a_ring_of_more_rows_keeps_more_loads(monkeypatch):
    from devito import Buffer

    monkeypatch.delenv("ASYNCCKPT_TAPING", raising=False)
    class Interval8(Interval2):  # one slot: inside an interval, advances of 1, 2, ... steps
        def __init__(self, cp, fwd, rev, n_checkpoints, n_timesteps):
            asyncckpt.compat.Revolver.__init__(self, cp, fwd, rev, 1, n_timesteps, interval=8)

    kept = []
    for save in (None, Buffer(4)):
        gradient, _, _ = _problem(save)
        reference = gradient(pyrevolve.Revolver)
        assert np.array_equal(gradient(Interval8), reference)
        kept.append(Interval2.seen[-1].loads_kept)
    assert 0 < kept[0] < kept[1]


@pytest.mark.timeout(600)
def test_arrays_written_between_the_sweeps_are_loaded_again(monkeypatch):
    """The caller may write into the live arrays after the forward sweep: the reverse sweep
    trusts nothing the forward sweep left in them."""
    monkeypatch.delenv("ASYNCCKPT_TAPING", raising=False)
    # the first reverse step's v is zero: grad + u * v.dt2 alone would not show it
    gradient, operators, u = _problem(reverse_extra=[_grad_adds_u])
    reference = gradient(pyrevolve.Revolver)

    class Scribbled(Interval2):
        def apply_forward(self) -> None:
            super().apply_forward()
            u.data_with_halo[:] = 7.0

    assert np.array_equal(gradient(Scribbled), reference)


def _grad_adds_u(u, grad):
    from devito import Eq

    return Eq(grad, grad + u)


def _writes_u_now(u, grad):
    from devito import Eq

    return Eq(u, u * 0.5)


def test_a_forward_writing_another_level_of_a_held_field_has_no_ring():
    _, operators, _ = _problem(forward_extra=[_writes_u_now])
    assert devito_ring(*operators()) is None


def _writes_u_next(u, grad):
    from devito import Eq

    return Eq(u.forward, u.forward * 0.5)


@pytest.mark.parametrize("write", [_writes_u_now, _writes_u_next])
def test_a_reverse_writing_a_held_field_has_no_ring(write):
    _, operators, _ = _problem(reverse_extra=[write])
    assert devito_ring(*operators()) is None


def test_a_held_field_the_forward_never_writes_has_no_ring():
    _, operators, _ = _problem(also=True)
    assert devito_ring(*operators()) is None


def test_a_state_of_views_that_are_not_whole_rows_has_no_ring():
    from devito.checkpointing import DevitoCheckpoint

    class Domain(DevitoCheckpoint):  # the domain's views, without the halo: not whole rows
        def get_data(self, timestep):
            return [f.data[(timestep + k) % f._data.shape[0]] for f in self.objects
                    for k in (1, 0)]

        get_data_location = get_data

    _, operators, _ = _problem()
    cp, fwd, rev = operators()
    assert devito_ring(Domain(cp.objects), fwd, rev) is None
    assert devito_ring(cp, fwd, rev) is not None


def test_an_operator_applying_more_than_devitos_has_no_ring():
    from devito.checkpointing import CheckpointOperator

    class Damped(CheckpointOperator):  # what its apply does beside the compiled call is unknown
        def apply(self, t_start, t_end):
            super().apply(t_start, t_end)

    _, operators, _ = _problem()
    cp, fwd, rev = operators()
    fwd.__class__ = Damped
    assert devito_ring(cp, fwd, rev) is None


def test_a_ring_is_proven_on_the_objects_the_run_calls():
    """Through compat's descriptor that hands out the very arrays, never through one that
    casts them, nor an operator wrapped or given an apply of its own."""
    from asyncckpt._planning.devito_ring import live_ring
    from asyncckpt.compat._declared import DeclaredDtype, Settling
    from asyncckpt.compat._revolver import _FirstStateOnce

    _, operators, _ = _problem()
    cp, fwd, rev = operators()
    assert live_ring(_FirstStateOnce(cp), fwd, rev) is not None
    declared = DeclaredDtype(cp, np.dtype(np.float16))  # stored rounded: a copy changes bytes
    assert live_ring(declared, Settling(fwd, declared), Settling(rev, declared)) is None
    assert live_ring(declared, fwd, rev) is None

    class Halving:  # names what it wraps, and writes into u's rows beside it
        def __init__(self, operator):
            self.__wrapped__ = operator

        def apply(self, t_start, t_end):
            self.__wrapped__.apply(t_start, t_end)

    assert live_ring(cp, Halving(fwd), rev) is None
    fwd.apply = lambda t_start, t_end: None  # an instance's own apply
    assert live_ring(cp, fwd, rev) is None


@pytest.mark.parametrize("where", ["forward writes", "reverse writes", "reverse reads"])
def test_a_row_reached_under_another_name_has_no_ring_and_stays_taped(where):
    """A ``Function`` made on one row of u's buffer: what it writes or reads is u's, which
    neither the ring nor the taping decision may miss."""
    from devito import Eq, Function, Grid, Operator, TimeFunction
    from devito.checkpointing import CheckpointOperator, DevitoCheckpoint
    from devito.data.allocators import DataReference

    from asyncckpt._planning.taping import choose_protocol

    grid = Grid(shape=(21, 19), extent=(200.0, 180.0))
    u = TimeFunction(name="u", grid=grid, time_order=2, space_order=4)
    v = TimeFunction(name="v", grid=grid, time_order=2, space_order=4)
    grad = Function(name="grad", grid=grid)
    u.data_with_halo[:] = 0
    row = Function(name="row", grid=grid, space_order=4,
                   allocator=DataReference(u._data_allocated[1]))
    extra = {"forward writes": Eq(row, 0.5 * row), "reverse writes": Eq(row, 0.5 * row),
             "reverse reads": Eq(grad, grad + row * v)}[where]
    forward = [Eq(u.forward, 2 * u - u.backward + 0.01 * u.laplace)]
    reverse = [Eq(v.backward, 2 * v - v.forward + 0.01 * v.laplace), Eq(grad, grad + u * v)]
    (forward if where == "forward writes" else reverse).append(extra)
    fwd_args, rev_args = dict(u=u), dict(u=u, v=v, grad=grad)
    (fwd_args if where == "forward writes" else rev_args)["row"] = row
    cp = DevitoCheckpoint([u])
    fwd = CheckpointOperator(Operator(forward), dt=0.2, **fwd_args)
    rev = CheckpointOperator(Operator(reverse), dt=0.2, **rev_args)
    assert devito_ring(cp, fwd, rev) is None
    if where != "forward writes":
        assert choose_protocol(None, cp, fwd, rev).reason == (
            "the reverse reaches row, whose memory is part of a field the checkpoint holds")
