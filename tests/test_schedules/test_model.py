"""The performance model: closed forms against the event simulation, stalls, interval choice."""
from __future__ import annotations

import itertools
import math
from dataclasses import replace

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from schedules import AsyncMultistage, InvalidValueError, Revolve, simulate
from schedules import model
from schedules.model import (
    CodecCosts,
    Costs,
    Level2Tier,
    choose_interval,
    predict_async_multistage,
    predict_revolve,
    predict_store_all,
    predict_tiered,
    simulate_times,
)
from schedules._search import beaten_up_to

times = st.floats(0.1, 10.0, allow_subnormal=False)


@settings(max_examples=80, deadline=None)
@given(data=st.data(), tf=times, extra=times, tc=st.sampled_from([0.0, 0.3]))
def test_closed_forms_equal_the_event_simulation_when_transfers_are_free(data, tf, extra,
                                                                         tc) -> None:
    n = data.draw(st.integers(1, 400), label="n")
    interval = data.draw(st.integers(1, n), label="interval")
    slots = data.draw(st.integers(1, 8), label="slots")
    costs = Costs(tf=tf, tb=tf + extra, tc=tc)
    closed = predict_async_multistage(n, interval, slots, costs)
    event = simulate_times(AsyncMultistage(n, interval, slots), costs)
    assert closed.total_s == pytest.approx(event.total_s, rel=1e-9)
    assert closed.forward_steps == event.forward_steps == simulate(
        AsyncMultistage(n, interval, slots)).forward_steps
    assert predict_revolve(n, slots, costs).total_s == pytest.approx(
        simulate_times(Revolve(n, slots), costs).total_s, rel=1e-9)


def test_store_all_is_n_forward_plus_n_reverse_less_the_shared_taping_step() -> None:
    costs = Costs(tf=1.0, tb=3.0)
    assert predict_store_all(10, costs).total_s == 9 * 1.0 + 10 * 3.0
    # interval 1 with free transfers costs exactly store-all
    assert predict_async_multistage(10, 1, 1, costs).total_s == predict_store_all(10, costs).total_s


def test_event_simulation_predicts_write_stalls_when_writes_cannot_keep_up() -> None:
    n, interval = 200, 2
    slow = Costs(tf=1.0, tb=2.0, tw=5.0, tr=1.0)  # a write takes longer than an interval
    event = simulate_times(AsyncMultistage(n, interval, 3), slow)
    closed = predict_async_multistage(n, interval, 3, slow)
    assert event.write_stall_s > 0
    # each interval is write-bound: (tw - I tf) per write, beyond the staging buffers
    assert event.write_stall_s == pytest.approx((5.0 - 2.0) * (n / interval - 2), rel=0.05)
    assert closed.write_stall_s == pytest.approx(event.write_stall_s, rel=0.05)
    fast = Costs(tf=1.0, tb=2.0, tw=1.5, tr=1.0)
    assert simulate_times(AsyncMultistage(n, interval, 3), fast).write_stall_s == 0


def test_event_simulation_predicts_late_prefetches() -> None:
    costs = Costs(tf=1.0, tb=2.0, tw=0.5, tr=30.0)  # a read takes longer than reversing an interval
    event = simulate_times(AsyncMultistage(100, 5, 4), costs)
    assert event.read_stall_s > 0
    assert predict_async_multistage(100, 5, 4, costs).read_stall_s == pytest.approx(
        event.read_stall_s, rel=0.1)


@pytest.mark.parametrize("tw", [0.0, 0.3, 1.0])
def test_choose_interval_is_one_when_writes_keep_up(tw: float) -> None:
    choice = choose_interval(500, 5, Costs(tf=1.0, tb=2.0, tw=tw, tr=tw))
    assert choice.interval == 1
    assert choice.prediction.total_s == pytest.approx(choice.store_all.total_s)
    assert choice.revolve.total_s > choice.prediction.total_s


