"""The taping-free reverse: optimal by exhaustive search, valid under its own precondition, and
bit-identical at run time with the live state proven to be u_t at every reverse call."""
from __future__ import annotations

import functools
import heapq
import math
from pathlib import Path

import pytest

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from asyncckpt import AsyncCheckpointer
from asyncckpt.compat import Revolver, taping_from_environment
from schedules import (
    Advance,
    AsyncMultistage,
    Chen,
    EndForward,
    EndReverse,
    Free,
    Load,
    Reverse,
    Revolve,
    ScheduleError,
    Store,
    Tier,
    simulate,
)
from schedules.model import Costs, choose_interval, predict_async_multistage, simulate_times
from schedules.revolve import checkpoints_taken, optimal_forward_steps, untaped_forward_steps
from workloads import Forward, Leapfrog, forward_reverse, store_all_reference
from workloads import Reverse as ReverseOperator

SHM = Path("/dev/shm")


def exhaustive_minimum(n: int, slots: int, taping: bool) -> int:
    """The fewest forward steps of any action sequence that runs the forward sweep to u_n and
    then reverses steps n-1..0 under the protocol, by Dijkstra over every reachable state
    (live state, stored set, next reverse step, whether the live state was just advanced)."""
    start = (0, frozenset({0}), None, False)  # next reverse None: the forward sweep goes on
    best = {start: 0}
    queue = [(0, 0, start)]
    tie = 0
    while queue:
        cost, _, state = heapq.heappop(queue)
        if cost > best[state]:
            continue
        live, stored, due, advanced = state
        if due == -1:
            return cost
        moves = []
        if live is not None and live < n:
            reached = live + 1
            moves.append((1, (reached, stored, n - 1 if due is None and reached == n else due,
                              True)))
        if live is not None and live not in stored and len(stored) < slots:
            moves.append((0, (live, stored | {live}, due, advanced)))
        for step in stored:
            moves.append((0, (step, stored, due, False)))
            moves.append((0, (live, stored - {step}, due, advanced)))
        if due is not None and due >= 0:
            ready = (advanced and live == due + 1) if taping else live == due
            if ready:
                moves.append((0, (None, stored, due - 1, False)))
        for extra, following in moves:
            if cost + extra < best.get(following, math.inf):
                best[following] = cost + extra
                tie += 1
                heapq.heappush(queue, (cost + extra, tie, following))
    raise AssertionError("no schedule reverses every step")


@pytest.mark.parametrize("slots", [1, 2, 3])
@pytest.mark.parametrize("n", range(1, 8))
def test_taping_free_revolve_is_optimal_by_exhaustive_search(n: int, slots: int) -> None:
    minimum = exhaustive_minimum(n, slots, taping=False)
    assert untaped_forward_steps(n, slots) == minimum
    result = simulate(Revolve(n, slots, taping=False))
    assert result.forward_steps == minimum and result.l1_peak <= slots


@pytest.mark.parametrize(("n", "slots"), [(1, 1), (4, 2), (7, 3), (6, 1)])
def test_the_search_finds_revolve_under_taping(n: int, slots: int) -> None:
    # the same search, with the taping precondition, reproduces Revolve: the search is sound
    assert exhaustive_minimum(n, slots, taping=True) == optimal_forward_steps(n, slots)


@functools.lru_cache(maxsize=None)
def untaped_range(m: int, c: int) -> int:
    """Fewest steps to reverse m steps from a stored start under the taping-free protocol, by
    search over the first split (the start's reverse needs no step)."""
    if m == 1:
        return 0
    if c == 1:
        return m * (m - 1) // 2
    return min(k + (0 if m - k == 1 else untaped_range(m - k, c - 1)) + untaped_range(k, c)
               for k in range(1, m))


def test_closed_form_is_revolve_shifted_by_one_step() -> None:
    for n in range(1, 70):
        for s in range(1, 7):
            # the forward sweep to u_n is the reversal of one step more, whose reverse is free
            assert untaped_forward_steps(n, s) == untaped_range(n + 1, s), (n, s)
            assert simulate(Revolve(n, s, taping=False)).forward_steps == untaped_range(n + 1, s)


