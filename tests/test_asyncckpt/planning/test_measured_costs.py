"""``ckp.costs``: the public, frozen view of what "auto" prices plans with, and the costs a user
sets in its place."""
from __future__ import annotations

import dataclasses

import pytest

from asyncckpt import AsyncCheckpointer, MeasuredCosts, UsageError
from asyncckpt._memory.buffers import padded
from asyncckpt.checkpoint import check_descriptor
from workloads import Forward, Leapfrog, Reverse, forward_reverse, store_all_reference


def test_costs_are_a_frozen_public_value_with_a_short_repr() -> None:
    model = Leapfrog(20)
    with AsyncCheckpointer(model, Forward(model), Reverse(model), 20, l1_slots=4) as ckp:
        costs = ckp.costs
        assert type(costs) is MeasuredCosts and costs.n_steps == 20 and costs.runs == 0
        with pytest.raises(dataclasses.FrozenInstanceError):
            costs.tw = 1.0  # type: ignore[misc]
        assert repr(costs).startswith("MeasuredCosts(n_steps=20, tf=")
        assert len(repr(costs)) < 120
        forward_reverse(model, ckp)
        assert ckp.costs.runs == 1 and ckp.costs.tf is not None


def test_costs_set_by_the_user_decide_the_next_plan_exactly() -> None:
    """Level-2 priced ruinous: Revolve in Level-1 alone; cheap: an interval; the gradients stay
    bitwise those of store-all either way, whatever earlier runs left in the residuals."""
    n = 40
    model = Leapfrog(n)
    reference = store_all_reference(model)
    budget = 12 * padded(check_descriptor(model))
    with AsyncCheckpointer(model, Forward(model), Reverse(model), n,
                           memory_budget=budget) as ckp:
        forward_reverse(model, ckp)
        for tw, wants_interval in ((10.0, False), (1e-7, True), (10.0, False)):
            tiers = ckp.costs.tier_costs  # DRAM, then the temporary directory beyond the budget
            ckp.costs = ckp.costs.replace(
                tf=1e-3, tb=2e-3, tcall=0.0, tf_busy=1e-3, tb_busy=2e-3, tcall_busy=0.0, tx=0.0,
                tw=tw, tr=tw, tier_costs=None if tiers is None else ((tw, tw),) * len(tiers))
            assert ckp.costs.tw == tw
            got = forward_reverse(model, ckp)
            assert (ckp.stats.interval > 0) == wants_interval, ckp.stats.interval
            assert all(a.tobytes() == b.tobytes() for a, b in zip(got, reference))


def test_bad_costs_are_refused_naming_what_was_expected(tmp_path) -> None:
    model = Leapfrog(40)
    budget = 12 * padded(check_descriptor(model))
    with AsyncCheckpointer(model, Forward(model), Reverse(model), 40,
                           storage=["dram", tmp_path], memory_budget=budget) as ckp:
        with pytest.raises(TypeError, match="costs must be a MeasuredCosts"):
            ckp.costs = {"tw": 1.0}  # type: ignore[assignment]
        with pytest.raises(ValueError, match="for each of Level-2's 2 tiers"):
            ckp.costs = ckp.costs.replace(tier_costs=((1.0, 1.0),))
    with AsyncCheckpointer(model, Forward(model), Reverse(model), 40, l1_slots=4,
                           interval=2) as fixed:
        assert fixed.costs is None
        with pytest.raises(UsageError, match="'auto' or 'adaptive'"):
            fixed.costs = MeasuredCosts(20, 0, 1e-3, 2e-3, 0.0, 0.0, 1e-3, 1e-3)