@pytest.mark.parametrize("n", [300, 2000])
@pytest.mark.parametrize("tiered", [False, True])
def test_choose_interval_beyond_its_exhaustive_range_finds_the_best_within_a_tenth_percent(
        n: int, tiered: bool) -> None:
    """Above ``max_candidates`` a grid 10% apart and the intervals beside its best stand in for
    pricing every interval: on write and read costs from a tenth of a step to 40 steps, with a
    bounded fast tier or without, the interval found is priced within 0.1% of the best."""
    worst = 1.0
    for slots, tw, tr in itertools.product((1, 4, 11), (0.3, 1.5, 4, 12, 40), (0.5, 3, 20)):
        costs = Costs(tf=1.0, tb=2.0, tw=tw, tr=tr, tc=0.5, tcall=0.3, tx=0.2)
        tiers = [Level2Tier(10, tw / 5, tr / 5), Level2Tier(None, tw, tr)] if tiered else None
        found = choose_interval(n, slots, costs, max_candidates=32, tiers=tiers)
        best = choose_interval(n, slots, costs, max_candidates=n, tiers=tiers)
        worst = max(worst, found.prediction.total_s / best.prediction.total_s)
    assert worst <= 1.001


@settings(max_examples=60, deadline=None)
@given(data=st.data(), taping=st.booleans(), slack=st.sampled_from([0, 1]),
       tiered=st.booleans())
def test_no_interval_the_search_skips_prices_below_the_best_it_holds(data, taping: bool,
                                                                    slack: int,
                                                                    tiered: bool) -> None:
    """The grid stops where recomputation alone costs more than the best price found: every
    interval in [I, J] (J its bound) prices at least that best, whatever the costs."""
    n = data.draw(st.integers(2, 600), label="n")
    slots = data.draw(st.integers(1, 12), label="slots")
    cost = st.floats(0.0, 30.0, allow_subnormal=False)
    costs = Costs(tf=1.0, tb=1.0 + data.draw(cost, label="adjoint"), tw=data.draw(cost),
                  tr=data.draw(cost), tc=data.draw(cost), tcall=data.draw(cost),
                  tx=data.draw(cost), slack=slack)
    tiers = [Level2Tier(5, costs.tw / 4, costs.tr / 4), Level2Tier(None, costs.tw, costs.tr)]

    def price(interval: int):
        if tiered:
            return predict_tiered(n, interval, slots, costs, tiers, taping=taping)
        return predict_async_multistage(n, interval, slots, costs, taping=taping)

    held = price(data.draw(st.integers(1, n), label="held"))
    start = data.draw(st.integers(1, n), label="start")
    beaten = beaten_up_to(n, start, slots, costs, taping, held)
    for interval in range(start, min(beaten, n) + 1):
        assert price(interval).total_s >= held.total_s * (1 - 1e-9), interval


def test_choosing_an_interval_prices_as_many_at_n_1e9_as_at_n_1e5(monkeypatch) -> None:
    """The search's cost does not grow with n: a coarse grid, the dips it finds narrowed, and
    a bound above which no interval can win."""
    priced: list[int] = []
    real = model._interval

    def counted(n, interval, *args):
        priced.append(interval)
        return real(n, interval, *args)

    monkeypatch.setattr(model, "_interval", counted)
    counts: dict[tuple[int, int], int] = {}
    for n in (10**5, 10**7, 10**9):
        for slots in (1, 3, 30, 3000):
            costs = Costs(tf=1e-6, tb=3e-6, tw=4e-5, tr=2e-5, tc=2e-6, tcall=1e-6)
            tiers = [Level2Tier(20_000, 4e-6, 2e-6, in_memory=True),
                     Level2Tier(None, 4e-5, 2e-5)]
            priced.clear()
            choose_interval(n, slots, costs, max_candidates=64, tiers=tiers)
            counts[n, slots] = len(priced)
    assert max(counts.values()) <= 150, counts  # every interval 10% apart: 238 at n = 1e9
    for slots in (1, 3, 30, 3000):
        assert counts[10**9, slots] <= counts[10**5, slots] + 40, counts


