"""An abstract interpreter that replays a schedule and checks every invariant after every action."""
from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from typing import assert_never

from ._errors import ScheduleError
from .actions import (Action, Advance, EndForward, EndReverse, Free, Load, Prefetch, Reverse, Store,
                      Tier)

__all__ = ["simulate", "SimulationResult"]


@dataclass(frozen=True, slots=True)
class SimulationResult:
    """What a valid schedule costs.

    Attributes
    ----------
    n_steps : int
        Steps reversed (n).
    forward_steps : int
        All steps advanced, taping steps included.
    reverse_steps : int
        Reverse steps run (n).
    l1_peak : int
        Most states held in Level-1 slots at once (prefetch buffers not included).
    prefetch_peak : int
        Most Level-2 states held in Level-1 prefetch buffers at once.
    l2_writes, l2_reads : int
        Level-2 transfers (a prefetch is one read, however often its buffer is loaded).
    l2_peak : int
        Most states held on Level-2 at once.
    """

    n_steps: int
    forward_steps: int
    reverse_steps: int
    l1_peak: int
    prefetch_peak: int
    l2_writes: int
    l2_reads: int
    l2_peak: int

    @property
    def recompute_factor(self) -> float:
        """(forward_steps - n) / n, pyrevolve's ``ratio``."""
        return (self.forward_steps - self.n_steps) / self.n_steps


def _state(step: int | None) -> str:
    return "unknown" if step is None else f"u_{step}"


class _Replay:
    """The abstract machine of :func:`simulate`: one handler per action, each checking the
    action's invariants against the state so far and raising :class:`ScheduleError` (through
    :meth:`fail`) on the first broken one."""

    def __init__(self, n: int | None, cap_l1: int | None, cap_pf: int | None,
                 taping: bool) -> None:
        self.n, self.cap_l1, self.cap_pf, self.taping = n, cap_l1, cap_pf, taping
        self.live: int | None = 0
        self.taped: int | None = None  # the step whose reverse the last advance tapes
        self.phase = "forward"
        self.next_reverse = -1
        self.l1: set[int] = set()
        self.l2: set[int] = set()
        self.prefetched: set[int] = set()
        self.waited: set[int] = set()
        self.forward_steps = self.reverse_steps = self.l2_writes = self.l2_reads = 0
        self.l1_peak = self.prefetch_peak = self.l2_peak = 0
        self.position = -1

    def fail(self, action: object, why: str) -> ScheduleError:
        return ScheduleError(f"action #{self.position} {action!r}: {why}")

    def step(self, action: object) -> None:
        if self.phase == "ended":
            raise self.fail(action, "comes after EndReverse()")
        if not isinstance(action, Action):
            raise self.fail(action, f"is not a schedule action (type {type(action).__name__})")
        match action:
            case Advance():
                self.advance(action)
            case Store():
                self.store(action)
            case Prefetch():
                self.prefetch(action)
            case Load():
                self.load(action)
            case Free():
                self.free(action)
            case Reverse():
                self.reverse(action)
            case EndForward():
                self.end_forward(action)
            case EndReverse():
                self.end_reverse(action)
            case _:
                assert_never(action)

    def advance(self, action: Advance) -> None:
        if self.live != action.start:
            raise self.fail(action, f"advances from u_{action.start} but the live state is "
                            f"{_state(self.live)}")
        if action.end <= action.start:
            raise self.fail(action, "end must be greater than start")
        if self.n is not None and action.end > self.n:
            raise self.fail(action, f"advances past u_n (n = {self.n})")
        self.forward_steps += action.end - action.start
        self.live = action.end
        self.taped = action.end - 1

    def store(self, action: Store) -> None:
        if self.live != action.step:
            raise self.fail(action, f"stores u_{action.step} but the live state is "
                            f"{_state(self.live)}")
        if action.tier is Tier.L1:
            if action.step in self.l1:
                raise self.fail(action, f"u_{action.step} is already in Level-1")
            self.l1.add(action.step)
            if self.cap_l1 is not None and len(self.l1) > self.cap_l1:
                raise self.fail(action, f"Level-1 slot count {len(self.l1)} exceeds "
                                f"l1_slots={self.cap_l1}")
            self.l1_peak = max(self.l1_peak, len(self.l1))
        else:
            if action.step in self.l2:
                raise self.fail(action, f"u_{action.step} is already on Level-2")
            self.l2.add(action.step)
            self.l2_writes += 1
            self.l2_peak = max(self.l2_peak, len(self.l2))

    def prefetch(self, action: Prefetch) -> None:
        if action.step not in self.l2:
            raise self.fail(action, f"prefetches u_{action.step}, which is not on Level-2 "
                            "(never stored, or already freed)")
        if action.step in self.prefetched:
            raise self.fail(action, f"u_{action.step} is already prefetched")
        self.prefetched.add(action.step)
        self.l2_reads += 1
        if self.cap_pf is not None and len(self.prefetched) > self.cap_pf:
            raise self.fail(action, f"{len(self.prefetched)} prefetch buffers exceed "
                            f"prefetch_slots={self.cap_pf}")
        self.prefetch_peak = max(self.prefetch_peak, len(self.prefetched))

    def load(self, action: Load) -> None:
        if action.tier is Tier.L1:
            if action.step not in self.l1:
                raise self.fail(action, f"loads u_{action.step}, which is not in Level-1 "
                                "(never stored, or already freed)")
        elif action.step not in self.prefetched:
            raise self.fail(action, f"loads u_{action.step} from Level-2 without a prefetch "
                            "(or after it was freed)")
        else:
            self.waited.add(action.step)
        self.live = action.step
        self.taped = None

    def free(self, action: Free) -> None:
        held = self.l1 if action.tier is Tier.L1 else self.l2
        if action.step not in held:
            raise self.fail(action, f"frees u_{action.step}, which is not in {action.tier.name}")
        held.discard(action.step)
        if action.tier is Tier.L2 and action.step in self.prefetched:
            if action.step not in self.waited:
                raise self.fail(action, f"the prefetch of u_{action.step} was never waited for")
            self.prefetched.discard(action.step)
            self.waited.discard(action.step)

    def reverse(self, action: Reverse) -> None:
        if self.phase != "reverse":
            raise self.fail(action, "reverse step before EndForward()")
        if action.step != self.next_reverse:
            raise self.fail(action, f"out of order: expected the reverse of step "
                            f"{self.next_reverse}")
        if self.taping and self.taped != action.step:
            raise self.fail(action, f"does not directly follow its taping step "
                            f"Advance(end={action.step + 1})")
        if not self.taping and self.live != action.step:
            raise self.fail(action, f"taping-free reverse step needs the live state "
                            f"u_{action.step}, it is {_state(self.live)}")
        self.reverse_steps += 1
        self.next_reverse -= 1
        self.live = self.taped = None

    def end_forward(self, action: EndForward) -> None:
        if self.phase != "forward":
            raise self.fail(action, "a second EndForward()")
        if self.n is None:
            self.n = self.live
        if self.live is None or self.live != self.n:
            raise self.fail(action, f"the forward sweep must end at u_{self.n}, the live state "
                            f"is {_state(self.live)}")
        self.phase = "reverse"
        self.next_reverse = self.n - 1

    def end_reverse(self, action: EndReverse) -> None:
        if self.phase != "reverse":
            raise self.fail(action, "EndReverse() before EndForward()")
        if self.next_reverse != -1:
            raise self.fail(action, f"steps {self.next_reverse}..0 were never reversed")
        if self.l1 or self.l2:
            raise self.fail(action, f"left stored: Level-1 {sorted(self.l1)[:8]}, "
                            f"Level-2 {sorted(self.l2)[:8]}")
        self.phase = "ended"

    def result(self) -> SimulationResult:
        if self.phase != "ended":
            raise ScheduleError(f"the schedule ends after {self.position + 1} actions without "
                                f"{'EndForward()' if self.phase == 'forward' else 'EndReverse()'}")
        assert self.n is not None  # set at EndForward at the latest
        return SimulationResult(
            n_steps=self.n,
            forward_steps=self.forward_steps,
            reverse_steps=self.reverse_steps,
            l1_peak=self.l1_peak,
            prefetch_peak=self.prefetch_peak,
            l2_writes=self.l2_writes,
            l2_reads=self.l2_reads,
            l2_peak=self.l2_peak,
        )


