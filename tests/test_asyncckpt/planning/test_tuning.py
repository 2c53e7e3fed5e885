"""How "auto" picks among the plans the model prices, and how a run's measurements update what it
knew: pure functions of the numbers, no operators."""
from __future__ import annotations

from dataclasses import replace

import numpy as np
import pytest

from asyncckpt._tuning.choice import EXPLORE, explored
from asyncckpt._tuning.cost_memory import AGREED_LARGEST, CostMemory, agree_costs
from asyncckpt._tuning.residual import Missed
from asyncckpt._tuning.tuner import (DOUBT, NEAR_TIE, PRIOR_TRANSFERS, PRIOR_TX_COPIES,
                                       RUN_DECAY, CallFit, Completed, IntervalTuner, Plan,
                                       RunMean, cheapest_near_fastest, fastest_once_warm)
from asyncckpt.stats import Stats
from schedules.model import CodecCosts, Costs, choose_interval

CHOICE = choose_interval(100, 4, Costs(tf=1e-3, tb=2e-3, tw=1e-3, tr=1e-3, tc=1e-4))


def plan(slots: int, warm_s: float, faults_s: float = 0.0, transfers: int = 0) -> Plan:
    return Plan(slots, CHOICE.interval, CHOICE, warm_s, warm_s + faults_s, transfers)


def test_a_near_tie_goes_to_the_plan_whose_memory_is_warm() -> None:
    fastest = plan(500, 5.00, faults_s=15.0)  # the fastest warm, its memory not faulted in yet
    warm = plan(1, 5.00 * (1 + NEAR_TIE / 2))  # barely slower, nothing to fault in
    slow = plan(2, 5.00 * (1 + 2 * NEAR_TIE))  # no faults either, but clearly slower
    assert cheapest_near_fastest([fastest, warm, slow]) is warm


def test_among_warm_near_ties_the_plan_with_less_level2_traffic_wins() -> None:
    # Devito 3D taping-free, both plans warm: every state to Level-2 (5.20 s predicted, 6.5 to
    # 6.7 s measured) against store-all in Level-1, u_0 alone on Level-2 (5.26 s, 5.9 s)
    every_state = plan(1, 5.20, transfers=770)
    in_level1 = plan(583, 5.26, transfers=1)
    assert cheapest_near_fastest([every_state, in_level1]) is in_level1
    # faults still come first: warm memory beats less traffic
    assert cheapest_near_fastest([every_state, plan(583, 5.26, 15.0, transfers=1)]) \
        is every_state
    # and traffic never outweighs a difference beyond the model's noise
    assert cheapest_near_fastest([every_state, plan(583, 5.20 * (1 + 2 * NEAR_TIE), 0.0, 1)]) \
        is every_state
    # once a run has measured what a transfer takes from the compute, the prices hold it: the
    # faster warm plan wins
    assert cheapest_near_fastest([every_state, in_level1], traffic_priced=True) is every_state


def test_a_clearly_faster_plan_is_taken_despite_its_faults() -> None:
    fastest = plan(500, 5.00, faults_s=15.0)
    warm = plan(1, 5.00 * (1 + 2 * NEAR_TIE))
    assert cheapest_near_fastest([warm, fastest]) is fastest


def test_a_kind_of_plan_no_run_has_measured_runs_once_where_its_price_is_near() -> None:
    # Devito 3D at 8% of the states: the runs of I = 2 (499 transfers) priced Revolve in 79
    # slots with their copies and residual, 4.5% above I = 2, and it ran 19% faster
    def measured(plan: Plan) -> bool:
        return plan.transfers > 0  # runs with transfers have been learned from, none without
    interval = plan(1, 9.23, transfers=499)
    alone = plan(79, 9.65)
    fewer_slots = plan(51, 9.68)
    assert explored([interval, alone, fewer_slots], interval, measured) is alone
    # priced beyond the margin it stays untried, and a chosen plan of the untried kind stays
    far = plan(79, 9.23 * (1 + 2 * EXPLORE))
    assert explored([interval, far], interval, measured) is interval
    assert explored([interval, alone], alone, measured) is alone
    # once both kinds have run, the choice stands
    assert explored([interval, alone], interval, lambda plan: True) is interval
    with pytest.raises(ValueError, match="margin"):
        explored([interval], interval, measured, margin=-0.1)


def test_the_tuner_knows_which_kinds_of_plan_its_runs_measured() -> None:
    tuner = IntervalTuner(n_steps=100, l1_slots=4, staging_buffers=2, inline=False,
                          taping=True, tw=1e-3, tr=1e-3, tc=3e-4, tf=1e-3)
    assert not tuner.measured(10) and not tuner.measured(0)
    tuner.learn(Stats(copies=10, copy_s=0.01, l2_writes=10), fit=calls_of(0.0, 1e-3, [1, 10]))
    assert tuner.measured(10) and not tuner.measured(0)
    # writes the staging buffers absorb (u_0's alone) leave a run of the quiet kind
    assert not tuner.measured(2)
    # inline transfers run beside nothing: their runs are of the quiet kind
    inline = IntervalTuner(n_steps=100, l1_slots=4, staging_buffers=2, inline=True,
                           taping=True, tw=1e-5, tr=1e-5, tc=3e-4, tf=1e-3)
    inline.learn(Stats(copies=10, copy_s=0.01, l2_writes=10), fit=calls_of(0.0, 1e-3, [1, 10]))
    assert inline.measured(10) and inline.measured(0)


def test_a_first_run_takes_the_fastest_faults_aside() -> None:
    fastest = plan(500, 5.00, faults_s=15.0)
    warm = plan(1, 5.00 * (1 + NEAR_TIE / 2))
    assert fastest_once_warm([warm, fastest]) is fastest
    assert fastest_once_warm([plan(300, 5.0), plan(3, 5.0, faults_s=1.0)]).slots == 3
    with pytest.raises(ValueError, match="no plan to choose from"):
        fastest_once_warm([])


def test_equal_plans_go_to_the_fewest_slots() -> None:
    many, few = plan(300, 5.0), plan(3, 5.0)
    assert cheapest_near_fastest([many, few]) is few
    assert cheapest_near_fastest([few, many]) is few


