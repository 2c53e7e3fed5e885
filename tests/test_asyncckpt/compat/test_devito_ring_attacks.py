"""The attack suite's Devito profile: the loads a ring of time levels keeps, on operators and
plans nobody listed. Each example draws a field (wave of time order 2 or 3, or diffusion of
time order 1), its buffer (Devito's default, or ``Buffer(k)`` with up to 3 rows more), a space
order, whether the reverse reads ``u[t+1]`` too (then taped), the protocol (decided, or
taped), a plan (slots, interval or Revolve in Level-1 alone), Level-2 (DRAM or a directory)
and a fault on one Level-2 read under the recompute policy (a lost state is rebuilt in the
live arrays, which the ring must forget). Every gradient must equal pyrevolve's bit for bit,
on the same checkpointer's second run too.

CI draws 8 examples, the same ones every time; ``ASYNCCKPT_DEVITO_ATTACKS=N`` draws N at
random.
"""
from __future__ import annotations

import os
from functools import lru_cache
from typing import Any

import numpy as np
import pytest
from hypothesis import HealthCheck, Phase, assume, example, given, note, settings
from hypothesis import strategies as st

pytest.importorskip("devito")
pyrevolve = pytest.importorskip("pyrevolve")

import asyncckpt.compat  # noqa: E402
from faults import FaultyFile, FaultyMemory  # noqa: E402

EXAMPLES = int(os.environ.get("ASYNCCKPT_DEVITO_ATTACKS", "8"))
NT = 61  # 59 steps: intervals and slots of every kind within a few seconds


@lru_cache(maxsize=None)
def _operators(kind: str, extra_rows: int, space_order: int, reads_next: bool) -> Any:
    """The compiled pair of one drawn field (kept: Devito compiles each once)."""
    from devito import Buffer, Eq, Function, Grid, Operator, TimeFunction

    grid = Grid(shape=(23, 19), extent=(220.0, 180.0))
    order = {"wave2": 2, "wave3": 3, "diffusion": 1}[kind]
    save = Buffer(order + 1 + extra_rows) if extra_rows else None
    u = TimeFunction(name="u", grid=grid, time_order=order, space_order=space_order, save=save)
    v = TimeFunction(name="v", grid=grid, time_order=order, space_order=space_order)
    grad = Function(name="grad", grid=grid)
    src = Function(name="src", grid=grid)  # a fixed forcing, added every step
    src.data[11, 9] = 1.0
    dt = grid.stepping_dim.spacing
    if kind == "diffusion":
        forward = Eq(u.forward, u + dt * (0.1 * u.laplace + src))
        reverse = Eq(v.backward, v + dt * (0.1 * v.laplace + src))
    else:
        forward = Eq(u.forward, 2 * u - u.backward + dt ** 2 * (u.laplace + src))
        reverse = Eq(v.backward, 2 * v - v.forward + dt ** 2 * (v.laplace + src))
    update = grad + u * v + (u.forward * v if reads_next else 0)
    return Operator([forward]), Operator([reverse, Eq(grad, update)]), u, v, grad


def _gradient(ops: Any, revolver: Any, run: Any = None) -> tuple[np.ndarray, Any]:
    """The gradient through a new ``revolver``, or through ``run`` once more."""
    from devito.checkpointing import CheckpointOperator, DevitoCheckpoint

    fwd_op, rev_op, u, v, grad = ops
    for f in (u, v, grad):
        f.data_with_halo[:] = 0
    if run is None:
        fwd = CheckpointOperator(fwd_op, u=u, dt=DT)
        rev = CheckpointOperator(rev_op, u=u, v=v, grad=grad, dt=DT)
        run = revolver(DevitoCheckpoint([u]), fwd, rev)
    run.apply_forward()
    run.apply_reverse()
    return grad.data.copy(), run


DT = 0.2


@settings(max_examples=EXAMPLES, deadline=None,
          derandomize="ASYNCCKPT_DEVITO_ATTACKS" not in os.environ,
          phases=(Phase.explicit, Phase.reuse, Phase.generate), report_multiple_bugs=False,
          suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow])
@given(kind=st.sampled_from(["wave2", "wave3", "diffusion"]), extra_rows=st.integers(0, 3),
       space_order=st.sampled_from([2, 4]), reads_next=st.booleans(),
       taping=st.sampled_from([None, True]), slots=st.integers(1, 5),
       interval=st.sampled_from([0, 1, 2, 3, 5, 8, "auto"]),
       level2=st.sampled_from(["dram", "disk"]), lost=st.sampled_from([None, 1, 3, 6]))
# a field of time order 3 whose reverse reads u[t+1]: Devito's checkpoint hands out the row
# the next step writes, which was once taken for u[t+1] (decided taping-free, and wrong)
@example(kind="wave3", extra_rows=0, space_order=2, reads_next=True, taping=None, slots=3,
         interval=2, level2="dram", lost=None)
@pytest.mark.timeout(900)
def test_kept_loads_never_change_a_gradient(kind, extra_rows, space_order, reads_next, taping,
                                            slots, interval, level2, lost, tmp_path_factory):
    ops = _operators(kind, extra_rows, space_order, reads_next)

    class Drawn(asyncckpt.compat.Revolver):
        def __init__(self, cp, fwd, rev):
            storage = (FaultyMemory() if level2 == "dram" else
                       FaultyFile(str(tmp_path_factory.mktemp("level2")), flip_get_at=lost))
            if level2 == "dram":
                storage.flip_get_at = lost
            super().__init__(cp, fwd, rev, slots, NT - 2, taping=taping, interval=interval,
                             storage=storage, on_level2_error="recompute")

    def peer(snaps: int) -> type:
        class Peer(pyrevolve.Revolver):
            def __init__(self, cp, fwd, rev):
                super().__init__(cp, fwd, rev, snaps, NT - 2)
        return Peer

    reference, _ = _gradient(ops, peer(slots))
    assert np.abs(reference).max() > 0
    # a workload pyrevolve itself cannot checkpoint (its gradient moves with the slots: a
    # reverse reading u[t+1] of a buffer larger than Devito's reads a row no step rewrote)
    # tells nothing
    assume(np.array_equal(_gradient(ops, peer(NT - 2))[0], reference))
    drawn, run = _gradient(ops, Drawn)
    stats = run.stats
    note(f"plan {run.checkpointer.plan!r}; loads kept {stats.loads_kept}; taping "
         f"{stats.taping} ({stats.taping_reason})")
    assert np.array_equal(drawn, reference)
    again, _ = _gradient(ops, Drawn, run)  # the same checkpointer, its fault spent
    assert np.array_equal(again, reference)


def test_a_row_the_next_step_writes_is_not_taken_for_that_level():
    """Devito's checkpoint of a field of time order 3 holds three rows: u[t-1], u[t] and the
    row its next step writes, which at a store still holds u[t-3]. A reverse reading u[t+1]
    stays taped."""
    from devito.checkpointing import CheckpointOperator, DevitoCheckpoint

    from asyncckpt._planning.taping import choose_protocol

    fwd_op, rev_op, u, v, grad = _operators("wave3", 0, 2, True)
    protocol = choose_protocol(None, DevitoCheckpoint([u]), CheckpointOperator(fwd_op, u=u, dt=DT),
                               CheckpointOperator(rev_op, u=u, v=v, grad=grad, dt=DT))
    assert protocol.taping is True
    assert protocol.reason == ("the reverse reads u[t+1], which the checkpoint of u_t does not "
                               "hold (it holds u[t-3], u[t-1], u[t]): taped")