@settings(max_examples=150, deadline=None)
@given(data=st.data())
def test_async_multistage_taping_free_is_valid_and_optimal_per_interval(data) -> None:
    n = data.draw(st.integers(1, 2000), label="n")
    interval = data.draw(st.integers(1, n), label="interval")
    slots = data.draw(st.integers(1, 12), label="l1_slots")
    result = simulate(AsyncMultistage(n, interval, slots, taping=False))
    count = math.ceil(n / interval)
    last = n - (count - 1) * interval
    # the forward sweep, each inner interval reversed optimally, the last with its forward part
    expected = ((count - 1) * interval + (count - 1) * untaped_range(interval, slots + 1)
                + untaped_forward_steps(last, slots + 1)) if interval <= 60 and last <= 60 else None
    if expected is not None:
        assert result.forward_steps == expected
    assert result.forward_steps <= simulate(AsyncMultistage(n, interval, slots)).forward_steps
    assert result.l1_peak <= slots and result.l2_writes == result.l2_reads == count


def test_interval_one_needs_no_recomputation() -> None:
    result = simulate(AsyncMultistage(500, 1, 1, taping=False))
    assert result.forward_steps == 500 and result.recompute_factor == 0.0


@pytest.mark.parametrize("schedule", [Revolve(30, 3), AsyncMultistage(30, 4, 2), Chen(30)])
def test_simulate_refuses_a_taping_schedule_under_the_taping_free_precondition(schedule) -> None:
    with pytest.raises(ScheduleError, match="taping-free reverse step needs the live state"):
        simulate(schedule, taping=False)


@pytest.mark.parametrize("schedule", [Revolve(30, 3, taping=False),
                                      AsyncMultistage(30, 4, 2, taping=False),
                                      Chen(30, taping=False)])
def test_simulate_refuses_a_taping_free_schedule_under_taping(schedule) -> None:
    simulate(schedule)  # valid under its own protocol
    with pytest.raises(ScheduleError, match="does not directly follow its taping step"):
        simulate(schedule, taping=True)


def test_reverse_after_reaching_t_plus_one_is_rejected_taping_free() -> None:
    actions = [Store(0, Tier.L1), Advance(0, 2), EndForward(), Reverse(1)]
    with pytest.raises(ScheduleError, match="needs the live state u_1, it is u_2"):
        simulate(actions, taping=False)
    good = [Store(0, Tier.L1), Advance(0, 2), EndForward(), Load(0, Tier.L1), Advance(0, 1),
            Reverse(1), Load(0, Tier.L1), Reverse(0), Free(0, Tier.L1), EndReverse()]
    assert simulate(good, taping=False).forward_steps == 3


@settings(max_examples=60, deadline=None)
@given(n=st.integers(1, 300), interval=st.integers(1, 300), slots=st.integers(1, 8),
       taping=st.booleans(), tc=st.sampled_from([0.0, 0.2]), tcall=st.sampled_from([0.0, 0.7]),
       slack=st.sampled_from([0, 1]))
def test_model_prices_the_protocol_exactly(n, interval, slots, taping, tc, tcall, slack) -> None:
    interval = min(interval, n)
    costs = Costs(tf=1.0, tb=2.5, tc=tc, tcall=tcall, slack=slack)
    closed = predict_async_multistage(n, interval, slots, costs, taping=taping)
    event = simulate_times(AsyncMultistage(n, interval, slots, taping=taping), costs)
    assert closed.total_s == pytest.approx(event.total_s, rel=1e-9)


@pytest.mark.parametrize("taping", [True, False])
def test_a_per_call_cost_hides_writes_in_shorter_intervals(taping: bool) -> None:
    # a write takes 4 steps: a call that costs more than its steps hides it in fewer of them
    chosen = [choose_interval(2000, 10, Costs(tf=1.0, tb=2.0, tw=4.0, tr=0.5, tcall=tcall),
                              taping=taping).interval for tcall in (0.0, 1.0, 2.5)]
    assert chosen[0] == 4 and chosen == sorted(chosen, reverse=True) and chosen[2] < 4


@pytest.mark.parametrize("n", [1, 10, 10**3, 10**6])
def test_no_deep_recursion_for_any_slots(n: int) -> None:
    for slots in (1, 2, 100, 1000, n - 1, n, n + 5):
        if slots >= 1:
            assert checkpoints_taken(n, slots) >= 0
    if n <= 10**3:
        for slots in (1, n - 1, n, 2 * n):
            if slots >= 1:
                simulate(Revolve(n, slots, taping=False))
                simulate(Revolve(n, slots))


# -- at run time ---------------------------------------------------------------------------------