def test_no_plan_or_a_negative_tolerance_is_refused() -> None:
    with pytest.raises(ValueError, match="no plan to choose from"):
        cheapest_near_fastest([])
    with pytest.raises(ValueError, match="near must be >= 0, got -0.1"):
        cheapest_near_fastest([plan(1, 5.0)], near=-0.1)


def tuner_with_tiers(costs: list[tuple[float, float]]) -> IntervalTuner:
    return IntervalTuner(n_steps=100, l1_slots=4, staging_buffers=2, inline=False, taping=True,
                         tw=1e-3, tr=1e-3, tc=1e-4, tf=1e-3, tier_costs=list(costs))


def test_a_tier_that_moved_one_state_nudges_its_cost_and_one_that_moved_hundreds_sets_it() -> None:
    tuner = tuner_with_tiers([(1e-3, 1e-3), (2e-3, 2e-3)])
    stats = Stats()
    # one slow cold read on the first tier; 400 transfers of 4 ms each on the second
    stats.l2_tiers = [{"writes": 1, "reads": 1, "write_s": 1e-3, "read_s": 6e-3},
                      {"writes": 400, "reads": 400, "write_s": 1.6, "read_s": 1.6}]
    tuner.learn(stats, fit=CallFit())
    assert tuner.tier_costs is not None
    (tw0, tr0), (tw1, tr1) = tuner.tier_costs
    assert tw0 == pytest.approx(1e-3)
    assert tr0 == pytest.approx((PRIOR_TRANSFERS * 1e-3 + 6e-3) / (PRIOR_TRANSFERS + 1))
    assert 1e-3 < tr0 < 6e-3 / 2  # nudged towards the lone read, not replaced by it
    assert tw1 == tr1 == pytest.approx(4e-3, rel=0.02)  # the sustained cost wins
    # a tier that moved nothing keeps what was known
    stats.l2_tiers = [{"writes": 0, "reads": 0, "write_s": 0.0, "read_s": 0.0}] * 2
    tuner.learn(stats, fit=CallFit())
    assert tuner.tier_costs == [(tw0, tr0), (tw1, tr1)]