def test_choose_interval_grows_with_the_write_time() -> None:
    chosen = [choose_interval(2000, 10, Costs(tf=1.0, tb=2.0, tw=tw, tr=tw)).interval
              for tw in (2.0, 8.0, 32.0)]
    assert chosen == sorted(chosen) and chosen[0] > 1 and chosen[-1] > chosen[0]
    for tw, interval in zip((2.0, 8.0, 32.0), chosen):
        costs = Costs(tf=1.0, tb=2.0, tw=tw, tr=tw)
        best = predict_async_multistage(2000, interval, 10, costs).total_s
        for other in range(1, 200):
            assert predict_async_multistage(2000, other, 10, costs).total_s >= best - 1e-9


def test_asynchronous_is_never_slower_than_revolve_with_free_transfers() -> None:
    costs = Costs(tf=1.0, tb=2.0)
    for n in (10, 100, 1000, 10000):
        for interval in (1, 10, n):
            assert (predict_async_multistage(n, interval, 10, costs).total_s
                    <= predict_revolve(n, 10, costs).total_s + 1e-9)


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        (dict(tf=0.0, tb=1.0), "Costs.tf must be > 0"),
        (dict(tf=-1.0, tb=1.0), "Costs.tf must be >= 0"),
        (dict(tf=1.0, tb=0.5), "Costs.tb includes the taping forward step"),
        (dict(tf=1.0, tb=2.0, tw=-0.1), "Costs.tw must be >= 0"),
        (dict(tf=math.nan, tb=2.0), "Costs.tf must be a finite number"),
        (dict(tf=1.0, tb=2.0, tr="1"), "Costs.tr must be a finite number"),
    ],
)
def test_bad_costs(kwargs: dict, message: str) -> None:
    with pytest.raises(ValueError, match=message):
        Costs(**kwargs)




def test_codec_costs_price_a_tier_holding_compressed_states() -> None:
    codec = CodecCosts(compress_s=2.0, decompress_s=1.0, stored=0.5)
    assert codec.write(4.0) == 4.0 and codec.read(4.0) == 3.0
    assert codec.tier(Level2Tier(5, 4.0, 4.0, in_memory=True)) == Level2Tier(10, 4.0, 3.0,
                                                                             in_memory=True)
    assert codec.tier(Level2Tier(None, 2.0, 2.0)).capacity is None
    for bad in (dict(stored=0.0), dict(stored=1.5), dict(compress_s=-1.0),
                dict(decompress_s=float("nan"))):
        values = {"compress_s": 1.0, "decompress_s": 1.0, "stored": 0.5, **bad}
        with pytest.raises(InvalidValueError, match="CodecCosts"):
            CodecCosts(**values)


def test_contention_is_paid_per_level2_transfer_and_simulated_alike() -> None:
    # 100 steps at I = 10: 10 states written and read back
    quiet = Costs(tf=1.0, tb=3.0, tw=0.1, tr=0.1, tc=0.05)
    busy = replace(quiet, tx=0.5)
    plain = predict_async_multistage(100, 10, 4, quiet, taping=False)
    contended = predict_async_multistage(100, 10, 4, busy, taping=False)
    assert contended.total_s - plain.total_s == pytest.approx(0.5 * (10 + 10))
    assert contended.forward_s - plain.forward_s == pytest.approx(0.5 * 10)
    schedule = AsyncMultistage(100, 10, 4, taping=False)
    simulated = [simulate_times(schedule, costs).total_s for costs in (quiet, busy)]
    assert simulated[1] - simulated[0] == pytest.approx(0.5 * 2 * schedule.l2_states)
    assert predict_revolve(100, 4, busy).total_s == predict_revolve(100, 4, quiet).total_s
