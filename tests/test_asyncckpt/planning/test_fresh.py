"""The runtime's price of fresh memory (page faults) and how the model's closed forms and
interval choice take it."""
from __future__ import annotations

import math
from dataclasses import replace

import pytest

from asyncckpt._tuning.fresh import FreshMemory
from schedules.model import (Costs, Level2Tier, choose_interval, predict_async_multistage,
                             predict_revolve, predict_tiered)


def test_fresh_memory_splits_in_memory_tiers_after_the_slots_take_their_share() -> None:
    dram, disk = Level2Tier(10, 1.0, 2.0, in_memory=True), Level2Tier(None, 5.0, 6.0)
    assert FreshMemory(warm=4, fault_s=0.5).split([dram, disk], slots=1) == [
        Level2Tier(3, 1.0, 2.0, in_memory=True), Level2Tier(7, 1.5, 2.0, in_memory=True), disk]
    # slots take every warm buffer: all of the tier is fresh; enough warm ones: none is
    assert FreshMemory(warm=1, fault_s=0.5).split([dram], slots=3) == [
        Level2Tier(10, 1.5, 2.0, in_memory=True)]
    assert FreshMemory(warm=20, fault_s=0.5).split([dram, disk], slots=3) == [dram, disk]
    unbounded = Level2Tier(None, 1.0, 2.0, in_memory=True)
    assert FreshMemory(warm=2, fault_s=0.5).split([unbounded], slots=0) == [
        Level2Tier(2, 1.0, 2.0, in_memory=True), Level2Tier(None, 1.5, 2.0, in_memory=True)]


def test_fresh_memory_prices_the_faults_of_the_buffers_a_schedule_touches() -> None:
    costs = Costs(tf=1.0, tb=2.0, tw=0.5, tr=0.5, tc=0.1, tcall=0.2)
    n, slots, fault = 100, 5, 30.0
    plain = predict_revolve(n, slots, costs)
    assert predict_revolve(n, slots, costs, fresh=FreshMemory(2, fault)).total_s == \
        pytest.approx(plain.total_s + (slots - 2) * fault)
    assert predict_revolve(3, slots, costs, fresh=FreshMemory(0, fault)).total_s == \
        pytest.approx(predict_revolve(3, slots, costs).total_s + 3 * fault)  # 3 slots used
    tier = [Level2Tier(None, costs.tw, costs.tr, in_memory=True)]
    interval = 10
    unpriced = predict_tiered(n, interval, slots, costs, tier)
    assert unpriced.total_s == pytest.approx(
        predict_async_multistage(n, interval, slots, costs).total_s)
    # every buffer warm: nothing to pay
    assert predict_tiered(n, interval, slots, costs, tier,
                          fresh=FreshMemory(slots + n, fault)).total_s == \
        pytest.approx(unpriced.total_s)
    # no buffer warm: the slots' faults on the main thread, and writes that take tw + fault
    # (longer than an interval's compute) stall the forward sweep
    cold = predict_tiered(n, interval, slots, costs, tier, fresh=FreshMemory(0, fault))
    slow_writes = predict_async_multistage(n, interval, slots, replace(costs, tw=0.5 + fault))
    assert cold.total_s == pytest.approx(slots * fault + slow_writes.total_s)
    assert cold.write_stall_s > 0 == unpriced.write_stall_s


def test_costly_fresh_memory_steers_the_choice_away_from_many_slots() -> None:
    costs = Costs(tf=1.0, tb=2.0, tw=0.5, tr=0.5)
    n, slots = 200, 50
    warm = choose_interval(n, slots, costs)
    cold = choose_interval(n, slots, costs, fresh=FreshMemory(0, 100.0))
    assert cold.revolve.total_s == pytest.approx(warm.revolve.total_s + slots * 100.0)
    # with slots this dear, short intervals (which use few of them) win
    assert cold.interval <= 3 and cold.prediction.total_s < cold.revolve.total_s


@pytest.mark.parametrize(("kwargs", "message"), [
    (dict(warm=-1, fault_s=1.0), "FreshMemory.warm must be"),
    (dict(warm=0, fault_s=math.inf), "FreshMemory.fault_s must be a finite number"),
    (dict(warm=0, fault_s=-1.0), "FreshMemory.fault_s must be a finite number of seconds >= 0"),
    (dict(warm=0, fault_s="1"), "FreshMemory.fault_s must be a finite number"),
])
def test_bad_fresh_memory(kwargs: dict, message: str) -> None:
    with pytest.raises(ValueError, match=message):
        FreshMemory(**kwargs)