def test_each_tier_takes_its_costs_back_to_uncompressed_states_by_its_own_share() -> None:
    """Compressed states: the fast tier stored the run's first states at a tenth of their size,
    the disk the later ones at half. Each tier's seconds are divided by the share it stored,
    not by the run's overall share of 0.3 (which would price an uncompressed state on the fast
    tier at a third of its cost and on the disk at 1.67 times it)."""
    tuner = tuner_with_tiers([(1e-3, 1e-3), (2e-3, 2e-3)])
    stats = Stats()
    raw = 1 << 20
    stats.l2_writes, stats.bytes_written = 800, 800 * raw
    stats.l2_stored_bytes = 400 * raw // 10 + 400 * raw // 2
    stats.l2_tiers = [{"writes": 400, "reads": 400, "write_s": 400 * 1e-4, "read_s": 400 * 1e-4,
                       "written_bytes": 400 * raw // 10},
                      {"writes": 400, "reads": 400, "write_s": 400 * 1e-3, "read_s": 400 * 1e-3,
                       "written_bytes": 400 * raw // 2}]
    tuner.learn(stats, fit=CallFit())
    assert tuner.tier_costs is not None
    (tw0, tr0), (tw1, tr1) = tuner.tier_costs
    assert tw0 == pytest.approx(1e-3, rel=0.02) and tr0 == pytest.approx(1e-3, rel=0.02)
    assert tw1 == pytest.approx(2e-3, rel=0.02) and tr1 == pytest.approx(2e-3, rel=0.02)


def test_an_untiered_level2_learns_its_costs_the_same_way() -> None:
    tuner = IntervalTuner(n_steps=100, l1_slots=4, staging_buffers=2, inline=False, taping=True,
                          tw=1e-3, tr=1e-3, tc=1e-4, tf=1e-3)
    stats = Stats()
    stats.l2_writes, stats.write_busy_s, stats.write_fresh_s = 1000, 2.5, 0.5  # 2 ms unfaulted
    stats.l2_reads, stats.read_busy_s = 1, 9e-3
    tuner.learn(stats, fit=CallFit())
    assert tuner.tw == pytest.approx(2e-3, rel=0.01)
    assert tuner.tr == pytest.approx((PRIOR_TRANSFERS * 1e-3 + 9e-3) / (PRIOR_TRANSFERS + 1))



def test_the_price_of_fresh_memory_is_learned_from_the_buffers_a_run_faulted_in() -> None:
    # the probe at construction found pages the process had just freed (12 ms a state); the
    # run then faulted in 585 slots at 27 ms each (Devito 3D, 10 MiB states)
    tuner = IntervalTuner(n_steps=100, l1_slots=4, staging_buffers=2, inline=False, taping=True,
                          tw=1e-3, tr=1e-3, tc=1e-4, tf=1e-3, fault_s=0.012)
    stats = Stats()
    stats.fresh_buffers, stats.fresh_s = 585, 585 * 0.027
    tuner.learn(stats, fit=CallFit())
    assert tuner.fault_s == pytest.approx(0.027, rel=0.01)
    # a run that faulted nothing in (its memory warm) keeps the price
    tuner.learn(Stats(), fit=CallFit())
    assert tuner.fault_s == pytest.approx(0.027, rel=0.01)
    # where faults are not priced (a device run), nothing is learned
    device = IntervalTuner(n_steps=100, l1_slots=4, staging_buffers=2, inline=False,
                           taping=True, tw=1e-3, tr=1e-3, tc=1e-4, tf=1e-3)
    device.learn(stats, fit=CallFit())
    assert device.fault_s is None


def calls_of(tcall: float, tf: float, lengths: list[int]) -> CallFit:
    fit = CallFit()
    for steps in lengths:
        fit.add(steps, tcall + steps * tf)
    return fit


def test_compute_costs_pool_the_runs_each_earlier_one_weighing_half() -> None:
    tuner = IntervalTuner(n_steps=100, l1_slots=4, staging_buffers=2, inline=False, taping=True,
                          tw=1e-3, tr=1e-3, tc=1e-4, tf=1e-3)
    # three gradients on a machine whose step cost moves by 15% between them (Devito 3D)
    runs = [(5e-4, 1.73e-3, 3.0e-3, 0.8e-3), (1e-4, 1.29e-3, 3.5e-3, 0.6e-3),
            (2e-4, 1.67e-3, 3.2e-3, 0.9e-3)]
    lengths = [1, 1, 1, 2, 5, 1, 3]
    for tcall, tf, adjoint, copy in runs:
        stats = Stats()
        stats.reverse_steps, stats.reverse_compute_s = 100, 100 * adjoint
        stats.copies, stats.copy_s = 10, 10 * copy
        tuner.learn(stats, fit=calls_of(tcall, tf, lengths))
    # tf and tcall: least squares over every call, weighted 1/4, 1/2 and 1 by run
    weights = [RUN_DECAY ** (len(runs) - 1 - k) for k in range(len(runs))]
    x = np.array(lengths * len(runs), dtype=float)
    y = np.array([tcall + steps * tf for tcall, tf, _, _ in runs for steps in lengths])
    w = np.repeat(weights, len(lengths))
    slope, intercept = np.polyfit(x, y, 1, w=np.sqrt(w))
    assert tuner.tf == pytest.approx(slope) and tuner.tcall == pytest.approx(intercept)
    # the reverse call and the copy: the same weights

    def mean(k: int) -> float:
        return sum(wk * run[k] for wk, run in zip(weights, runs)) / sum(weights)

    assert tuner.tb == pytest.approx(tuner.tf + mean(2))
    assert tuner.tc == pytest.approx(mean(3))
    assert tuner.runs == 3


def test_a_run_mean_weighs_each_earlier_run_half_the_next() -> None:
    mean = RunMean()
    assert mean.add(3.0) == 3.0  # the first run alone
    assert mean.add(6.0) == pytest.approx((RUN_DECAY * 3.0 + 6.0) / (RUN_DECAY + 1))
    assert mean.weight == pytest.approx(RUN_DECAY + 1)


def test_steps_beside_background_transfers_are_priced_apart_for_plans_with_level2() -> None:
    # Devito 3D: a forward step took 1.22 ms in Level-1 alone and 1.45 to 1.51 ms beside one
    # Level-2 transfer per step; pooled, I = 1 looked as fast as Level-1 alone and ran 26% slower
    def quiet_tuner() -> IntervalTuner:
        return IntervalTuner(n_steps=100, l1_slots=4, staging_buffers=2, inline=False,
                             taping=False, tw=1e-3, tr=1e-3, tc=6e-4, tf=1.2e-3)

    tuner = quiet_tuner()
    quiet = Stats(copies=100, copy_s=0.06, reverse_steps=100, reverse_compute_s=0.25)
    tuner.learn(quiet, fit=calls_of(1e-4, 1.2e-3, [1, 10]))
    before = {interval: tuner.price(4, interval) for interval in (0, 10)}
    busy = Stats(copies=100, copy_s=0.12, l2_writes=10, reverse_steps=100,
                 reverse_compute_s=0.3)
    busy_calls = calls_of(2e-4, 1.5e-3, [1, 10])
    tuner.learn(busy, fit=busy_calls)
    assert (tuner.tf, tuner.tcall) == pytest.approx((1.2e-3, 1e-4))
    assert (tuner.tf_busy, tuner.tcall_busy) == pytest.approx((1.5e-3, 2e-4))
    assert tuner.tb_busy == pytest.approx(1.5e-3 + 3e-3)
    # priced as the quiet costs plus what each transfer took from them: the forward calls'
    # excess, 0.06 s more copying and 0.05 s more in the reverse calls, over 10 transfers
    # (shrunk towards 0 by a prior worth PRIOR_TRANSFERS transfers)
    busy_costs = tuner.costs(busy=True)
    assert (busy_costs.tf, busy_costs.tcall, busy_costs.tb, busy_costs.tc) == pytest.approx(
        (1.2e-3, 1e-4, 1.2e-3 + 2.5e-3, 6e-4))
    excess = busy_calls.seconds - busy_calls.calls * 1e-4 - busy_calls.steps * 1.2e-3
    assert busy_costs.tx == pytest.approx((excess + 0.06 + 0.05) / (PRIOR_TRANSFERS + 10))
    # so an interval moving half the states pays half as much of it
    def contention(interval: int) -> float:
        base = tuner.price(4, interval)
        tuner.tx, saved = 0.0, tuner.tx
        try:
            return base - tuner.price(4, interval)
        finally:
            tuner.tx = saved
    assert contention(10) == pytest.approx(2 * contention(20), rel=0.15)
    # Revolve in Level-1 alone keeps its price, the interval plan pays for the contention
    assert tuner.price(4, 0) == pytest.approx(before[0])
    assert tuner.price(4, 10) > before[10]
    # a quiet run revises the quiet costs and leaves the busy ones alone
    tuner.learn(quiet, fit=calls_of(1e-4, 1.1e-3, [1, 10]))
    assert tuner.tf < 1.2e-3 and tuner.tf_busy == pytest.approx(1.5e-3)
    # a first run with Level-2 traffic lends its steps and its reverse call to Revolve in
    # Level-1 alone (better than the probe's steps and guessing two forward steps): the probe
    # times a burst of calls from u_0, and on Devito 3D a step probed 0.78 ms cost 1.03 to
    # 1.25 ms in runs. Its steps are no contention until a run without transfers has measured
    # what a step costs without them (before, the first run's gap priced interval 2 out)
    first = quiet_tuner()
    first.learn(busy, fit=calls_of(2e-4, 1.5e-3, [1, 10]))
    assert first.tb is None and first.costs().tf == pytest.approx(1.5e-3)
    assert first.costs().tb == pytest.approx(1.5e-3 + 3e-3)
    assert first.tx == pytest.approx(0.0, abs=1e-12)
    assert first.costs(busy=True).tf == pytest.approx(1.5e-3)
    # until a run with Level-2 traffic has measured them, plans with it take the quiet costs,
    # each transfer taking the bandwidth of PRIOR_TX_COPIES copies from them
    assert quiet_tuner().costs(busy=True) == replace(quiet_tuner().costs(),
                                                     tx=PRIOR_TX_COPIES * 6e-4)


def test_transfers_are_not_charged_for_copies_colder_than_the_probes() -> None:
    # Devito 3D, 6 MiB states: the probe copied cache-held memory in 0.29 ms, every run
    # copied in 0.52 to 0.69 ms, transfers or not; charged to 82 transfers, that made tx 12 ms
    def probed() -> IntervalTuner:
        return IntervalTuner(n_steps=100, l1_slots=4, staging_buffers=2, inline=False,
                             taping=True, tw=1e-3, tr=1e-3, tc=3e-4, tf=1e-3)
    busy = Stats(copies=100, copy_s=0.06, l2_writes=10, l2_reads=10)
    steps = calls_of(0.0, 1e-3, [1, 10])  # the forward calls at their probed cost
    tuner = probed()
    tuner.learn(busy, fit=steps)
    assert tuner.tx == pytest.approx(0.0)  # the copies' 0.03 s is no transfer's
    # once a run without transfers has measured what its copies cost, the busy run's copies
    # beyond that are the transfers'
    tuner = probed()
    tuner.learn(Stats(copies=100, copy_s=0.04), fit=steps)
    tuner.learn(busy, fit=steps)
    assert tuner.tx == pytest.approx(0.02 / (PRIOR_TRANSFERS + 20))


def test_copies_beside_background_transfers_are_priced_apart_for_plans_with_level2() -> None:
    # Devito 3D: a 10 MiB copy took 0.6 ms in Level-1 alone and 1.2 ms beside the I/O thread
    def fresh() -> IntervalTuner:
        return IntervalTuner(n_steps=100, l1_slots=4, staging_buffers=2, inline=False,
                             taping=True, tw=1e-3, tr=1e-3, tc=6e-4, tf=1e-3)
    tuner = fresh()
    quiet_interval = tuner.price(4, 10)
    busy = Stats(copies=100, copy_s=0.12, l2_writes=10)
    tuner.learn(busy, fit=CallFit())
    assert tuner.tc == 6e-4 and tuner.tc_busy == pytest.approx(1.2e-3)
    assert tuner.costs(busy=True).tc == pytest.approx(1.2e-3)
    assert tuner.price(4, 10) > quiet_interval
    # until a run without Level-2 traffic has measured its copies, Revolve in Level-1 alone
    # pays them as the run with traffic did: the probe copied memory the cache held
    assert tuner.costs().tc == pytest.approx(1.2e-3)
    assert tuner.price(4, 0) > fresh().price(4, 0)
    # a run without Level-2 traffic revises the quiet cost only, as does one whose writes the
    # staging buffers absorbed (u_0 alone on Level-2); from then on Revolve in Level-1 pays
    # its copies at the quiet cost, the interval plan at the busy one
    tuner.learn(Stats(copies=100, copy_s=0.05), fit=CallFit())
    assert tuner.tc == pytest.approx(5e-4) and tuner.tc_busy == pytest.approx(1.2e-3)
    tuner.learn(Stats(copies=100, copy_s=0.05, l2_writes=1), fit=CallFit())
    assert tuner.tc == pytest.approx(5e-4) and tuner.tc_busy == pytest.approx(1.2e-3)
    assert tuner.costs().tc == pytest.approx(5e-4)
    assert tuner.costs(busy=True).tc == pytest.approx(1.2e-3)
    # inline transfers run on the caller's thread, beside nothing: their copies are quiet ones
    inline = IntervalTuner(n_steps=100, l1_slots=4, staging_buffers=2, inline=True, taping=True,
                           tw=1e-5, tr=1e-5, tc=6e-4, tf=1e-3)
    inline.learn(busy, fit=CallFit())
    assert inline.tc_busy is None and inline.tc == pytest.approx(1.2e-3)


def test_compressed_plans_are_priced_with_the_codec_and_its_ratio() -> None:
    tuner = tuner_with_tiers([(1e-3, 1e-3), (8e-3, 6e-3)])
    tuner.codec = CodecCosts(compress_s=2e-3, decompress_s=1e-3, stored=0.25)
    plain = tuner.costs(busy=True)
    packed = tuner.costs(busy=True, compressed=True)
    assert (packed.tw, packed.tr) == pytest.approx((2e-3 + 0.25 * plain.tw,
                                                    0.25 * plain.tr + 1e-3))
    assert (packed.tf, packed.tb, packed.tc) == (plain.tf, plain.tb, plain.tc)
    tiers = tuner.tiers_for_model([10, None], priced=False, compressed=True)
    assert tiers is not None
    assert [(t.capacity, t.tw, t.tr) for t in tiers] == [
        (40, pytest.approx(2.25e-3), pytest.approx(1.25e-3)),
        (None, pytest.approx(4e-3), pytest.approx(2.5e-3))]
    # Revolve in Level-1 alone moves nothing through the codec
    assert tuner.price(4, 0, [10, None], compressed=True) == tuner.price(4, 0, [10, None])
    with pytest.raises(ValueError, match="codec's costs are known"):
        IntervalTuner(n_steps=100, l1_slots=4, staging_buffers=2, inline=False, taping=True,
                      tw=1e-3, tr=1e-3, tc=1e-4, tf=1e-3).costs(compressed=True)


def test_a_compressed_run_teaches_the_codecs_costs_and_the_uncompressed_transfers() -> None:
    tuner = IntervalTuner(n_steps=100, l1_slots=4, staging_buffers=2, inline=False, taping=True,
                          tw=1e-3, tr=1e-3, tc=1e-4, tf=1e-3)
    stats = Stats()
    # 1000 states of 1 MB, a quarter of each stored: 3 ms on the I/O thread per write, of
    # which 2 ms compressing; reads 1 ms, of which 0.5 ms decompressing (the probe had found
    # the device four and two times faster)
    stats.l2_writes = stats.l2_reads = stats.encoded_states = stats.decoded_states = 1000
    stats.bytes_written = stats.encoded_bytes = 1000 << 20
    stats.l2_stored_bytes = stats.encoded_stored_bytes = 250 << 20
    stats.write_busy_s, stats.compress_s = 3.0, 2.0
    stats.read_busy_s, stats.decompress_s = 1.0, 0.5
    tuner.learn(stats, fit=CallFit())
    assert tuner.codec is not None
    assert tuner.codec.compress_s == pytest.approx(2e-3, rel=0.01)
    assert tuner.codec.decompress_s == pytest.approx(0.5e-3, rel=0.01)
    assert tuner.codec.stored == pytest.approx(0.25)
    # 1 ms to write a quarter state: 4 ms for a whole one; 0.5 ms to read a quarter: 2 ms
    assert tuner.tw == pytest.approx(4e-3, rel=0.01)
    assert tuner.tr == pytest.approx(2e-3, rel=0.01)
    # a run that sampled the codec on a few states nudges what it knows
    stats.encoded_states = stats.decoded_states = 2
    stats.encoded_bytes, stats.encoded_stored_bytes = 2 << 20, 2 << 20
    stats.compress_s, stats.decompress_s = 2 * 8e-3, 2 * 2e-3
    stats.bytes_written = stats.l2_stored_bytes = 1000 << 20
    tuner.learn(stats, fit=CallFit())
    blend = PRIOR_TRANSFERS + 2
    assert tuner.codec.compress_s == pytest.approx((PRIOR_TRANSFERS * 2e-3 + 16e-3) / blend)
    assert tuner.codec.stored == pytest.approx((PRIOR_TRANSFERS * 0.25 + 2 * 1.0) / blend)


def test_a_run_that_compressed_every_state_never_makes_uncompressed_transfers_cheaper() -> None:
    """A disk throttled to 300 MiB/s with a burst allowance wrote lz4's quarter-size states at
    1.9 GB/s (the load under the cap), and 10 MiB uncompressed ones at 0.3 GB/s. Scaled by
    the share stored, the compressed run would price an uncompressed write at 7 ms instead of
    33: "auto" then chose an uncompressed plan that ran 2.8 times as long (measured)."""
    tuner = IntervalTuner(n_steps=100, l1_slots=4, staging_buffers=2, inline=False, taping=True,
                          tw=33e-3, tr=33e-3, tc=1e-4, tf=1e-3)
    stats = Stats()
    stats.l2_writes = stats.l2_reads = stats.encoded_states = stats.decoded_states = 67
    stats.bytes_written = stats.encoded_bytes = 67 * (10 << 20)
    stats.l2_stored_bytes = stats.encoded_stored_bytes = 67 * (10 << 20) // 4
    stats.write_busy_s, stats.compress_s = 0.535, 0.443  # 1.4 ms a write beyond the codec
    stats.read_busy_s, stats.decompress_s = 0.383, 0.239
    tuner.learn(stats, fit=CallFit())
    assert tuner.tw == tuner.tr == 33e-3
    # a run that sampled the codec on every eighth state measures the device as it is
    stats.encoded_states = stats.decoded_states = 8
    tuner.learn(stats, fit=CallFit())
    assert tuner.tw < 33e-3 and tuner.tr < 33e-3
    # tiers likewise
    tiered = tuner_with_tiers([(1e-3, 1e-3), (33e-3, 33e-3)])
    stats.encoded_states = stats.decoded_states = 67
    stats.l2_tiers = [{"writes": 0, "reads": 0, "write_s": 0.0, "read_s": 0.0},
                      {"writes": 67, "reads": 67, "write_s": 0.092, "read_s": 0.144,
                       "written_bytes": 67 * (10 << 20) // 4}]
    tiered.learn(stats, fit=CallFit())
    assert tiered.tier_costs == [(1e-3, 1e-3), (33e-3, 33e-3)]


def test_a_lighter_run_lowers_a_path_no_further_than_a_loaded_run_measured_it() -> None:
    """Devito 3D, nt = 2000, a disk throttled to 300 MiB/s with a burst allowance: 80 writes
    of 10 MiB spread over a run took 5 ms each, 470 that kept the I/O thread busy 33 ms each.
    Priced from the light run, "auto" chose the 470-write plan, which stalled 11 s."""
    tuner = tuner_with_tiers([(6e-3, 6e-3), (5e-3, 5e-3)])
    stats = Stats()
    stats.forward_s = stats.reverse_s = 16.0
    # loaded: 470 writes and reads of 33 ms, 15.5 s of each 16 s sweep; the DRAM tier idle
    stats.l2_tiers = [{"writes": 0, "reads": 0, "write_s": 0.0, "read_s": 0.0},
                      {"writes": 470, "reads": 470, "write_s": 15.5, "read_s": 15.5}]
    tuner.learn(stats, fit=CallFit())
    assert tuner.tier_costs is not None
    loaded = tuner.tier_costs[1]
    assert loaded[0] == pytest.approx(33e-3, rel=0.01)
    # light: 80 disk writes and reads of 5 ms (0.4 s of 9 s); the DRAM tier's reads at 1.2 ms,
    # below its cold probe, lower its price as before
    stats.forward_s = stats.reverse_s = 9.0
    stats.l2_tiers = [{"writes": 400, "reads": 400, "write_s": 0.48, "read_s": 0.48},
                      {"writes": 80, "reads": 80, "write_s": 0.4, "read_s": 0.4}]
    for _ in range(3):
        tuner.learn(stats, fit=CallFit())
        assert tuner.tier_costs[1] == loaded
    assert tuner.tier_costs[0][1] < 2e-3
    # a loaded run that measures the disk faster sets the floor lower
    stats.forward_s = stats.reverse_s = 10.0
    stats.l2_tiers[1] = {"writes": 470, "reads": 470, "write_s": 9.4, "read_s": 9.4}
    tuner.learn(stats, fit=CallFit())
    assert tuner.tier_costs[1][0] == pytest.approx(20e-3, rel=0.02)
    # one storage alike
    single = IntervalTuner(n_steps=100, l1_slots=4, staging_buffers=2, inline=False,
                           taping=True, tw=5e-3, tr=5e-3, tc=1e-4, tf=1e-3)
    stats = Stats()
    stats.l2_writes = stats.l2_reads = 470
    stats.bytes_written = stats.l2_stored_bytes = 470 * (10 << 20)
    stats.forward_s = stats.reverse_s = 16.0
    stats.write_busy_s = stats.read_busy_s = 15.5
    single.learn(stats, fit=CallFit())
    floor = (single.tw, single.tr)
    # the next checkpointer of the process (a fresh Revolver per gradient) starts from it
    memory = CostMemory()
    memory.keep(("key",), single)
    single = memory.recall(("key",), IntervalTuner(
        n_steps=100, l1_slots=4, staging_buffers=2, inline=False, taping=True, tw=5e-3,
        tr=5e-3, tc=1e-4, tf=1e-3))
    stats.l2_writes = stats.l2_reads = 80
    stats.bytes_written = stats.l2_stored_bytes = 80 * (10 << 20)
    stats.write_busy_s = stats.read_busy_s = 0.4
    single.learn(stats, fit=CallFit())
    assert (single.tw, single.tr) == floor


class _OneRank:
    """The ranks of agree_costs as one process sees them: what it sends is what it gets."""

    sent: tuple[list, list] = ([], [])

    def agree(self, largest: list, least: list) -> tuple[list, list]:
        self.sent = (list(largest), list(least))
        return self.sent


class _TwoRanks:
    """The ranks of agree_costs, one in this process, reducing as the MPI reduction does: the
    other rank's values are those its tuner sends."""

    def __init__(self, other: IntervalTuner) -> None:
        alone = _OneRank()
        agree_costs(other, alone)
        self.other = alone.sent

    def agree(self, largest: list, least: list) -> tuple[list, list]:
        def pick(choose, mine, theirs):
            return [None if a is None and b is None else choose(v for v in (a, b)
                                                                if v is not None)
                    for a, b in zip(mine, theirs, strict=True)]
        return pick(max, largest, self.other[0]), pick(min, least, self.other[1])


def test_ranks_agree_on_which_tier_holds_memory() -> None:
    # rank 0 writes Level-2 to a directory, rank 1 to DRAM: with faults priced, each priced
    # its plans differently and the two could choose different plans (a fresh clone's MPI
    # test once failed so)
    def tuner(in_memory):
        return IntervalTuner(n_steps=400, l1_slots=3, staging_buffers=2, inline=False,
                             taping=True, tw=1e-4, tr=1e-4, tc=1e-5, tf=1e-4,
                             fault_s=5e-3, warm_buffers=0, in_memory=in_memory)

    on_disk, in_dram = tuner(None), tuner(0)
    before = (on_disk.price(3, 4, None), in_dram.price(3, 4, None))
    assert before[0] != before[1]
    disk_rank, dram_rank = _TwoRanks(tuner(None)), _TwoRanks(tuner(0))
    agree_costs(on_disk, dram_rank)
    agree_costs(in_dram, disk_rank)
    assert on_disk.in_memory == in_dram.in_memory == 0
    assert on_disk.price(3, 4, None) == in_dram.price(3, 4, None)


def test_ranks_agree_on_every_cost_in_one_reduction() -> None:
    """Every cost the model prices with, the tiers' and the codec's included, is packed into
    one reduction of numbers and comes back as the largest of the ranks' (fewest warm
    buffers; no codec where one rank has none)."""
    def tuner(scale: float, codec: CodecCosts | None) -> IntervalTuner:
        made = IntervalTuner(n_steps=400, l1_slots=3, staging_buffers=2, inline=False,
                             taping=True, tw=1e-4 * scale, tr=2e-4, tc=1e-5, tf=1e-4 * scale,
                             fault_s=5e-3, warm_buffers=int(4 / scale), in_memory=None)
        made.tier_costs = [(1e-4 * scale, 2e-4), (3e-3, 4e-3 * scale)]
        made.codec = codec
        made.residual = {False: 1e-6 * scale, True: None}
        made.missed = Missed(0.1 * scale, 800, 398)
        return made

    small, large = CodecCosts(1e-3, 2e-3, 0.5), CodecCosts(2e-3, 1e-3, 0.25)
    one, two = tuner(1.0, small), tuner(2.0, large)
    agree_costs(one, _TwoRanks(tuner(2.0, large)))
    agree_costs(two, _TwoRanks(tuner(1.0, small)))
    for agreed in (one, two):
        assert (agreed.tw, agreed.tf, agreed.tr, agreed.warm_buffers) == (2e-4, 2e-4, 2e-4, 2)
        assert agreed.tier_costs == [(2e-4, 2e-4), (3e-3, 8e-3)]
        assert agreed.codec == CodecCosts(2e-3, 2e-3, 0.5)
        assert agreed.residual == {False: 2e-6, True: None}
        assert agreed.missed == Missed(0.2, 800, 398)
    assert {name: getattr(one, name) for name in AGREED_LARGEST} == \
        {name: getattr(two, name) for name in AGREED_LARGEST}
    without = tuner(1.0, None)
    agree_costs(without, _TwoRanks(tuner(1.0, small)))
    assert without.codec is None


def test_agreed_costs_never_put_one_ranks_tb_below_anothers_tf() -> None:
    """64 ranks once agreed on tf_busy from a rank that had measured no reverse call beside
    transfers and tb_busy from one whose steps were faster: tb < tf, which the model refuses
    (InvalidValueError on every rank)."""
    def tuner(tf_busy: float, tb_busy: float | None) -> IntervalTuner:
        made = IntervalTuner(n_steps=400, l1_slots=3, staging_buffers=2, inline=False,
                             taping=True, tw=1e-4, tr=1e-4, tc=1e-5, tf=1e-4, tb=3e-4)
        made.tf_busy, made.tb_busy = tf_busy, tb_busy
        return made

    slow, fast = tuner(9e-4, None), tuner(2e-4, 4e-4)
    agree_costs(slow, _TwoRanks(tuner(2e-4, 4e-4)))
    agree_costs(fast, _TwoRanks(tuner(9e-4, None)))
    for agreed in (slow, fast):
        assert (agreed.tf_busy, agreed.tb_busy) == (9e-4, 9e-4 + 2e-4)
        agreed.costs(busy=True)  # a valid Costs: tb >= tf


def test_a_run_off_its_price_corrects_the_next_plans_of_both_kinds() -> None:
    """What a run took beyond its plan's price, per step, is priced into the next plans: those
    of its kind, and those of the other kind until one of theirs is measured."""
    tuner = IntervalTuner(100, 4, 2, inline=False, taping=False, tw=1e-3, tr=1e-3, tc=1e-4,
                          tf=1e-3, tb=2e-3, runs=1)
    multistage, revolve = tuner.price(4, 10), tuner.price(4, 0)
    stats = Stats(n_timesteps=100, l1_slots=4, interval=10)
    stats.forward_steps, stats.reverse_steps = 150, 100
    stats.forward_s = multistage + 250 * 2e-4  # 0.2 ms a step beyond the price
    tuner.learn_residual(stats, None)
    assert tuner.residual[True] == pytest.approx(2e-4)
    assert tuner.residual[False] is None
    assert tuner.price(4, 10) > multistage and tuner.price(4, 0) > revolve
    # a Revolve run measured at its price: its own kind is priced as measured
    done = Stats(n_timesteps=100, l1_slots=4, interval=0)
    done.forward_steps, done.reverse_steps = 300, 100
    done.forward_s = revolve
    tuner.learn_residual(done, None)
    assert tuner.residual[False] == pytest.approx(0.0, abs=1e-12)
    assert tuner.price(4, 0) == pytest.approx(revolve)
    # each later run weighs as much as all before it
    stats.forward_s = multistage
    tuner.learn_residual(stats, None)
    assert tuner.residual[True] == pytest.approx(RUN_DECAY * 2e-4)


def test_what_a_transfer_bound_plan_missed_is_charged_to_its_transfers() -> None:
    """Once a plan without Level-2 has priced what a step misses, the rest of what plans with
    Level-2 missed is charged per transfer: charged per step, interval 2's unexplained seconds
    (Devito 3D at 4% of the states) priced intervals writing a tenth as many states as dear per
    step, above Revolve, and "auto" ran interval 2 again where interval 8 was 15% faster."""
    tuner = IntervalTuner(400, 4, 2, inline=False, taping=True, tw=1e-4, tr=1e-4, tc=1e-4,
                          tf=1e-3, tb=2e-3, runs=1, tx=1e-4)
    revolve, short, long = tuner.price(4, 0), tuner.price(4, 2), tuner.price(4, 40)
    ran_revolve = Stats(n_timesteps=400, l1_slots=4, interval=0)
    ran_revolve.forward_steps, ran_revolve.forward_s = 1000, revolve
    tuner.learn_residual(ran_revolve, None)
    ran_short = Stats(n_timesteps=400, l1_slots=4, interval=2)
    ran_short.forward_steps, ran_short.l2_writes, ran_short.l2_reads = 800, 199, 199
    ran_short.forward_s = short + 0.4  # 1 ms a transfer beyond the price
    tuner.learn_residual(ran_short, None)
    assert tuner.missed.per_transfer(0.0) == pytest.approx(0.4 / 398)
    assert tuner.price(4, 0) == pytest.approx(revolve)
    assert tuner.price(4, 2) == pytest.approx(short + 0.4, rel=0.01)
    # interval 40 moves 20 states each way: 20 ms more, where 0.5 ms a step would be 0.4 s
    assert tuner.price(4, 40) == pytest.approx(long + 0.4 * 20 / 199, rel=0.01)
    # before any run without Level-2, what a plan with it missed is charged to its transfers,
    # and Revolve borrows it per step
    first = IntervalTuner(400, 4, 2, inline=False, taping=True, tw=1e-4, tr=1e-4, tc=1e-4,
                          tf=1e-3, tb=2e-3, runs=1, tx=1e-4)
    first.learn_residual(ran_short, None)
    assert first.residual == {False: None, True: pytest.approx(0.4 / 800)}
    assert first.price(4, 40) == pytest.approx(long + 0.4 * 20 / 199, rel=0.01)
    assert first.price(4, 0) > revolve + 0.4
    # a plan with Level-2 that ran faster than a step's share says prices its kind per step
    faster = IntervalTuner(400, 4, 2, inline=False, taping=True, tw=1e-4, tr=1e-4, tc=1e-4,
                           tf=1e-3, tb=2e-3, runs=1, tx=1e-4)
    faster.learn_residual(ran_revolve, None)
    ran_revolve.forward_s = revolve + 0.5  # 0.5 ms a step beyond its price
    faster.learn_residual(ran_revolve, None)
    ran_long = Stats(n_timesteps=400, l1_slots=4, interval=40)
    ran_long.forward_steps, ran_long.l2_writes, ran_long.l2_reads = 800, 10, 10
    ran_long.forward_s = long + 0.1  # 0.125 ms a step beyond the price
    faster.learn_residual(ran_long, None)
    assert faster.missed.per_transfer(faster.residual[False]) < 0
    assert faster.misses.of(True, True) == (pytest.approx(0.1 / 800), 0.0)
    assert faster.price(4, 2) > short


def test_a_light_plans_run_under_its_price_does_not_cancel_what_a_heavy_plan_taught() -> None:
    """Runs moving different numbers of states are fitted with a line: what each run missed is
    what the next plan of its size is priced with. Pooled into one ratio, interval 2's run
    1.2 times its price was cancelled by interval 21's 0.93 times its own, and "auto" went
    back and forth between the two (Devito 3D, 63x75x59 at 3% of the states)."""
    tuner = IntervalTuner(400, 4, 2, inline=False, taping=True, tw=1e-4, tr=1e-4, tc=1e-4,
                          tf=1e-3, tb=2e-3, runs=1, tx=1e-4)
    revolve, heavy, light = tuner.price(4, 0), tuner.price(4, 2), tuner.price(4, 40)
    for interval, transfers, price, missed in ((0, 0, revolve, 0.0), (2, 199, heavy, 0.8),
                                               (40, 10, light, -0.3)):
        ran = Stats(n_timesteps=400, l1_slots=4, interval=interval)
        ran.forward_steps, ran.l2_writes, ran.l2_reads = 800, transfers, transfers
        ran.forward_s = price + missed
        tuner.learn_residual(ran, None)
    assert tuner.price(4, 2) == pytest.approx(heavy + 0.8, abs=0.02)
    assert tuner.price(4, 40) == pytest.approx(light - 0.3, abs=0.02)
    assert tuner.price(4, 0) == pytest.approx(revolve)
    # (within the few transfers the model counts beyond the runs' 2 x 199 and 2 x 10)
    # runs that moved about as many states tell no line apart from their noise: one ratio
    close = IntervalTuner(400, 4, 2, inline=False, taping=True, tw=1e-4, tr=1e-4, tc=1e-4,
                          tf=1e-3, tb=2e-3, runs=1, tx=1e-4)
    priced = close.price(4, 2)
    for transfers, missed in ((199, 0.4), (180, 0.2)):
        ran = Stats(n_timesteps=400, l1_slots=4, interval=2)
        ran.forward_steps, ran.l2_writes, ran.l2_reads = 800, transfers, transfers
        ran.forward_s = priced + missed
        close.learn_residual(ran, None)
    assert close.missed.fit(0.0) == (0.0, pytest.approx((RUN_DECAY * 0.4 + 0.2)
                                                        / (RUN_DECAY * 398 + 360)))


def test_the_next_checkpointer_starts_from_the_residual_the_last_one_learned() -> None:
    """Devito builds a checkpointer per gradient: what the model missed must reach the next one
    (before it did not, and every gradient ran 1.2 times its prediction)."""
    memory = CostMemory()
    def fresh() -> IntervalTuner:
        return IntervalTuner(100, 4, 2, inline=False, taping=True, tw=1e-3, tr=1e-3, tc=1e-4,
                             tf=1e-3)
    learned = fresh()
    learned.residual = {False: 2e-4, True: None}
    learned.missed = Missed(0.5, 800, 398)
    memory.keep(("key",), learned)
    assert memory.recall(("key",), fresh()).residual == {False: 2e-4, True: None}
    assert memory.recall(("key",), fresh()).missed == Missed(0.5, 800, 398)
    assert memory.recall(("other",), fresh()).residual == {False: None, True: None}


def _run(interval: int, seconds: float, *, over: float | None, probed: bool = False) -> Completed:
    """A completed run of interval ``interval`` (0: Revolve) that took ``seconds``, ``over``
    times its prediction."""
    stats = Stats(n_timesteps=400, l1_slots=4, interval=interval)
    stats.forward_steps, stats.reverse_steps = 800, 400
    stats.l2_writes = stats.l2_reads = 0 if interval == 0 else 400 // interval
    stats.forward_s = seconds
    stats.probe_steps = 10 if probed else 0
    fit = CallFit()
    fit.add(10, 10e-3)
    return Completed(stats, fit, over, priced=True)


def _fresh_tuner(n: int = 400) -> IntervalTuner:
    return IntervalTuner(n, 4, 2, inline=False, taping=True, tw=1e-4, tr=1e-4, tc=1e-4,
                         tf=1e-3, tb=2e-3, runs=1, tx=1e-4)


def test_one_run_far_beyond_its_prediction_moves_no_price_until_another_confirms_it() -> None:
    """A plan priced too dear is not run again to correct it: one run slowed by the shared
    machine (interval 6 at 1.49 times its price) priced every plan with Level-2 above Revolve
    for the rest of the gradients (Devito 3D, 79x57x67 at 1% of the states)."""
    tuner = _fresh_tuner()
    short, revolve = tuner.price(4, 2), tuner.price(4, 0)
    slow = _run(2, short * 1.5, over=1.5)
    assert slow.doubtful and not _run(2, short, over=DOUBT).doubtful
    assert tuner.take(slow) is False
    assert (tuner.price(4, 2), tuner.price(4, 0), tuner.runs) == (short, revolve, 1)
    # a run at its price next: the slow one is dropped, the next learned alone
    again = _fresh_tuner()
    again.take(_run(2, short, over=1.0))
    assert tuner.take(_run(2, short, over=1.0)) is True and tuner.doubted is None
    assert tuner.runs == 2 and tuner.price(4, 2) == pytest.approx(again.price(4, 2))
    # two in a row: both learned, in their order, as without the doubt
    confirmed, direct = _fresh_tuner(), _fresh_tuner()
    second = _run(2, short * 1.4, over=1.4)
    assert confirmed.take(slow) is False and confirmed.take(second) is True
    for run in (slow, second):
        direct.learn(run.stats, run.fit)
        direct.learn_residual(run.stats, None)
    assert confirmed.runs == direct.runs == 3
    assert confirmed.price(4, 2) == pytest.approx(direct.price(4, 2))
    assert confirmed.price(4, 2) > short * 1.3
    # a run that probed was priced from the probes: never doubted
    assert not _run(2, short * 2, over=2.0, probed=True).doubtful


def test_the_next_checkpointer_holds_the_run_the_last_one_doubted() -> None:
    """Devito builds a checkpointer per gradient: a doubted run waits for the next one's, and
    is priced at its own n where that one's differs (interval 53 of a run of 60 once went to a
    checkpointer of n = 24, whose model refused it)."""
    memory = CostMemory()
    tuner = _fresh_tuner()
    tuner.take(_run(200, 3.0, over=1.6))
    memory.keep(("key",), tuner)
    recalled = memory.recall(("key",), _fresh_tuner(n=100))
    assert recalled.doubted is not None and recalled.doubted.stats.forward_s == 3.0
    assert recalled.take(_run(2, 3.0, over=1.6)) is True and recalled.runs == 3
    assert recalled.n_steps == 100
