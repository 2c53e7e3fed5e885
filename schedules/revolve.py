"""Revolve: the optimal single-level binomial checkpointing schedule (Griewank & Walther, 2000).

The schedule is generated from the closed form of Algorithm 799: each split point is computed in
O(repetition number) from binomial coefficients, never by a dynamic program, so generating the
schedule costs O(number of actions).
"""
from __future__ import annotations

import itertools
import math
from collections.abc import Generator, Iterable, Iterator, Mapping

from ._args import check_bool, check_int
from .actions import Action, Advance, EndForward, EndReverse, Free, Load, Reverse, Store, Tier

__all__ = [
    "Revolve",
    "reverse_range",
    "forward_then_reverse",
    "mark_end_forward",
    "checkpoints_taken",
    "repetition_number",
    "optimal_recomputations",
    "optimal_forward_steps",
    "untaped_forward_steps",
    "loads_kept",
]


def repetition_number(n_steps: int, snaps: int) -> int:
    """Return t = min{t : C(snaps + t, snaps) >= n_steps}, the number of times the busiest step runs
    beyond the first in an optimal schedule."""
    n_steps = check_int("n_steps", n_steps, 1)
    snaps = check_int("snaps", snaps, 1)
    return _repetitions(n_steps, snaps)


def _repetitions(steps: int, snaps: int) -> int:
    """:func:`repetition_number` of checked arguments, by doubling t and then bisecting: O(log t)
    binomials, so one slot (t = n - 1) or two (t ~ sqrt(2n)) cost as little as many."""
    if steps <= 1:
        return 0
    low, high = 0, 1  # C(snaps + low, low) < steps <= C(snaps + high, high) once found
    while math.comb(snaps + high, high) < steps:
        low, high = high, 2 * high
    while high - low > 1:
        middle = (low + high) // 2
        if math.comb(snaps + middle, middle) < steps:
            low = middle
        else:
            high = middle
    return high


def optimal_recomputations(n_steps: int, snaps: int) -> int:
    """Return p(n, s) = t n - C(s + t, t - 1): the forward steps an optimal schedule adds to the
    forward sweep's ``n`` (taping steps included)."""
    return _recomputations(check_int("n_steps", n_steps, 1), check_int("snaps", snaps, 1))


def _recomputations(steps: int, snaps: int) -> int:
    """:func:`optimal_recomputations` of checked arguments."""
    reps = _repetitions(steps, snaps)
    if reps == 0:
        return 0
    # C(s + t, t - 1) = C(s + t, s) * t / (s + 1)
    return reps * steps - math.comb(snaps + reps, reps) * reps // (snaps + 1)


def optimal_forward_steps(n_steps: int, snaps: int) -> int:
    """Return the minimal total forward steps F = n + p(n, s) to reverse ``n_steps`` steps with
    ``snaps`` checkpoint slots (the slot holding u_0 included).

    Examples
    --------
    >>> from schedules import optimal_forward_steps
    >>> optimal_forward_steps(1000, 10)
    4636
    """
    return n_steps + optimal_recomputations(n_steps, snaps)


def untaped_forward_steps(n_steps: int, snaps: int) -> int:
    """Return the minimal total forward steps to run the forward sweep and reverse ``n_steps``
    steps with ``snaps`` slots under the taping-free protocol (``Reverse(t)`` reads u_t): p(n + 1, s).

    Reversing m steps from a stored start costs, with taping, m steps more than without (one
    taping step each), under the same recurrence over the first split, so both protocols share
    their optimal splits. The whole run must also reach u_n, which no reverse step reads: it is
    the reversal of n + 1 steps whose last reverse step does nothing, so its total is Revolve's
    for n + 1 steps less their n + 1 taping steps.
    """
    n_steps = check_int("n_steps", n_steps, 1)
    return optimal_recomputations(n_steps + 1, snaps)


