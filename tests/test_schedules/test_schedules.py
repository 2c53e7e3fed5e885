"""Schedules: exact Revolve totals, the two-level bounds, the validator and its negative controls."""
from __future__ import annotations

import functools
import math

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from schedules import (
    Advance,
    AsyncMultistage,
    Chen,
    EndForward,
    EndReverse,
    Free,
    Load,
    Prefetch,
    Reverse,
    Revolve,
    ScheduleError,
    Store,
    Tier,
    simulate,
    two_level_forward_steps,
)
from schedules.revolve import _split as revolve_split
from schedules.revolve import (checkpoints_taken, optimal_forward_steps, optimal_recomputations,
                               repetition_number, reverse_range)

# Exact totals F, agreed by the closed form, pyrevolve 2.2.8 and checkpoint_schedules 1.0.4.
REFERENCE_TOTALS = [
    (10, 2, 30),
    (20, 3, 65),
    (100, 5, 416),
    (100, 10, 322),
    (1000, 10, 4636),
    (1000, 50, 2948),
    (10000, 10, 67624),
    (10000, 100, 34747),
    (100000, 10, 932040),
    (100000, 100, 394747),
]


@functools.lru_cache(maxsize=None)
def dynamic_program_total(n: int, s: int) -> int:
    """The minimal total by exhaustive search over the first split: the definition of optimal."""
    if n == 1:
        return 1
    if s == 1:
        return n * (n + 1) // 2
    return min(m + dynamic_program_total(n - m, s - 1) + dynamic_program_total(m, s)
               for m in range(1, n))


@pytest.mark.parametrize(("n", "s", "total"), REFERENCE_TOTALS)
def test_closed_form_matches_reference_table(n: int, s: int, total: int) -> None:
    assert optimal_forward_steps(n, s) == total


@pytest.mark.parametrize(("n", "s", "total"), REFERENCE_TOTALS)
def test_revolve_schedule_reaches_reference_total(n: int, s: int, total: int) -> None:
    result = simulate(Revolve(n, s))
    assert result.forward_steps == total
    assert result.reverse_steps == n
    assert result.l1_peak <= s


def test_closed_form_equals_dynamic_program_and_schedule() -> None:
    for n in range(1, 90):
        for s in range(1, 9):
            expected = dynamic_program_total(n, s)
            assert optimal_forward_steps(n, s) == expected, (n, s)
            assert simulate(Revolve(n, s)).forward_steps == expected, (n, s)


@settings(max_examples=150, deadline=None)
@given(n=st.integers(1, 5000), s=st.integers(1, 60))
def test_revolve_is_valid_and_optimal(n: int, s: int) -> None:
    result = simulate(Revolve(n, s))
    assert result.forward_steps == optimal_forward_steps(n, s)
    assert result.l1_peak <= s
    assert result.l2_writes == result.l2_reads == 0


@settings(max_examples=150, deadline=None)
@given(n=st.integers(1, 600), s=st.integers(1, 650), taping=st.booleans())
def test_revolve_knows_its_peak_without_running(n: int, s: int, taping: bool) -> None:
    # what the checkpointer faults in before the sweep: never a slot the run leaves untouched
    schedule = Revolve(n, s, taping=taping)
    assert schedule.l1_peak == simulate(schedule).l1_peak


@settings(max_examples=150, deadline=None)
@given(n=st.integers(1, 300), data=st.data(), s=st.integers(1, 320), taping=st.booleans())
def test_async_multistage_knows_its_peak_without_running(n: int, data: st.DataObject, s: int,
                                                         taping: bool) -> None:
    interval = data.draw(st.integers(1, n))
    schedule = AsyncMultistage(n, interval, s, taping=taping)
    assert schedule.l1_peak == simulate(schedule).l1_peak


@pytest.mark.parametrize(("n", "s"), [(1, 1), (1, 5), (2, 1), (7, 7), (7, 100), (50, 49)])
def test_revolve_edge_cases(n: int, s: int) -> None:
    result = simulate(Revolve(n, s))
    assert result.forward_steps == optimal_forward_steps(n, s)
    if s >= n:
        assert result.forward_steps == 2 * n - 1


@pytest.mark.slow
@pytest.mark.timeout(300)
def test_revolve_million_steps() -> None:
    assert simulate(Revolve(10**6, 100)).forward_steps == optimal_forward_steps(10**6, 100)


