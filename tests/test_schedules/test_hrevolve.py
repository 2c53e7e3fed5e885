"""H-Revolve: valid schedules, makespans that add up, Revolve's totals on one level, and the
published dynamic program's makespans (pyrevolve's table) where its costs rise by level."""
from __future__ import annotations

import types

import pytest

from schedules import Load, Prefetch, ScheduleError, Store, Tier, simulate
from schedules.hrevolve import HRevolve, Level
from schedules.revolve import optimal_forward_steps, untaped_forward_steps

COSTS = [(0, 0, 0, 0), (0, 0, 2, 2), (1, 1, 5, 3), (0.5, 0.2, 10, 10)]


@pytest.mark.parametrize("taping", [True, False])
@pytest.mark.parametrize("w0, r0, w1, r1", COSTS)
@pytest.mark.parametrize("c0, c1", [(0, 1), (1, 0), (1, 1), (2, 3), (0, 4), (5, 5), (2, 40)])
@pytest.mark.parametrize("n", [1, 2, 3, 10, 37])
def test_every_schedule_is_valid_and_prices_to_its_makespan(n, c0, c1, w0, r0, w1, r1, taping):
    levels = [Level(c0, w0, r0), Level(c1, w1, r1)]
    schedule = HRevolve(n, levels, forward_cost=1, reverse_cost=2, taping=taping)
    result = simulate(schedule, n_steps=n, taping=taping)
    assert result.reverse_steps == n
    assert result.l1_peak <= c0
    assert result.l2_peak <= c1
    assert schedule.price() == pytest.approx(schedule.makespan, abs=1e-9)


@pytest.mark.parametrize("n", [1, 2, 5, 17, 58])
@pytest.mark.parametrize("slots", [1, 2, 3, 7, 11])
def test_one_free_level_is_revolve(n, slots):
    # Reverse steps cost 1 with taping (the taping step), 0 without: the makespan counts
    # forward steps, which Revolve minimises.
    taped = HRevolve(n, [Level(slots)], reverse_cost=1, taping=True)
    free = HRevolve(n, [Level(slots)], reverse_cost=0, taping=False)
    assert taped.makespan == optimal_forward_steps(n, slots)
    assert free.makespan == untaped_forward_steps(n, slots)
    assert simulate(free).forward_steps == untaped_forward_steps(n, slots)


def test_a_slow_level_is_used_only_when_it_pays():
    # Plenty of memory: nothing goes to the disk.
    roomy = list(HRevolve(20, [Level(20, 1, 1), Level(20, 100, 100)]))
    assert not any(isinstance(a, (Store, Load)) and a.tier is Tier.L2 for a in roomy)
    # One memory slot and a cheap disk: states go to the disk and are prefetched once each.
    tight = list(HRevolve(20, [Level(1, 0, 0), Level(20, 0.1, 0.1)]))
    writes = [a.step for a in tight if isinstance(a, Store) and a.tier is Tier.L2]
    prefetches = [a.step for a in tight if isinstance(a, Prefetch)]
    assert writes and sorted(prefetches) == sorted(writes)


def test_more_levels_have_operations_but_no_actions():
    schedule = HRevolve(30, [Level(1), Level(2, 1, 1), Level(10, 5, 5)])
    kinds = {op.kind for op in schedule.operations()}
    assert kinds == {"forward", "reverse", "write", "read", "discard"}
    assert schedule.price() == pytest.approx(schedule.makespan)
    with pytest.raises(ValueError, match="two tiers"):
        list(schedule)


@pytest.mark.parametrize("levels, match", [
    ([], "non-empty"),
    ([Level(0), Level(0)], "at least one slot"),
])
def test_bad_levels_are_named(levels, match):
    with pytest.raises((ValueError, TypeError), match=match):
        HRevolve(5, levels)


@pytest.mark.parametrize("field, value", [("slots", -1), ("write", -1.0), ("read", float("nan"))])
def test_bad_level_values_are_named(field, value):
    arguments = {"slots": 1, field: value}
    with pytest.raises((ValueError, TypeError), match=field):
        Level(**arguments)


def test_a_tampered_schedule_fails_validation():
    actions = list(HRevolve(12, [Level(1), Level(4, 1, 1)]))
    dropped = next(i for i, a in enumerate(actions) if isinstance(a, Prefetch))
    with pytest.raises(ScheduleError):
        simulate(actions[:dropped] + actions[dropped + 1:])


@pytest.mark.parametrize("l", [1, 2, 5, 20, 40])
@pytest.mark.parametrize("c0, c1", [(1, 1), (2, 3), (1, 6), (5, 5)])
@pytest.mark.parametrize("w0, r0, w1, r1", COSTS)
@pytest.mark.parametrize("uf, ub", [(1, 1), (1, 2)])
def test_makespan_equals_pyrevolves_table_where_costs_rise_by_level(l, c0, c1, w0, r0, w1, r1,
                                                                  uf, ub):
    hrevolve = pytest.importorskip("pyrevolve.schedulers.hrevolve")
    base = pytest.importorskip("pyrevolve.schedulers.base")
    levels = [Level(c0, w0, r0), Level(c1, w1, r1)]
    storages = [types.SimpleNamespace(wd=lv.write, rd=lv.read, nckp=lv.slots) for lv in levels]
    _, opt = hrevolve.get_hopt_table(l, base.Architecture(storages), uf, ub)
    ours = HRevolve(l, levels, forward_cost=uf, reverse_cost=ub, taping=False)
    assert ours.makespan == pytest.approx(opt[1][l][c1])


def test_config_round_trip():
    from schedules import from_config

    schedule = HRevolve(17, [Level(2, 0.5, 0.5), Level(5, 3.0, 2.0)], reverse_cost=2.0,
                        taping=False)
    again = from_config(schedule.get_config())
    assert list(again) == list(schedule) and again.makespan == schedule.makespan