def _split(steps: int, snaps: int) -> int:
    """Return how far to advance before the next checkpoint, for ``steps`` steps left and ``snaps``
    slots (the one holding the current start included).

    With t the repetition number and beta(c, t) = C(c + t, t), the minimal total is the convex,
    piecewise-linear W(n, c) = (t + 1) n - C(c + t, t - 1). A split at m costs
    m + W(n - m, c - 1) + W(m, c), which by Pascal's rule equals W(n, c) exactly when the left part
    lies on W's piece t - 1 and the right part on piece t of the one-slot-smaller problem:
    beta(c, t - 2) <= m <= beta(c, t - 1) and beta(c - 1, t - 1) <= n - m <= beta(c - 1, t).
    The largest such m is taken.
    """
    if snaps == 1 or steps <= 2:
        return steps - 1
    reps = _repetitions(steps, snaps)
    beta_prev = math.comb(snaps + reps - 1, reps - 1)  # beta(c, reps - 1)
    fewer_prev = beta_prev * snaps // (snaps + reps - 1)  # beta(c - 1, reps - 1)
    return max(1, min(beta_prev, steps - fewer_prev))


def checkpoints_taken(n_steps: int, snaps: int) -> int:
    """The Level-1 stores :func:`reverse_range` makes to reverse ``n_steps`` steps with ``snaps``
    slots (the start's not counted): exact, from binomials, in O(t log c) of them for
    repetition number t.

    The same for both protocols: dropping the taping steps changes no split. With
    beta(c, t) = C(c + t, t), three facts make it closed: a full binomial, beta(c, t) steps
    with c slots, takes beta(c - 1, t) - 1 stores; a split whose left part is full,
    beta(c, t - 1), leaves a right part of the same repetition number with one slot fewer, so
    a run of such splits sums binomials by the hockey-stick identity (its length found by
    bisection: what is left shrinks faster than the bound for the next one); and a split whose
    left part is not full leaves a full binomial on the right and a lower repetition number on
    the left, the part walked on.
    """
    n, c, total = n_steps, snaps, 0
    while True:
        if c == 1 or n <= 2:
            return total
        if n <= c + 1:
            return total + n - 2  # repetition number 1: every state but the last two stored
        if c == 2:
            return total + _two_slot_stores(n)
        t = _repetitions(n, c)
        full = _full_splits(n, c, t)
        if full:
            total += math.comb(c - 1 + t, t) - math.comb(c - 1 - full + t, t)
            n -= math.comb(c + t, t) - math.comb(c - full + t, t)
            c -= full
            continue  # what is left may have a lower repetition number
        right = math.comb(c - 1 + t - 1, t - 1)  # beta(c - 1, t - 1), a full binomial
        total += 1 + math.comb(c - 2 + t - 1, t - 1) - 1
        n -= right


def _full_splits(n: int, c: int, t: int) -> int:
    """How many splits in a row, from ``n`` steps with ``c`` slots at repetition number ``t``,
    take a full left part beta(c_j, t - 1); at most c - 2 (two slots are left)."""
    whole = math.comb(c + t, t)

    def full(j: int) -> bool:  # the (j + 1)-th split's left part is full
        left = n - (whole - math.comb(c - j + t, t))  # steps left after j full splits
        return left >= math.comb(c - j + t - 1, t - 1) + math.comb(c - j - 1 + t - 1, t - 1)

    if not full(0):
        return 0
    low, high = 0, c - 2  # full(low); the answer is low + 1 if high is not full
    if full(high):
        return high
    while high - low > 1:
        middle = (low + high) // 2
        if full(middle):
            low = middle
        else:
            high = middle
    return high


def _two_slot_stores(steps: int) -> int:
    """:func:`checkpoints_taken` with two slots, in closed form (a walk takes t ~ sqrt(2n)
    splits). With t the repetition number, ``steps`` lies in block t, (C(t + 1, 2), C(t + 2, 2)],
    at offset p >= 1. Each split stores once and advances to ``steps - t`` (to the top of block
    t - 1 from the top of block t), which is at offset min(p, t) of block t - 1; block 1 is
    {2, 3}, whose 3 (offset 2) takes one store more. So t - 1 stores, plus one where p >= 2."""
    if steps <= 2:
        return 0
    reps = _repetitions(steps, 2)
    offset = steps - reps * (reps + 1) // 2
    return reps - 1 + (offset >= 2)