@settings(max_examples=200, deadline=None)
@given(data=st.data())
def test_async_multistage_within_bounds(data: st.DataObject) -> None:
    n = data.draw(st.integers(1, 3000), label="n")
    interval = data.draw(st.integers(1, n), label="interval")
    l1_slots = data.draw(st.integers(1, 20), label="l1_slots")
    result = simulate(AsyncMultistage(n, interval, l1_slots))
    assert 2 * n - 1 <= result.forward_steps <= two_level_forward_steps(n, interval, l1_slots)
    assert result.l1_peak <= l1_slots
    assert result.prefetch_peak <= AsyncMultistage.prefetch_slots
    intervals = math.ceil(n / interval)
    last_reloads = n - (intervals - 1) * interval > 1
    assert result.l2_writes == result.l2_reads == intervals - 1 + last_reloads


def test_async_multistage_beats_two_level_by_the_last_interval() -> None:
    # The forward sweep's last interval is reversed without replaying it: I steps saved.
    n, interval, slots = 1000, 10, 10
    result = simulate(AsyncMultistage(n, interval, slots))
    assert result.forward_steps == two_level_forward_steps(n, interval, slots) - interval


@pytest.mark.parametrize(("interval", "ratio"), [(10, 2.90), (100, 4.09), (1000, 5.55)])
def test_two_level_ratio_is_independent_of_n(interval: int, ratio: float) -> None:
    for n in (interval * 10, interval * 100):
        assert two_level_forward_steps(n, interval, 10) / n == pytest.approx(ratio, abs=0.005)


@settings(max_examples=100, deadline=None)
@given(n=st.integers(1, 3000))
def test_chen_is_valid(n: int) -> None:
    schedule = Chen(n)
    result = simulate(schedule)
    assert result.l1_peak <= schedule.l1_slots <= 2 * math.isqrt(n) + 3
    # one extra forward sweep, less the last segment that the forward sweep already replays
    assert result.forward_steps <= 3 * n


@pytest.mark.parametrize(
    ("make", "message"),
    [
        (lambda: Revolve(0, 1), "n_steps must be >= 1, got 0"),
        (lambda: Revolve(5, 0), "snaps must be >= 1, got 0"),
        (lambda: AsyncMultistage(10, 0, 2), r"interval must be an int in \[1, 10\], got 0"),
        (lambda: AsyncMultistage(10, 11, 2), r"interval must be an int in \[1, 10\], got 11"),
        (lambda: AsyncMultistage(10, 2, 0), "l1_slots must be >= 1, got 0"),
        (lambda: Chen(-3), "n_steps must be >= 1, got -3"),
    ],
)
def test_bad_values_raise_value_error(make, message: str) -> None:
    with pytest.raises(ValueError, match=message):
        make()


@pytest.mark.parametrize("bad", [2.5, "10", None, True])
def test_non_integers_raise_type_error(bad: object) -> None:
    with pytest.raises(TypeError, match="n_steps must be an int"):
        Revolve(bad, 3)  # type: ignore[arg-type]


def _schedules_to_mutate() -> list[list[object]]:
    return [list(Revolve(23, 3)), list(AsyncMultistage(23, 5, 2)), list(Chen(23))]


def test_every_single_removal_is_rejected() -> None:
    for actions in _schedules_to_mutate():
        for i in range(len(actions)):
            mutated = actions[:i] + actions[i + 1:]
            with pytest.raises(ScheduleError):
                simulate(mutated, n_steps=23)


def _commute(first: object, second: object) -> bool:
    """Pairs whose order does not matter: a free or a prefetch is bookkeeping that commutes with
    any action on another stored state (a reverse step touches none), except a store, which may
    need the freed slot."""
    kinds = {type(first), type(second)}
    if not kinds & {Free, Prefetch} or Store in kinds:
        return False
    if Reverse in kinds:
        return True
    steps = {getattr(first, "step", None), getattr(second, "step", None)}
    return len(steps) == 2


def test_every_adjacent_swap_of_non_commuting_actions_is_rejected() -> None:
    swaps = 0
    for actions in _schedules_to_mutate():
        for i in range(len(actions) - 1):
            if actions[i] == actions[i + 1] or _commute(actions[i], actions[i + 1]):
                continue
            mutated = actions[:i] + [actions[i + 1], actions[i]] + actions[i + 2:]
            with pytest.raises(ScheduleError):
                simulate(mutated, n_steps=23)
            swaps += 1
    assert swaps > 100


