"""pyrevolve's classic, action-by-action Revolve (``pyrevolve.crevolve``) over
:class:`schedules.classic.ClassicRevolve`: the same actions with the same ``capo``, ``oldcapo``
and ``check`` after each, and the same ``adjust``, ``maxrange``, ``numforw`` and ``expense``.

Offline Revolve only: pyrevolve's online (``timesteps=None``) and two-level
(``snapshots_disk``) variants of this interface are refused with an error that says what to use
instead (docs/migration.md).
"""
from __future__ import annotations

from enum import Enum

from schedules.classic import (ClassicAction, ClassicRevolve, ClassicRevolveError, adjust,
                               classic_forward_steps, max_range)

from ..errors import InvalidValueError

__all__ = ["Action", "CRevolve", "RevolveError", "adjust", "expense", "maxrange", "numforw"]


class Action(Enum):
    """pyrevolve's action names and values."""

    advance = 1
    takeshot = 2
    restore = 3
    firstrun = 4
    youturn = 5
    terminate = 6
    error = 7


#: pyrevolve's error, under its name: raised by :meth:`CRevolve.revolve` where the schedule
#: cannot go on
RevolveError = ClassicRevolveError

_ACTIONS = {classic: Action[classic.name.lower()] for classic in ClassicAction}


def maxrange(snapshots: int, timefactor: int) -> int:
    """The most steps ``snapshots`` slots reverse with each step run at most ``timefactor`` times
    beyond the first (capped at the largest C ``int``, as pyrevolve's)."""
    return max_range(snapshots, timefactor)


def numforw(timesteps: int, snapshots: int) -> int:
    """The recomputing advances Revolve makes for ``timesteps`` steps with ``snapshots`` slots."""
    return classic_forward_steps(timesteps, snapshots)


def expense(timesteps: int, snapshots: int) -> float:
    """:func:`numforw` per step."""
    return numforw(timesteps, snapshots) / timesteps


class CRevolve:
    """Reverse ``timesteps`` steps with ``snapshots`` slots: call :meth:`CRevolve.revolve` for
    each next action and read ``capo``, ``oldcapo`` and ``check`` after it, as with pyrevolve's."""

    def __init__(self, snapshots: int, timesteps: int | None = None,
                 snapshots_disk: int | None = None) -> None:
        if timesteps is None:
            raise InvalidValueError(
                "CRevolve(snapshots) without timesteps is pyrevolve's online Revolve, which "
                "asyncckpt.compat does not offer; give timesteps, or use "
                "asyncckpt.AsyncCheckpointer(..., n_timesteps=None) for runs of unknown length")
        if snapshots_disk is not None:
            raise InvalidValueError(
                f"CRevolve(..., snapshots_disk={snapshots_disk!r}) is pyrevolve's two-level "
                "Revolve, which asyncckpt.compat does not offer action by action; use "
                "asyncckpt.compat.MultiLevelRevolver or asyncckpt.AsyncCheckpointer")
        self._revolve = ClassicRevolve(snapshots, timesteps)

    def revolve(self) -> Action:
        """The next action; raises :data:`RevolveError` where the schedule cannot go on."""
        return _ACTIONS[self._revolve.next()]

    @property
    def capo(self) -> int:
        """The step the state reaches after the last action (or the step of the slot it used)."""
        return self._revolve.capo

    @property
    def oldcapo(self) -> int:
        """The step the state was at before the last action (an advance runs oldcapo to capo)."""
        return self._revolve.oldcapo

    @property
    def check(self) -> int:
        """The slot the last store or restore used (-1 before the first store)."""
        return self._revolve.check

    @property
    def fine(self) -> int:
        """The end of what is left to reverse: the adjoint steps before ``fine`` are still due."""
        return self._revolve.fine

    @property
    def advances(self) -> int:
        """Forward steps advanced so far, recomputations included."""
        return self._revolve.advances

    @property
    def info(self) -> int:
        """pyrevolve's ``info`` of an offline schedule that has not failed."""
        return 3