#: Memo of :func:`loads_kept`, cleared when it grows past ``_MEMO_LIMIT`` entries.
_MEMO_LIMIT = 1 << 20
_KEPT: dict[tuple[int, int, int, bool], int] = {}


def loads_kept(n_steps: int, snaps: int, slack: int, taping: bool,
               ends_forward: bool = False) -> int:
    """The loads of :func:`reverse_range` over ``n_steps`` steps with ``snaps`` slots that find
    the live state still holding the state they load, where a forward call of at most
    ``slack`` steps leaves its start state held (a ring of time levels with ``slack`` rows
    beyond a state's: Devito's buffered fields have 1).

    Such a load follows an advance from the range's start straight to the step reversed next
    (the split of a range of 2 steps, or of any length with one slot). Exact for ``slack`` 1;
    beyond it, a lower bound (a range reopened after its right part may find its start held).
    ``ends_forward``: the range's first advances end the forward sweep (as in
    :func:`forward_then_reverse`), after which the live state is trusted no more, so the
    reverse sweep's first load finds nothing held.
    """
    n_steps = check_int("n_steps", n_steps, 1)
    snaps = check_int("snaps", snaps, 1)
    slack = check_int("slack", slack, 0)
    taping = check_bool("taping", taping)
    kept = _loads_kept(n_steps, snaps, slack, taping)
    if ends_forward:
        steps = n_steps
        while steps > 2 and snaps > 1:  # the forward sweep stores down to its last range
            steps, snaps = steps - _split(steps, snaps), snaps - 1
        longest = slack if taping else slack + 1
        kept -= 2 <= steps <= longest
    return kept


def _loads_kept(n_steps: int, snaps: int, slack: int, taping: bool) -> int:
    """:func:`loads_kept` of a range whose every load is counted."""
    if len(_KEPT) > _MEMO_LIMIT:
        _KEPT.clear()
    pending = [(n_steps, snaps)]
    while pending:
        steps, slots = pending[-1]
        key = (steps, slots, slack, taping)
        if key in _KEPT:
            pending.pop()
            continue
        if steps <= 2 or slots == 1:
            # reversing steps ... 2, 1: before the load of the start, an advance of l - 1
            # steps (l with taping) for a range of l steps left
            longest = slack if taping else slack + 1
            _KEPT[key] = max(0, min(steps, longest) - 1)
        else:
            advance = _split(steps, slots)
            parts = [(advance, slots), (steps - advance, slots - 1)]
            missing = [part for part in parts if (*part, slack, taping) not in _KEPT]
            if missing:
                pending.extend(missing)
                continue
            _KEPT[key] = sum(_KEPT[(*part, slack, taping)] for part in parts)
        pending.pop()
    return _KEPT[(n_steps, snaps, slack, taping)]


#: Actions a schedule builds ahead of its consumer: memory stays bounded at any n, and what a
#: chunk costs (a list, a generator's resumption) is spread over this many actions.
CHUNK = 256

#: Memo of :func:`_split` for the ranges a walk meets (an interval's, again and again), cleared
#: past ``_SPLITS_LIMIT`` entries (some 10 MiB).
_SPLITS_LIMIT = 1 << 16
_SPLITS: dict[tuple[int, int], int] = {}

#: What :func:`reverse_range_into` yields: full chunks; it returns the one being filled.
Chunks = Generator[list[Action], None, list[Action]]


