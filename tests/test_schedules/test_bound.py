"""The machine's bound: no plan the runtime could run, simulated event by event on the same
costs, takes less time; it never falls below the floor, and more memory never raises it."""
from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from schedules import AsyncMultistage, Revolve
from schedules.bound import TRANSFER_BUFFERS, machine_bound
from schedules.model import Costs, simulate_times

cost = st.floats(0.0, 20.0, allow_subnormal=False)


@st.composite
def costs(draw) -> Costs:
    return Costs(tf=1.0, tb=1.0 + draw(cost), tw=draw(cost), tr=draw(cost),
                 tc=draw(st.sampled_from([0.0, 0.1, 0.7])))


@settings(max_examples=40, deadline=None)
@given(data=st.data(), costs=costs())
def test_no_plan_simulated_on_the_costs_beats_the_bound(data, costs: Costs) -> None:
    n = data.draw(st.integers(1, 60), label="n")
    slots = data.draw(st.integers(1, 6), label="slots")
    memory = slots + TRANSFER_BUFFERS  # no DRAM tier: every stored state goes to the device
    bound = machine_bound(n, memory, costs)
    assert bound.total_s >= bound.floor_s * (1 - 1e-12)
    for interval in range(1, n + 1):
        run = simulate_times(AsyncMultistage(n, interval, slots), costs)
        assert bound.total_s <= run.total_s * (1 + 1e-9), interval
    alone = simulate_times(Revolve(n, memory), costs)
    assert bound.total_s <= alone.total_s * (1 + 1e-9)


@settings(max_examples=40, deadline=None)
@given(data=st.data(), costs=costs())
def test_more_memory_never_raises_the_bound(data, costs: Costs) -> None:
    n = data.draw(st.integers(1, 300), label="n")
    memory = data.draw(st.integers(1, 40), label="memory")
    assert (machine_bound(n, memory + 1, costs).total_s
            <= machine_bound(n, memory, costs).total_s * (1 + 1e-12))


def test_memory_for_every_state_leaves_the_floor_and_the_copies() -> None:
    # taping-free, every state in memory: nothing recomputed, nothing on the device
    costs = Costs(tf=1.0, tb=3.0, tw=50.0, tr=50.0, tc=0.25)
    bound = machine_bound(100, 200, costs, taping=False)
    assert bound.device_s == 0.0
    assert bound.floor_s == 100 * 1.0 + 100 * 2.0
    assert bound.total_s == pytest.approx(bound.floor_s + 0.25 * 2 * 100, rel=0.05)


def test_a_slow_device_makes_the_bound_recompute_instead() -> None:
    fast = machine_bound(1000, 12, Costs(tf=1.0, tb=2.0, tw=0.5, tr=0.5))
    slow = machine_bound(1000, 12, Costs(tf=1.0, tb=2.0, tw=40.0, tr=40.0))
    assert fast.interval < slow.interval or slow.interval == 0
    assert slow.total_s > fast.total_s


def test_bad_input_names_its_value() -> None:
    with pytest.raises(ValueError, match="memory_states"):
        machine_bound(10, 0, Costs(tf=1.0, tb=2.0))


@settings(max_examples=25, deadline=None)
@given(data=st.data(), costs=costs())
def test_with_a_free_device_the_bound_is_the_fastest_plan_simulated(data, costs: Costs) -> None:
    # nothing to overlap: the least compute of any plan, which the simulation reaches
    costs = Costs(tf=costs.tf, tb=costs.tb, tc=costs.tc)
    n = data.draw(st.integers(1, 50), label="n")
    slots = data.draw(st.integers(1, 5), label="slots")
    runs = [simulate_times(AsyncMultistage(n, interval, s), costs).total_s
            for interval in range(1, n + 1) for s in range(1, slots + 1)]
    runs.append(simulate_times(Revolve(n, slots + TRANSFER_BUFFERS), costs).total_s)
    assert machine_bound(n, slots + TRANSFER_BUFFERS, costs).total_s == pytest.approx(min(runs))


def test_where_transfers_and_compute_balance_the_fastest_plan_runs_at_the_bound() -> None:
    # 300 steps in 3 states: Revolve alone recomputes 8 sweeps' worth; storing every other state
    # balances its 600 s of device work under 748 s of compute, and the run hides it all but 3 s
    costs = Costs(tf=1.0, tb=1.0, tw=2.0, tr=2.0)
    bound = machine_bound(300, 1 + TRANSFER_BUFFERS, costs)
    fastest = min(simulate_times(AsyncMultistage(300, interval, 1), costs).total_s
                  for interval in range(1, 301))
    assert (bound.interval, bound.slots) == (2, 1)
    assert bound.total_s <= fastest <= bound.total_s * 1.01
