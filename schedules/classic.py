"""Revolve's classic, action-by-action interface (Griewank & Walther, Algorithm 799): a state
machine that answers "what next?" one call at a time, with the checkpoint slots as a stack.

:class:`~schedules.Revolve` yields the same optimal totals as actions a runtime interprets; this
module keeps the original call protocol and its choice of split points, for programs written
against it (``pyrevolve.crevolve``; :mod:`asyncckpt.compat.crevolve` wraps it). It does no I/O
and touches no arrays.
"""
from __future__ import annotations

import enum
import math

from ._args import check_int
from ._errors import CheckpointError
from .revolve import optimal_recomputations

__all__ = ["ClassicAction", "ClassicRevolve", "ClassicRevolveError", "MAX_SNAPS", "MAX_REPS",
           "adjust", "max_range", "classic_forward_steps"]

#: The limits of the original implementation: more slots, or a higher repetition number, is an
#: error there (codes 14 and 15), and so here.
MAX_SNAPS = 10000
MAX_REPS = 6400
#: Binomials past this are reported as it (a C ``int``'s largest), as the original does.
MAX_INT = 2**31 - 1


class ClassicAction(enum.Enum):
    """What the caller does next: move the state from ``oldcapo`` to ``capo`` (``ADVANCE``);
    store the state at ``capo`` in slot ``check`` (``TAKESHOT``); load slot ``check`` (the state
    at ``capo``; ``RESTORE``); the last forward step and the first adjoint step (``FIRSTRUN``);
    the adjoint of step ``capo`` (``YOUTURN``); or stop (``TERMINATE``)."""

    ADVANCE = 1
    TAKESHOT = 2
    RESTORE = 3
    FIRSTRUN = 4
    YOUTURN = 5
    TERMINATE = 6


class ClassicRevolveError(CheckpointError):
    """The schedule cannot go on; ``code`` is the original's error number."""

    def __init__(self, code: int, message: str) -> None:
        super().__init__(f"revolve error {code}: {message}")
        self.code = code


def max_range(snaps: int, reps: int) -> int:
    """C(snaps + reps, snaps): the most steps ``snaps`` slots reverse with each step run at most
    ``reps`` times beyond the first, capped at :data:`MAX_INT`; -1 where either is negative
    (:func:`adjust` searches down to there, as the original does)."""
    snaps = check_int("snaps", snaps, -MAX_INT)
    reps = check_int("reps", reps, -MAX_INT)
    if snaps < 0 or reps < 0:
        return -1
    return min(math.comb(snaps + reps, snaps), MAX_INT)


def adjust(steps: int) -> int:
    """The slot count the original recommends for ``steps`` steps: the point where slots and
    repetition number balance (the fewer slots, where both reach ``steps`` alike)."""
    steps = check_int("steps", steps, 1)
    snaps = reps = 1
    shift = 0
    while max_range(snaps + shift, reps + shift) > steps:
        shift -= 1
    while max_range(snaps + shift, reps + shift) < steps:
        shift += 1
    snaps, reps = snaps + shift, reps + shift
    last = None
    while max_range(snaps, reps) >= steps:
        if snaps > reps:
            snaps, last = snaps - 1, "snaps"
        else:
            reps, last = reps - 1, "reps"
    return snaps + 1 if last == "snaps" else snaps


def classic_forward_steps(steps: int, snaps: int) -> int:
    """The recomputing advances (t n - C(s + t, t - 1)) the original predicts for ``steps`` steps
    with ``snaps`` slots: the optimum, as :func:`schedules.revolve.optimal_recomputations`."""
    return optimal_recomputations(steps, snaps)


def _split(capo: int, fine: int, free: int) -> int:
    """Where an advance from ``capo`` stops with ``fine - capo`` steps left and ``free`` slots
    (the current one included): the original's rule over the binomials of the repetition
    number, at least one step."""
    left = fine - capo
    reps, reach = 0, 1
    while reach < left:
        reps += 1
        reach = reach * (reps + free) // reps
    if reps > MAX_REPS:
        raise ClassicRevolveError(15, f"a repetition number of {reps} exceeds {MAX_REPS}")
    # C(free + reps - k, ...) for the few neighbours the rule compares against
    b1 = reach * reps // (free + reps)
    b2 = b1 * free // (free + reps - 1) if free > 1 else 1
    b3 = 0 if free == 1 else (b2 * (free - 1) // (free + reps - 2) if free > 2 else 1)
    b4 = b2 * (reps - 1) // free
    b5 = 0 if free < 3 else (b3 * (free - 2) // reps if free > 3 else 1)
    if left <= b1 + b3:
        target = capo + b4
    elif left >= reach - b5:
        target = capo + b1
    else:
        target = fine - b2 - b3
    return max(target, capo + 1)


class ClassicRevolve:
    """Reverse ``steps`` steps with ``snaps`` slots, one action per :meth:`next`.

    After each call, ``capo`` is the step the state reaches (or the slot holds), ``oldcapo`` the
    one it held before the call, ``check`` the slot in use (-1 before the first store), and
    ``fine`` the end of what is left to reverse.
    """

    def __init__(self, snaps: int, steps: int) -> None:
        self.snaps = check_int("snaps", snaps, 1)
        self.steps = check_int("steps", steps, 1)
        if self.snaps > MAX_SNAPS:
            raise ClassicRevolveError(14, f"{self.snaps} slots exceed {MAX_SNAPS}")
        self.capo = self.oldcapo = 0
        self.fine = self.steps
        self.check = -1
        #: the step each slot holds
        self.held = [0] * self.snaps
        #: forward steps advanced so far, the forward sweep's included
        self.advances = 0
        self._turned = False
        self._last_fine = self.fine

    def next(self) -> ClassicAction:
        """The next action (see :class:`ClassicAction`)."""
        self.oldcapo = self.capo
        if self.check == -1 and self.capo < self.fine:
            self._turned = False
            self.held[0] = self.capo - 1
        left = self.fine - self.capo
        if left == 0:
            if self.check == -1 or self.capo == self.held[0]:
                return ClassicAction.TERMINATE
            self.capo = self.held[self.check]
            self._last_fine = self.fine
            return ClassicAction.RESTORE
        if left == 1:
            self.fine -= 1
            if self.check >= 0 and self.held[self.check] == self.capo:
                self.check -= 1
            self._last_fine = self.fine
            first, self._turned = not self._turned, True
            return ClassicAction.FIRSTRUN if first else ClassicAction.YOUTURN
        if self.check == -1:
            self.held[0], self.check = 0, 0
            self._last_fine = self.fine
            return ClassicAction.TAKESHOT
        if self.held[self.check] != self.capo:
            if self.check + 2 > self.snaps:
                raise ClassicRevolveError(11, f"a store needs slot {self.check + 1} of "
                                              f"{self.snaps}")
            self.check += 1
            self.held[self.check] = self.capo
            self._last_fine = self.fine
            return ClassicAction.TAKESHOT
        if self._last_fine < self.fine and self.snaps == self.check + 1:
            raise ClassicRevolveError(13, "the end moved beyond the slots: give more slots")
        self.capo = _split(self.capo, self.fine, self.snaps - self.check)
        self.advances += self.capo - self.oldcapo
        self._last_fine = self.fine
        return ClassicAction.ADVANCE