def reverse_range_into(out: list[Action], start: int, end: int, snaps: int,
                       stored: Mapping[int, Tier], live: int | None, taping: bool,
                       ends_forward: int = -1, then: tuple[Action, ...] = (),
                       dropped: int = -1) -> Chunks:
    """Append to ``out`` the actions of :func:`reverse_range`, yielding the list each time it
    holds :data:`CHUNK` actions and going on in a new one; return the list being filled.

    ``EndForward()`` and ``then`` follow the first advance that reaches ``ends_forward``, and
    ``Reverse(dropped)`` is left out (see :func:`forward_then_reverse`). One generator walks
    the whole range, and a split of a range it has seen is looked up: a schedule's actions pass
    through no nested generators and cost little more than their construction.
    """
    append = out.append
    splits, l1 = _SPLITS, Tier.L1
    pending = [(start, end, snaps)]  # ranges to reverse, and (step, step, 0): free u_step
    while pending:
        a, b, c = pending.pop()
        if c == 0:
            append(Free(a, l1))
            continue
        while b > a:
            if live != a:
                append(Load(a, stored.get(a, l1)))
                live = a
            steps = b - a
            if c == 1 or steps <= 2:
                advance = steps - 1
            else:
                advance = splits.get((steps, c), 0)
                if not advance:
                    if len(splits) > _SPLITS_LIMIT:
                        splits.clear()
                    advance = splits[steps, c] = _split(steps, c)
            if advance == steps - 1:
                # Going to b - 1 needs no checkpoint: the next step is the reverse step's.
                reached = b if taping else b - 1
                if reached > a:
                    append(Advance(a, reached))
                    if reached == ends_forward:
                        append(EndForward())
                        out.extend(then)
                        ends_forward = -1
                b -= 1
                if b != dropped:
                    append(Reverse(b))
                live = None
                if len(out) >= CHUNK:
                    yield out
                    out = []
                    append = out.append
                continue
            mid = a + advance
            append(Advance(a, mid))
            if mid == ends_forward:
                append(EndForward())
                out.extend(then)
                ends_forward = -1
            append(Store(mid, l1))
            pending.append((a, mid, c))
            pending.append((mid, mid, 0))
            a, c, live = mid, c - 1, mid
    return out


def chained(chunks: Chunks) -> Iterator[Action]:
    """The actions of ``chunks`` and of the list it returns, one by one (iterated in C)."""
    return itertools.chain.from_iterable(_with_last(chunks))


def _with_last(chunks: Chunks) -> Iterator[list[Action]]:
    last = yield from chunks
    yield last


def reverse_range(
    start: int, end: int, snaps: int, stored: Mapping[int, Tier], live: int | None,
    taping: bool = True,
) -> Iterator[Action]:
    """Yield the optimal actions that reverse steps ``end - 1`` down to ``start``.

    ``u_start`` must already be stored, in ``stored[start]``, and counts as one of the ``snaps``
    slots; every other checkpoint goes to Level-1 and is freed before this returns. ``live`` is the
    step the live state holds on entry (None when unknown). Iterative, so any length works.

    With ``taping=False`` each ``Reverse(t)`` follows the live state reaching u_t instead of an
    advance ending at t + 1. The splits are the same: the taping-free cost of a range is its taping
    cost less one step per reverse step, with the same recurrence (see :func:`untaped_forward_steps`).
    """
    return chained(reverse_range_into([], start, end, snaps, stored, live, taping))


def forward_then_reverse_into(out: list[Action], start: int, n_steps: int, snaps: int,
                              stored: Mapping[int, Tier], taping: bool,
                              then: tuple[Action, ...] = ()) -> Chunks:
    """:func:`forward_then_reverse` appended to ``out`` in chunks, as
    :func:`reverse_range_into` appends."""
    if taping:
        return reverse_range_into(out, start, n_steps, snaps, stored, start, True, n_steps, then)
    return reverse_range_into(out, start, n_steps + 1, snaps, stored, start, False, n_steps,
                              then, n_steps)


