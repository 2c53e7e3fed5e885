"""Whether the forward operator updates the descriptor's arrays in place: an operator that
rebinds its names to new arrays (``p.prev, p.cur = p.cur, new``) leaves the arrays the
checkpointer copies as they were, and every restored state would be the first one (a wrong
adjoint, and no error anywhere else)."""
from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from ..errors import UsageError
from .replay import digest as _digest

__all__ = ["InPlaceCheck"]


class InPlaceCheck:
    """Watches the first forward calls of a checkpointer that run between two calls of the
    descriptor the schedule makes anyway (``u_t`` before the call, ``u_end`` after it, as a
    store does). The first such call that changes the state's bytes proves the operator writes
    in place, and watching ends. One that leaves a state not all zeros as it was is a
    :class:`UsageError`; one that leaves zeros as they were decides nothing (a state of zeros
    may stay so for a while, legitimately). Deciding at the first call that changes the state
    matters: a simulation that settles to a fixed point later (bitwise, as ``x = sin(x) + 1``
    does within a few dozen steps) is not taken for rebound arrays. It costs one pass over the
    state before and one after, no call of the descriptor, and watches at most
    :attr:`WATCHED` calls, on host arrays only. A forward operator whose ``updates_in_place``
    is true is not watched (its first steps may leave a state as it was). Rebinding at a later
    step, or of one array of several, is caught by :class:`~.replay.ReplayCheck`."""

    #: forward calls watched at most before the check gives up
    WATCHED = 8

    def __init__(self, watched: bool) -> None:
        self.left = self.WATCHED if watched else 0
        #: (digest of u_begin, whether u_begin is all zeros, begin, end) of the call watched
        self.pending: tuple[int, bool, int, int] | None = None

    def advancing(self, arrays: Sequence[np.ndarray], at: int, begin: int, end: int) -> None:
        """Before a forward call from ``begin`` to ``end``; ``arrays``: the descriptor's last
        answer, for u_at."""
        self.pending = None
        self.left -= 1
        if at == begin:
            zeros = not any(array.any() for array in arrays)
            self.pending = _digest(arrays), zeros, begin, end

    def arrived(self, arrays: Sequence[np.ndarray], step: int, into: bool) -> None:
        """The descriptor's arrays of u_step (to copy into them, where ``into``): those of the
        watched call's end decide it.

        Raises
        ------
        UsageError
            If the watched call left the state's bytes as they were.
        """
        assert self.pending is not None
        digest, zeros, begin, end = self.pending
        self.pending = None
        if into or step != end:
            return
        if _digest(arrays) != digest:
            self.left = 0  # the operator wrote into the arrays: nothing left to watch
        elif not zeros:
            steps = f"step {begin}" if end == begin + 1 else f"steps {begin} to {end - 1}"
            raise UsageError(
                f"the forward operator's {steps} left the checkpoint's {len(arrays)} "
                "array(s) exactly as they were: update the state in place (u[:] = ..., "
                "np.add(a, b, out=u)), not by binding names to new arrays: the checkpointer "
                "stores and restores states through the arrays the descriptor gives it (where "
                "these steps truly leave the state as it was, set updates_in_place = True on "
                "the forward operator)")