class Witness:
    """The reverse operator of a Leapfrog, checking at every call that the live state is u_t
    (taping-free) or u_{t+1} (taping), byte for byte against a plain forward run's states."""

    def __init__(self, model: Leapfrog, states: list[bytes], taping: bool) -> None:
        self.model, self.states, self.taping = model, states, taping
        self.checked = 0

    def apply(self, *, t_start: int, t_end: int) -> None:
        t = t_start
        assert t_end == t + 1
        want = t + 1 if self.taping else t
        live = b"".join(a.tobytes() for a in self.model.get_data(want))
        assert live == self.states[want], f"reverse of step {t}: the live state is not u_{want}"
        self.model.trace.calls.append(("rev", t))
        self.model.adjoint(t)
        self.checked += 1


def forward_states(model: Leapfrog) -> list[bytes]:
    model.reset()
    states = [b"".join(a.tobytes() for a in model.get_data(0))]
    for t in range(model.n):
        model.step(t)
        states.append(b"".join(a.tobytes() for a in model.get_data(t + 1)))
    return states


def _storage(kind: str, root: Path):
    if kind == "tmpfs" and SHM.is_dir():
        return SHM
    return root if kind in ("disk", "tmpfs") else None


@settings(max_examples=40, deadline=None,
          suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(data=st.data())
def test_taping_free_runs_are_bit_identical_and_the_live_state_is_u_t(data, tmp_path) -> None:
    n = data.draw(st.integers(1, 70), label="n")
    interval = data.draw(st.one_of(st.integers(1, n), st.just("auto")), label="interval")
    slots = data.draw(st.integers(1, 80), label="l1_slots")
    kind = data.draw(st.sampled_from(["dram", "tmpfs", "disk"]), label="storage")
    model = Leapfrog(n)
    reference = store_all_reference(model)
    states = forward_states(model)
    witness = Witness(model, states, taping=False)
    with AsyncCheckpointer(model, Forward(model), witness, n, l1_slots=slots, interval=interval,
                           storage=_storage(kind, tmp_path), taping=False) as ckp:
        for _ in range(2):
            for got, want in zip(forward_reverse(model, ckp), reference):
                assert got.tobytes() == want.tobytes()
            # each step reversed once, in order; the witness saw u_t live at every one of them
            calls = model.trace.calls
            assert [c[1] for c in calls if c[0] == "rev"] == list(range(n - 1, -1, -1))
            counts = simulate(ckp.schedule)
            assert ckp.stats.forward_steps == counts.forward_steps + ckp.stats.probe_steps
            if slots >= n:  # every state fits in Level-1: no Level-2 traffic
                assert ckp.stats.l2_writes == ckp.stats.l2_reads == 0
    assert witness.checked == 2 * n


def test_compat_takes_taping_from_the_environment(monkeypatch) -> None:
    model = Leapfrog(30)
    reference = store_all_reference(model)
    states = forward_states(model)
    monkeypatch.setenv("ASYNCCKPT_TAPING", "0")
    assert taping_from_environment() is False
    witness = Witness(model, states, taping=False)
    with Revolver(model, Forward(model), witness, 3, 30) as revolver:
        model.reset()
        revolver.apply_forward()
        model.reset_adjoint()
        revolver.apply_reverse()
        assert revolver.stats.taping is False
    assert witness.checked == 30
    for got, want in zip(model.gradients(), reference):
        assert got.tobytes() == want.tobytes()


@pytest.mark.parametrize("value", ["2", "maybe", "Fals"])
def test_a_bad_taping_variable_names_itself(monkeypatch, value: str) -> None:
    monkeypatch.setenv("ASYNCCKPT_TAPING", value)
    with pytest.raises(ValueError, match=f"ASYNCCKPT_TAPING must be 1 or 0.*got '{value}'"):
        taping_from_environment()


def test_taping_must_be_a_bool() -> None:
    model = Leapfrog(5)
    with pytest.raises(TypeError, match=r"taping must be True, False or None \(decide\), got 0"):
        AsyncCheckpointer(model, Forward(model), Forward(model), 5, l1_slots=2, taping=0)


def test_a_taping_free_checkpointer_starts_from_what_taping_runs_measured() -> None:
    # the same operators: a reverse call costs the same under either protocol, so the first
    # taping-free run is neither probed nor priced with a guessed reverse step
    n = 40
    model = Leapfrog(n)
    reference = store_all_reference(model)
    # Level-2 in DRAM, as it is named: l1_slots alone sends it to a directory, whose overlap
    # with every call leaves no quiet call to measure a reverse step on
    with AsyncCheckpointer(model, Forward(model), ReverseOperator(model), n, l1_slots=3,
                           taping=True, storage="dram") as taping:
        forward_reverse(model, taping)
        learned = taping.stats.calibration
    assert taping.stats.probe_steps > 0 and learned["tb_measured"] is False
    with AsyncCheckpointer(model, Forward(model), ReverseOperator(model), n, l1_slots=3,
                           taping=False, storage="dram") as free:
        for got, want in zip(forward_reverse(model, free), reference):
            assert got.tobytes() == want.tobytes()
        calibration = free.stats.calibration
    assert free.stats.probe_steps == 0
    assert calibration["tb_measured"] is True and calibration["learned_runs"] == 1
    assert calibration["taping"] is False
    # each protocol then keeps its own costs: taping interleaves forward and reverse calls, and
    # its steps cost more than taping-free ones (Devito 3D)
    with AsyncCheckpointer(model, Forward(model), ReverseOperator(model), n, l1_slots=3,
                           taping=True, storage="dram") as again:
        forward_reverse(model, again)
    assert again.stats.calibration["learned_runs"] == 1 and again.stats.probe_steps == 0


# -- the protocol decided from the reverse operator (taping=None, the default) ---------------

class Declaring(Witness):
    """A Leapfrog's reverse operator that declares whether it needs the taping step."""

    def __init__(self, model: Leapfrog, states: list[bytes], declared: object) -> None:
        super().__init__(model, states, taping=declared is not False)
        self.needs_taping = declared


@pytest.mark.parametrize("declared", [False, True])
@pytest.mark.parametrize("driver", ["checkpointer", "compat"])
def test_the_reverse_operators_declaration_decides_the_protocol(declared, driver, monkeypatch):
    monkeypatch.delenv("ASYNCCKPT_TAPING", raising=False)
    n = 30
    model = Leapfrog(n)
    reference = store_all_reference(model)
    witness = Declaring(model, forward_states(model), declared)
    if driver == "compat":  # read through the Revolver's wrappers
        run = Revolver(model, Forward(model), witness, 3, n)
    else:
        run = AsyncCheckpointer(model, Forward(model), witness, n, l1_slots=3, interval=5)
    with run:
        for got, want in zip(forward_reverse(model, run), reference):
            assert got.tobytes() == want.tobytes()
        assert run.stats.taping is declared
        assert run.stats.taping_reason == f"the reverse operator declares needs_taping = {declared}"
    assert witness.checked == n


def test_an_operator_that_declares_nothing_stays_taped(monkeypatch):
    monkeypatch.delenv("ASYNCCKPT_TAPING", raising=False)
    model = Leapfrog(20)
    witness = Witness(model, forward_states(model), taping=True)
    with AsyncCheckpointer(model, Forward(model), witness, 20, l1_slots=3) as ckp:
        forward_reverse(model, ckp)
    assert ckp.stats.taping is True and witness.checked == 20
    assert "declares no needs_taping" in ckp.stats.taping_reason


@pytest.mark.parametrize("forced", ["0", "1"])
def test_the_variable_and_the_argument_overrule_a_declaration(forced, monkeypatch):
    model = Leapfrog(20)
    states = forward_states(model)
    monkeypatch.setenv("ASYNCCKPT_TAPING", forced)
    # the declaration says the opposite of the variable
    witness = Declaring(model, states, declared=forced == "0")
    witness.taping = forced == "1"
    with AsyncCheckpointer(model, Forward(model), witness, 20, l1_slots=3) as ckp:
        forward_reverse(model, ckp)
    assert ckp.stats.taping is (forced == "1")
    assert ckp.stats.taping_reason == f"ASYNCCKPT_TAPING={forced}"
    witness.taping = True
    with AsyncCheckpointer(model, Forward(model), witness, 20, l1_slots=3, taping=True) as ckp:
        forward_reverse(model, ckp)
    assert ckp.stats.taping_reason == "taping=True was given" and witness.checked == 40


def test_a_declaration_that_is_not_a_bool_is_refused(monkeypatch):
    monkeypatch.delenv("ASYNCCKPT_TAPING", raising=False)
    model = Leapfrog(5)
    witness = Declaring(model, [], declared="no")
    with pytest.raises(TypeError, match="Declaring.needs_taping must be True or False, got 'no'"):
        AsyncCheckpointer(model, Forward(model), witness, 5, l1_slots=2)