def forward_then_reverse(
    start: int, n_steps: int, snaps: int, stored: Mapping[int, Tier], taping: bool,
    then: tuple[Action, ...] = (),
) -> Iterator[Action]:
    """Yield the end of the forward sweep from the live, stored ``u_start`` to ``u_n``, then the
    reversal of steps ``n - 1`` down to ``start``, with ``EndForward()`` and ``then`` between.

    With taping the forward sweep's last advance tapes ``Reverse(n - 1)``. Without it, the sweep
    must still reach u_n, which no reverse step reads: it is reversed as a range one step longer
    whose last reverse step, of the fictitious step n, is dropped, so the optimal taping-free
    schedule is Revolve's for n + 1 steps, shifted by one step.
    """
    return chained(forward_then_reverse_into([], start, n_steps, snaps, stored, taping, then))


def mark_end_forward(
    actions: Iterable[Action], n_steps: int, then: tuple[Action, ...] = ()
) -> Iterator[Action]:
    """Yield ``actions`` with ``EndForward()`` and then ``then`` inserted after the first
    ``Advance`` that reaches ``u_n``: there the forward sweep ends and the reverse sweep begins."""
    actions = iter(actions)
    for action in actions:
        yield action
        if type(action) is Advance and action.end == n_steps:
            yield EndForward()
            yield from then
            break
    yield from actions  # the reverse sweep, delegated without a test per action


class Revolve:
    """The optimal single-level schedule: reverse ``n_steps`` steps with ``snaps`` Level-1 slots.

    Parameters
    ----------
    n_steps : int
        Number of forward steps n (>= 1).
    snaps : int
        Level-1 checkpoint slots s (>= 1), the one holding u_0 included.
    taping : bool
        True (default): pyrevolve's protocol, each ``Reverse(t)`` directly after an advance ending
        at t + 1. False: each ``Reverse(t)`` while the live state is u_t, with no taping step.

    Notes
    -----
    Its total forward steps equal :func:`optimal_forward_steps` for every (n, s) with taping, and
    ``untaped_forward_steps`` without. With ``snaps >= n - 1`` (taping) or ``snaps >= n``
    (without) it stores every state it needs once: store-all.

    Examples
    --------
    A schedule is an iterable of actions:

    >>> from schedules import Revolve
    >>> for action in list(Revolve(4, 2))[:5]:
    ...     print(action)
    Store(step=0, tier=Tier.L1)
    Advance(start=0, end=2)
    Store(step=2, tier=Tier.L1)
    Advance(start=2, end=4)
    EndForward()
    """

    def __init__(self, n_steps: int, snaps: int, *, taping: bool = True) -> None:
        self.n_steps = check_int("n_steps", n_steps, 1)
        self.snaps = check_int("snaps", snaps, 1)
        self.taping = check_bool("taping", taping)

    @property
    def l1_slots(self) -> int:
        """Level-1 slots the schedule may use at once."""
        return self.snaps

    @property
    def l1_peak(self) -> int:
        """Level-1 slots the schedule does hold at once at most (``simulate(...).l1_peak``,
        without running it): every slot, unless all the states it reads fit in fewer (with
        taping u_{n-1} is never stored: the taping step reaches it from u_{n-2})."""
        return min(self.snaps, max(self.n_steps - 1, 1) if self.taping else self.n_steps)

    def __repr__(self) -> str:
        taping = "" if self.taping else ", taping=False"
        return f"Revolve(n_steps={self.n_steps}, snaps={self.snaps}{taping})"

    def get_config(self) -> dict[str, int | str | bool]:
        """Return the constructor's arguments as a plain dict (JSON-ready)."""
        return {"name": "Revolve", "n_steps": self.n_steps, "snaps": self.snaps,
                "taping": self.taping}

    def __iter__(self) -> Iterator[Action]:
        return chained(self._chunks())

    def _chunks(self) -> Chunks:
        out: list[Action] = [Store(0, Tier.L1)]
        out = yield from forward_then_reverse_into(out, 0, self.n_steps, self.snaps,
                                                   {0: Tier.L1}, self.taping)
        out += (Free(0, Tier.L1), EndReverse())
        return out
