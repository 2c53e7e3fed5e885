"""H-Revolve: the optimal schedule over a hierarchy of storage levels (Herrmann & Pallez, "H-Revolve:
a framework for adjoint computation on synchronous hierarchical platforms", ACM TOMS 46(2), 2020).

Level 0 is the fastest (memory), higher levels are larger and slower (a disk). Every transfer is
synchronous: writing a state to level k costs ``write``, reading it back ``read``, in the same
unit as a forward step (``forward_cost``) and a reverse step (``reverse_cost``). A dynamic program
over (level, chain length, free slots) gives the least makespan; the schedule follows its
choices.

The model's chain of length l has forward steps F_0 .. F_{l-1} and reverse steps B_0 .. B_l, B_i
reading the live state x_i. Mapped onto the runtime's protocols: with taping (pyrevolve's), l =
n - 1 and each B_t is ``Advance(t, t + 1), Reverse(t)`` (merged with an advance ending at t);
without, l = n and B_n, which has no step to reverse, is dropped after the forward sweep reaches
u_n.

The tables take O(levels * slots * n^2) time (compiled with numba, imported on first use), as the
published dynamic program does; the schedule is then generated in O(number of actions).
"""
from __future__ import annotations

import math
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from typing import Any, NamedTuple

from ._args import check_bool, check_int
from ._errors import InvalidTypeError, InvalidValueError
from .actions import (Action, Advance, EndForward, EndReverse, Free, Load, Prefetch, Reverse,
                      Store, Tier)

__all__ = ["Level", "HRevolve", "Operation", "hrevolve_tables"]

#: Choice codes in the tables: the level below, or a split (advance j >= 1 steps first).
_BELOW = 0


@dataclass(frozen=True)
class Level:
    """One storage level: ``slots`` states, ``write`` and ``read`` seconds (or any unit shared
    with the step costs) per state."""

    slots: int
    write: float = 0.0
    read: float = 0.0

    def __post_init__(self) -> None:
        check_int("slots", self.slots, 0)
        for name in ("write", "read"):
            _cost(f"a level's {name} cost", getattr(self, name))


class Operation(NamedTuple):
    """One step of the model's schedule: ``kind`` is "forward" (``step`` to ``end``),
    "reverse" (B_step), "write", "read" or "discard" (u_step at ``level``)."""

    kind: str
    step: int
    end: int = -1
    level: int = -1


def _compiled() -> Any:
    """The table builder, compiled on first use and cached on disk (numba is a dependency of
    asyncckpt; schedules imports it only here)."""
    global _fill
    if _fill is None:
        import numba
        import numpy as np

        @numba.njit(cache=True, nogil=True)
        def fill(length, slots, writes, reads, uf, ub, opt, optp, pick, pickp):  # type: ignore
            # opt[k, l, m]: x_0 live and stored nowhere; optp: x_0 also stored at level k.
            # m free slots at level k (x_0's own included in optp), every slot of the levels
            # below k free, none above.
            inf = np.inf
            for k in range(slots.shape[0]):
                for m in range(slots[k] + 1):
                    opt[k, 0, m] = ub
                    optp[k, 0, m] = ub if m > 0 else inf
                for l in range(1, length + 1):
                    below = opt[k - 1, l, slots[k - 1]] if k > 0 else inf
                    opt[k, l, 0] = below
                    optp[k, l, 0] = inf
                    pick[k, l, 0] = 0
                    for m in range(1, slots[k] + 1):
                        best, best_j = below, 0
                        for j in range(1, l + 1):
                            cost = j * uf + opt[k, l - j, m - 1] + reads[k] + optp[k, j - 1, m]
                            if cost < best:
                                best, best_j = cost, j
                        optp[k, l, m] = best
                        pickp[k, l, m] = best_j
                        written = writes[k] + best
                        if best_j != 0 and written <= below:
                            opt[k, l, m], pick[k, l, m] = written, 1
                        else:
                            opt[k, l, m], pick[k, l, m] = below, 0
        _fill = fill
    return _fill


_fill: Any = None


class _Tables(NamedTuple):
    opt: Any
    optp: Any
    pick: Any
    pickp: Any


def hrevolve_tables(length: int, levels: Sequence[Level], forward_cost: float,
                    reverse_cost: float) -> _Tables:
    """The dynamic program's tables for chains of up to ``length`` steps: ``opt[k, l, m]`` and
    ``optp[k, l, m]`` (makespans) and the choices that reach them."""
    import numpy as np

    widest = max(level.slots for level in levels) + 1
    shape = (len(levels), length + 1, widest)
    tables = _Tables(np.full(shape, np.inf), np.full(shape, np.inf),
                     np.zeros(shape, np.int64), np.zeros(shape, np.int64))
    _compiled()(length, np.array([level.slots for level in levels], np.int64),
                np.array([level.write for level in levels], float),
                np.array([level.read for level in levels], float),
                float(forward_cost), float(reverse_cost), *tables)
    return tables


def _cost(name: str, value: object) -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float)) \
            or not math.isfinite(value) or value < 0:
        raise InvalidValueError(f"{name} must be a finite number >= 0, got {value!r}")
    return float(value)