@pytest.mark.parametrize(
    ("actions", "message"),
    [
        ([Load(0, Tier.L1)], "loads u_0, which is not in Level-1"),
        ([Store(0, Tier.L2), Load(0, Tier.L2)], "without a prefetch"),
        ([Advance(0, 2), EndForward(), Reverse(0)], "expected the reverse of step 1"),
        ([Store(0, Tier.L1), Advance(0, 2), EndForward(), Reverse(1), Load(0, Tier.L1), Reverse(0)],
         "does not directly follow its taping step"),
        ([Store(0, Tier.L2), Prefetch(0), Advance(0, 1), EndForward(), Reverse(0), Free(0, Tier.L2)],
         "never waited for"),
        ([Store(0, Tier.L1), Advance(0, 1), EndForward(), Reverse(0), EndReverse()],
         "left stored"),
        ([Store(0, Tier.L1), Advance(0, 1), Store(1, Tier.L1)], "exceeds l1_slots=1"),
        ([Advance(0, 1), EndForward(), Reverse(0)], "without EndReverse"),
        ([Advance(0, 1), "advance"], "is not a schedule action"),
    ],
)
def test_validator_names_the_broken_invariant(actions: list[object], message: str) -> None:
    with pytest.raises(ScheduleError, match=message):
        simulate(actions, l1_slots=1)


def test_validator_counts_a_hand_written_schedule() -> None:
    actions = [Store(0, Tier.L1), Advance(0, 2), EndForward(), Reverse(1),
               Load(0, Tier.L1), Advance(0, 1), Reverse(0), Free(0, Tier.L1), EndReverse()]
    result = simulate(actions)
    assert (result.n_steps, result.forward_steps, result.reverse_steps, result.l1_peak) == (2, 3, 2, 1)


def test_actions_are_immutable_keyword_values() -> None:
    action = Advance(start=3, end=7)
    assert action == Advance(3, 7) and hash(action) == hash(Advance(3, 7))
    assert repr(action) == "Advance(start=3, end=7)"
    with pytest.raises(AttributeError):
        action.start = 4  # type: ignore[misc]


@pytest.mark.parametrize("schedule", [Revolve(50, 4), AsyncMultistage(50, 7, 3), Chen(50, 9)])
def test_schedules_round_trip_through_json(schedule) -> None:
    import json

    from schedules import from_config

    rebuilt = from_config(json.loads(json.dumps(schedule.get_config())))
    assert repr(rebuilt) == repr(schedule)
    assert list(rebuilt) == list(schedule)
    assert eval(repr(schedule)).get_config() == schedule.get_config()  # noqa: S307


def test_from_config_names_the_accepted_schedules() -> None:
    from schedules import from_config

    with pytest.raises(ValueError, match="'Griewank' is not a schedule; expected one of "
                                         "AsyncMultistage, Chen, HRevolve, Revolve"):
        from_config({"name": "Griewank", "n_steps": 3})


def _stores_by_walking(n: int, s: int) -> int:
    """The Level-1 stores of Revolve(n, s)'s reverse sweep, counted on its actions."""
    stored = {0: Tier.L1}
    return sum(1 for action in reverse_range(0, n, s, stored, None) if isinstance(action, Store))


def _repetitions_by_counting(n: int, s: int) -> int:
    reps, beta = 0, 1
    while beta < n:
        reps += 1
        beta = beta * (s + reps) // reps
    return reps


@settings(max_examples=300, deadline=None)
@given(n=st.integers(1, 3000), s=st.integers(1, 40))
def test_counts_without_a_schedule_equal_the_schedules_own(n: int, s: int) -> None:
    """checkpoints_taken (two slots in closed form, more by a walk of the splits) and the
    repetition number (by bisection over binomials) equal what the actions and the definition
    give."""
    assert checkpoints_taken(n, s) == _stores_by_walking(n, s)
    assert repetition_number(n, s) == _repetitions_by_counting(n, s)


def _stores_by_splits(n: int, s: int) -> int:
    """Revolve's stores by walking its splits (each store one split), without actions."""
    total, pending = 0, [(n, s)]
    while pending:
        steps, slots = pending.pop()
        if slots == 1 or steps <= 2:
            continue
        if steps <= slots + 1:
            total += steps - 2
            continue
        advance = revolve_split(steps, slots)
        total += 1
        pending += [(advance, slots), (steps - advance, slots - 1)]
    return total


@settings(max_examples=200, deadline=None)
@given(n=st.integers(1, 200_000), s=st.sampled_from([3, 4, 5, 7, 10, 30, 100, 1000, 10**5]))
def test_stores_from_binomials_equal_a_walk_of_the_splits(n: int, s: int) -> None:
    assert checkpoints_taken(n, s) == _stores_by_splits(n, s)


def test_counts_of_a_billion_steps_take_milliseconds() -> None:
    """One slot has t = n - 1 and two t ~ sqrt(2n): counting t one by one took 105 s for
    checkpoints_taken(1e9, 2), which "auto" asks for each interval it prices."""
    n = 10**9
    assert repetition_number(n, 1) == n - 1
    assert repetition_number(n, 2) == 44720
    assert checkpoints_taken(n, 2) == 44720
    assert optimal_recomputations(n, 2) == 44720 * n - math.comb(44722, 44720) * 44720 // 3
