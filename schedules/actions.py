"""The actions a checkpointing schedule is made of.

A schedule is an iterable of these immutable values. The runtime interprets them, the validator
(:func:`schedules.simulate`) replays them abstractly and the performance model prices them, so all
three see the same order of work.

States are named by their step: ``u_t`` is the state before forward step ``t``; ``u_0`` is the
initial state and ``u_n`` the final one. The *live* state is the one the user's forward operator
works on.
"""
from __future__ import annotations

import enum
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

__all__ = [
    "Tier",
    "Action",
    "Advance",
    "Store",
    "Prefetch",
    "Load",
    "Free",
    "Reverse",
    "EndForward",
    "EndReverse",
]


class Tier(enum.Enum):
    """Where a stored state lives."""

    #: Fast, small memory beside the computation (a preallocated buffer slot).
    L1 = "L1"
    #: Large, slow storage behind it (host DRAM, a ramdisk, an SSD), reached asynchronously.
    L2 = "L2"

    def __repr__(self) -> str:
        return f"Tier.{self.name}"


@dataclass(frozen=True, slots=True)
class Advance:
    """Advance the live state from ``u_start`` to ``u_end`` with the forward operator.

    Read as ``fwd.apply(t_start=start, t_end=end)``; it costs ``end - start`` forward steps.
    """

    start: int
    end: int

    def __init__(self, start: int, end: int) -> None:
        _advance_start(self, start)
        _advance_end(self, end)


@dataclass(frozen=True, slots=True)
class Store:
    """Copy the live state, which must be ``u_step``, into ``tier``.

    On ``Tier.L2`` the copy is a write that completes in the background.
    """

    step: int
    tier: Tier

    def __init__(self, step: int, tier: Tier) -> None:
        _store_step(self, step)
        _store_tier(self, tier)


@dataclass(frozen=True, slots=True)
class Prefetch:
    """Start reading ``u_step`` back from Level-2 into a Level-1 prefetch buffer.

    The read proceeds in the background; a later ``Load(step, Tier.L2)`` waits for it. The
    prefetched copy stays in its buffer, so further loads of the same step cost a memory copy
    only, until ``Free(step, Tier.L2)`` releases both.
    """

    step: int

    def __init__(self, step: int) -> None:
        _prefetch_step(self, step)


@dataclass(frozen=True, slots=True)
class Load:
    """Make the live state ``u_step`` by copying it from ``tier``.

    From ``Tier.L2`` the step must have been prefetched; the load waits for that read.
    """

    step: int
    tier: Tier

    def __init__(self, step: int, tier: Tier) -> None:
        _load_step(self, step)
        _load_tier(self, tier)


@dataclass(frozen=True, slots=True)
class Free:
    """Drop the copy of ``u_step`` held in ``tier`` (and its prefetch buffer, on Level-2)."""

    step: int
    tier: Tier

    def __init__(self, step: int, tier: Tier) -> None:
        _free_step(self, step)
        _free_tier(self, tier)


@dataclass(frozen=True, slots=True)
class Reverse:
    """Run the adjoint of forward step ``step``: ``rev.apply(t_start=step, t_end=step + 1)``.

    It must directly follow its taping step, an ``Advance`` that ended at ``step + 1``.
    """

    step: int

    def __init__(self, step: int) -> None:
        _reverse_step(self, step)


@dataclass(frozen=True, slots=True)
class EndForward:
    """The forward sweep is over: the live state is ``u_n``. ``apply_forward()`` returns here."""


@dataclass(frozen=True, slots=True)
class EndReverse:
    """The reverse sweep is over: every step has been reversed and nothing is left stored."""


def _setter(cls: type, field: str) -> Callable[[Any, Any], None]:
    """The descriptor of ``cls``'s slot ``field``, whose ``__set__`` the ``__init__`` above
    calls.

    An action's ``__init__`` sets its slots through them: a frozen dataclass's own sets each
    field with ``object.__setattr__``, which looks the slot up by name (0.22 us to build an
    :class:`Advance`, where this takes 0.14), and a schedule builds some six actions a step.
    Assigning to an action still raises ``FrozenInstanceError``.
    """
    setter: Callable[[Any, Any], None] = getattr(cls, field).__set__
    return setter


_advance_start, _advance_end = _setter(Advance, "start"), _setter(Advance, "end")
_store_step, _store_tier = _setter(Store, "step"), _setter(Store, "tier")
_prefetch_step = _setter(Prefetch, "step")
_load_step, _load_tier = _setter(Load, "step"), _setter(Load, "tier")
_free_step, _free_tier = _setter(Free, "step"), _setter(Free, "tier")
_reverse_step = _setter(Reverse, "step")

#: Any one action (:class:`Advance`, :class:`Store`, :class:`Prefetch`, :class:`Load`,
#: :class:`Free`, :class:`Reverse`, :class:`EndForward` or :class:`EndReverse`): what a schedule
#: yields and :func:`simulate` takes.
Action = Advance | Store | Prefetch | Load | Free | Reverse | EndForward | EndReverse