def simulate(
    actions: Iterable[object],
    *,
    n_steps: int | None = None,
    l1_slots: int | None = None,
    prefetch_slots: int | None = None,
    taping: bool | None = None,
) -> SimulationResult:
    """Replay ``actions`` abstractly, raising on the first invalid one, and return its counts.

    Parameters
    ----------
    actions : iterable of actions
        A schedule object or any iterable of actions (:data:`schedules.Action`). When it has the
        attributes ``n_steps``, ``l1_slots`` or ``prefetch_slots``, they are the limits checked,
        unless given here.
    n_steps : int, optional
        n; by default the schedule's, or else the step the forward sweep ends at.
    l1_slots : int, optional
        Level-1 slot capacity; unchecked when unknown.
    prefetch_slots : int, optional
        Prefetch buffer capacity; unchecked when unknown.
    taping : bool, optional
        The protocol of ``Reverse(t)``: True, directly after an advance ending at t + 1 (its
        taping step); False, while the live state is u_t. By default the schedule's ``taping``
        attribute, else True.

    Returns
    -------
    SimulationResult

    Raises
    ------
    ScheduleError
        Naming the action, its position and the broken invariant: an advance from a state that is
        not live, a store of a state that is not live or over capacity, a load of something never
        stored, freed or not prefetched, a reverse out of order or without its taping step (or,
        taping-free, without the live state u_t), a
        prefetch never waited for, anything left stored at the end, or a missing end marker.

    Examples
    --------
    Revolve reverses 10 steps in 2 slots with 30 forward steps in all, taping steps included:

    >>> from schedules import Revolve, simulate
    >>> result = simulate(Revolve(10, 2))
    >>> result.forward_steps, result.reverse_steps, result.l1_peak
    (30, 10, 2)

    A list of actions is checked as it stands; the first broken rule is named:

    >>> from schedules import Advance, EndForward, Reverse, ScheduleError, Store, Tier
    >>> try:
    ...     simulate([Store(step=0, tier=Tier.L1), Advance(start=0, end=2), EndForward(),
    ...               Reverse(step=0)])
    ... except ScheduleError as error:
    ...     print(error)
    action #3 Reverse(step=0): out of order: expected the reverse of step 1
    """
    n = n_steps if n_steps is not None else getattr(actions, "n_steps", None)
    cap_l1 = l1_slots if l1_slots is not None else getattr(actions, "l1_slots", None)
    cap_pf = prefetch_slots if prefetch_slots is not None else getattr(actions, "prefetch_slots", None)
    if taping is None:
        taping = getattr(actions, "taping", True)
    replay = _Replay(n, cap_l1, cap_pf, bool(taping))
    for replay.position, action in enumerate(actions):
        replay.step(action)
    return replay.result()
