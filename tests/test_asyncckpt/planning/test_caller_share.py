"""The runtime's own work on the caller's thread per Level-2 transfer: measured from every
run's wall time less its timed parts, and priced into the plans with Level-2 (pure functions
of the numbers, no operators)."""
from __future__ import annotations

import pytest

from asyncckpt._tuning.caller import runtime_s
from asyncckpt._tuning.choice import EXPLORE
from asyncckpt._tuning.cost_memory import CostMemory
from asyncckpt._tuning.tuner import PRIOR_TRANSFERS, CallFit, IntervalTuner
from asyncckpt.stats import Stats

N = 400
TF, ADJOINT, TC = 1.5e-4, 1.6e-4, 1.2e-5  # the LSTM experiment's step, reverse call, copy


def _lstm_tuner() -> IntervalTuner:
    """The LSTM experiment under memory_budget="4MiB": 32 KiB states written to DRAM."""
    return IntervalTuner(N, 128, 2, inline=False, taping=True, tw=3e-6, tr=1.5e-6, tc=4e-6,
                         tf=TF, runs=1)


def _interval_one(own_per_transfer: float) -> tuple[Stats, CallFit]:
    """A run of interval 1 (one slot) whose caller spent ``own_per_transfer`` seconds of its
    own per transfer beyond the operators' calls and the copies."""
    stats = Stats(n_timesteps=N, l1_slots=1, interval=1)
    stats.forward_steps = stats.forward_calls = 2 * N - 1
    stats.reverse_steps = N
    stats.l2_writes = stats.l2_reads = N - 1
    stats.copies, stats.copy_s = 2 * (N - 1), 2 * (N - 1) * TC
    stats.forward_compute_s = stats.forward_steps * TF
    stats.reverse_compute_s = N * ADJOINT
    transfers = stats.l2_writes + stats.l2_reads
    stats.forward_s = stats.forward_compute_s + stats.copy_s / 2
    stats.reverse_s = (stats.reverse_compute_s + stats.copy_s / 2
                       + transfers * own_per_transfer)
    fit = CallFit()
    for _ in range(stats.forward_calls):
        fit.add(1, TF)
    return stats, fit


def test_the_runtime_s_own_work_per_transfer_brings_revolve_near_enough_to_run() -> None:
    """Interval 1 wrote every 32 KiB state, its caller spending 40 us a transfer in the
    runtime that no cost priced, where Revolve in the budget's 128 slots recomputed 0.68 of a
    sweep in as little time (the LSTM experiment at n = 400)."""
    tuner = _lstm_tuner()
    stats, fit = _interval_one(40e-6)
    assert runtime_s(stats) == pytest.approx(2 * (N - 1) * 40e-6)
    tuner.learn(stats, fit)
    transfers = 2 * (N - 1)
    assert tuner.tq == pytest.approx(transfers * 40e-6 / (PRIOR_TRANSFERS + transfers))
    assert tuner.costs(busy=True).tx >= tuner.tq
    assert tuner.costs().tx == 0.0  # a plan without Level-2 hands nothing over
    # Revolve, priced with the steps and copies of the run beside transfers until it runs, is
    # near enough to run once (EXPLORE); at nothing a transfer, it was priced out for good
    assert tuner.price(128, 0) <= tuner.price(1, 1) * (1 + EXPLORE)
    tuner.tq = None
    assert tuner.price(128, 0) > tuner.price(1, 1) * (1 + EXPLORE)


def test_a_run_without_transfers_measures_the_runtime_s_work_per_call() -> None:
    """What every call costs the runtime, as a run of Revolve in Level-1 alone measured it,
    is not charged to the transfers of the next run with Level-2."""
    tuner = _lstm_tuner()
    revolve = Stats(n_timesteps=N, l1_slots=128, interval=0)
    revolve.forward_steps = revolve.forward_calls = 1000
    revolve.reverse_steps = N
    revolve.forward_compute_s = 1000 * TF
    revolve.reverse_compute_s = N * ADJOINT
    revolve.forward_s = revolve.forward_compute_s + 1400 * 5e-6  # 5 us a call
    revolve.reverse_s = revolve.reverse_compute_s
    fit = CallFit()
    fit.add(1000, 1000 * TF)
    tuner.learn(revolve, fit)
    assert tuner.tq is None
    assert tuner.caller.per_call.value == pytest.approx(5e-6)
    stats, fit = _interval_one(40e-6)
    stats.reverse_s += (stats.forward_calls + N) * 5e-6  # the same 5 us a call
    tuner.learn(stats, fit)
    transfers = 2 * (N - 1)
    assert tuner.tq == pytest.approx(transfers * 40e-6 / (PRIOR_TRANSFERS + transfers))


def test_inline_transfers_hand_nothing_to_a_thread() -> None:
    tuner = IntervalTuner(N, 128, 2, inline=True, taping=True, tw=3e-6, tr=1.5e-6, tc=4e-6)
    stats, fit = _interval_one(40e-6)
    tuner.learn(stats, fit)
    assert tuner.tq is None and tuner.costs(busy=True).tx == 0.0


def test_the_next_checkpointer_starts_from_the_runtime_s_work_the_last_one_measured() -> None:
    """The LSTM experiment builds a checkpointer per pass: the second pass is planned from what
    the first one's transfers cost the caller."""
    memory = CostMemory()
    learned = _lstm_tuner()
    learned.learn(*_interval_one(40e-6))
    memory.keep(("key",), learned)
    assert memory.recall(("key",), _lstm_tuner()).tq == pytest.approx(learned.tq)
    assert memory.recall(("other",), _lstm_tuner()).tq is None