class HRevolve:
    """The H-Revolve schedule: reverse ``n_steps`` steps over ``levels`` (level 0 first).

    Parameters
    ----------
    n_steps : int
        n (>= 1).
    levels : sequence of Level
        Slots and transfer costs, fastest first; u_0 counts against a slot like any state.
    forward_cost, reverse_cost : float
        Of one forward step and one reverse step (with taping, the reverse step includes its
        taping step).
    taping : bool
        The protocol of the actions, as :class:`schedules.Revolve`'s.

    Raises
    ------
    InvalidValueError
        If the levels hold no slot while one is needed, or an argument is out of range.

    Notes
    -----
    Iterating yields actions (:data:`schedules.Action`) for one or two levels (level 0 on
    ``Tier.L1``, level 1 on ``Tier.L2``, each read of level 1 prefetched once);
    :meth:`operations` yields the model's operations for any number of levels. :attr:`makespan`
    is the dynamic program's; the operations, priced with the same costs, add up to it.
    """

    def __init__(self, n_steps: int, levels: Sequence[Level], *, forward_cost: float = 1.0,
                 reverse_cost: float = 1.0, taping: bool = True) -> None:
        self.n_steps = check_int("n_steps", n_steps, 1)
        self.taping = check_bool("taping", taping)
        levels = tuple(levels)
        if not levels or not all(isinstance(level, Level) for level in levels):
            raise InvalidTypeError(f"levels must be a non-empty sequence of Level, got {levels!r}")
        self.levels = levels
        self.forward_cost = _cost("forward_cost", forward_cost)
        self.reverse_cost = _cost("reverse_cost", reverse_cost)
        self.length = n_steps - 1 if taping else n_steps
        self._tables = hrevolve_tables(self.length, levels, self.forward_cost, self.reverse_cost)
        top = len(levels) - 1
        self._start = (top, self.length, levels[top].slots)
        if math.isinf(self.makespan):
            raise InvalidValueError(
                f"H-Revolve needs at least one slot to reverse {n_steps} steps, got levels "
                f"{[level.slots for level in levels]}")
        #: Level-1 slots, for :func:`schedules.simulate`.
        self.l1_slots = levels[0].slots

    @property
    def makespan(self) -> float:
        """The least makespan, in the costs' unit (the dynamic program's value)."""
        k, l, m = self._start
        return float(self._tables.opt[k, l, m])

    def operations(self) -> Iterator[Operation]:
        """The model's schedule, for any number of levels. Iterative: any length works."""
        pick, pickp = self._tables.pick, self._tables.pickp
        slots = [level.slots for level in self.levels]
        pending: list[tuple[Any, ...]] = [("opt", *self._start, 0)]
        while pending:
            task = pending.pop()
            if task[0] == "emit":
                yield task[1]
                continue
            kind, k, l, m, start = task
            if l == 0:
                yield Operation("reverse", start)
                continue
            if kind == "opt":
                if pick[k, l, m] == _BELOW:
                    pending.append(("opt", k - 1, l, slots[k - 1], start))
                else:
                    yield Operation("write", start, level=k)
                    pending.append(("emit", Operation("discard", start, level=k)))
                    pending.append(("optp", k, l, m, start))
                continue
            j = int(pickp[k, l, m])
            if j == _BELOW:
                pending.append(("opt", k - 1, l, slots[k - 1], start))
                continue
            yield Operation("forward", start, start + j)
            # in order: the chain from x_{start+j}, a read of x_start, the chain before it
            pending.append(("optp", k, j - 1, m, start))
            pending.append(("emit", Operation("read", start, level=k)))
            pending.append(("opt", k, l - j, m - 1, start + j))

    def price(self) -> float:
        """The operations' makespan, priced one by one (equals :attr:`makespan`)."""
        total = 0.0
        for op in self.operations():
            if op.kind == "forward":
                total += (op.end - op.step) * self.forward_cost
            elif op.kind == "reverse":
                total += self.reverse_cost
            elif op.kind == "write":
                total += self.levels[op.level].write
            elif op.kind == "read":
                total += self.levels[op.level].read
        return total

    def __iter__(self) -> Iterator[Action]:
        if len(self.levels) > 2:
            raise InvalidValueError(
                f"H-Revolve's actions name two tiers; {len(self.levels)} levels have only "
                f"operations() (use two levels to run or validate it)")
        n, taping = self.n_steps, self.taping
        tiers = (Tier.L1, Tier.L2)
        prefetched: set[int] = set()
        held: Advance | None = None  # an advance kept back to merge with a taping step
        ended = False
        for op in self.operations():
            if op.kind == "reverse":
                if taping:
                    if held is not None and held.end == op.step:
                        held = Advance(held.start, op.step + 1)
                    else:
                        if held is not None:
                            yield held
                        held = Advance(op.step, op.step + 1)
                if held is not None:
                    yield held
                    if not ended and held.end == n:
                        yield EndForward()
                        ended = True
                    held = None
                if op.step < n:  # taping-free: B_n has nothing to reverse
                    yield Reverse(op.step)
                continue
            if held is not None:
                yield held
                held = None
            if op.kind == "forward":
                held = Advance(op.step, op.end)
            elif op.kind == "write":
                yield Store(op.step, tiers[op.level])
            elif op.kind == "read":
                if op.level == 1 and op.step not in prefetched:
                    prefetched.add(op.step)
                    yield Prefetch(op.step)
                yield Load(op.step, tiers[op.level])
            else:
                prefetched.discard(op.step)
                yield Free(op.step, tiers[op.level])
        yield EndReverse()

    def get_config(self) -> dict[str, Any]:
        """Return the constructor's arguments as a plain dict (JSON-ready).

        Returns
        -------
        dict
            ``name``, ``n_steps``, ``levels`` (each level's fields as a dict), ``forward_cost``,
            ``reverse_cost`` and ``taping``.
        """
        return {"name": "HRevolve", "n_steps": self.n_steps,
                "levels": [vars(level).copy() for level in self.levels],
                "forward_cost": self.forward_cost, "reverse_cost": self.reverse_cost,
                "taping": self.taping}

    def __repr__(self) -> str:
        return (f"HRevolve(n_steps={self.n_steps}, levels={list(self.levels)!r}, "
                f"makespan={self.makespan:g}, taping={self.taping})")
