"""An abstract interpreter that replays a schedule and checks every invariant after every action."""
from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass

from ._errors import ScheduleError
from .actions import Advance, EndForward, EndReverse, Free, Load, Prefetch, Reverse, Store, Tier

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


def _name(action: object) -> str:
    return repr(action)


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
        A schedule object or any iterable of :mod:`schedules.actions` values. When it has the
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
    """
    n = n_steps if n_steps is not None else getattr(actions, "n_steps", None)
    cap_l1 = l1_slots if l1_slots is not None else getattr(actions, "l1_slots", None)
    cap_pf = prefetch_slots if prefetch_slots is not None else getattr(actions, "prefetch_slots", None)
    if taping is None:
        taping = getattr(actions, "taping", True)

    live: int | None = 0
    taped: int | None = None  # the step whose reverse the last advance tapes
    phase = "forward"
    next_reverse = -1
    l1: set[int] = set()
    l2: set[int] = set()
    prefetched: set[int] = set()
    waited: set[int] = set()
    forward_steps = reverse_steps = l2_writes = l2_reads = 0
    l1_peak = prefetch_peak = l2_peak = 0
    position = -1

    def fail(action: object, why: str) -> ScheduleError:
        return ScheduleError(f"action #{position} {_name(action)}: {why}")

    for position, action in enumerate(actions):
        if phase == "ended":
            raise fail(action, "comes after EndReverse()")
        if isinstance(action, Advance):
            if live != action.start:
                raise fail(action, f"advances from u_{action.start} but the live state is "
                           f"{'unknown' if live is None else f'u_{live}'}")
            if action.end <= action.start:
                raise fail(action, "end must be greater than start")
            if n is not None and action.end > n:
                raise fail(action, f"advances past u_n (n = {n})")
            forward_steps += action.end - action.start
            live = action.end
            taped = action.end - 1
        elif isinstance(action, Store):
            if live != action.step:
                raise fail(action, f"stores u_{action.step} but the live state is "
                           f"{'unknown' if live is None else f'u_{live}'}")
            if action.tier is Tier.L1:
                if action.step in l1:
                    raise fail(action, "u_{} is already in Level-1".format(action.step))
                l1.add(action.step)
                if cap_l1 is not None and len(l1) > cap_l1:
                    raise fail(action, f"Level-1 slot count {len(l1)} exceeds l1_slots={cap_l1}")
                l1_peak = max(l1_peak, len(l1))
            else:
                if action.step in l2:
                    raise fail(action, "u_{} is already on Level-2".format(action.step))
                l2.add(action.step)
                l2_writes += 1
                l2_peak = max(l2_peak, len(l2))
        elif isinstance(action, Prefetch):
            if action.step not in l2:
                raise fail(action, f"prefetches u_{action.step}, which is not on Level-2 "
                           "(never stored, or already freed)")
            if action.step in prefetched:
                raise fail(action, f"u_{action.step} is already prefetched")
            prefetched.add(action.step)
            l2_reads += 1
            if cap_pf is not None and len(prefetched) > cap_pf:
                raise fail(action, f"{len(prefetched)} prefetch buffers exceed "
                           f"prefetch_slots={cap_pf}")
            prefetch_peak = max(prefetch_peak, len(prefetched))
        elif isinstance(action, Load):
            if action.tier is Tier.L1:
                if action.step not in l1:
                    raise fail(action, f"loads u_{action.step}, which is not in Level-1 "
                               "(never stored, or already freed)")
            elif action.step not in prefetched:
                raise fail(action, f"loads u_{action.step} from Level-2 without a prefetch "
                           "(or after it was freed)")
            else:
                waited.add(action.step)
            live = action.step
            taped = None
        elif isinstance(action, Free):
            held = l1 if action.tier is Tier.L1 else l2
            if action.step not in held:
                raise fail(action, f"frees u_{action.step}, which is not in {action.tier.name}")
            held.discard(action.step)
            if action.tier is Tier.L2 and action.step in prefetched:
                if action.step not in waited:
                    raise fail(action, f"the prefetch of u_{action.step} was never waited for")
                prefetched.discard(action.step)
                waited.discard(action.step)
        elif isinstance(action, Reverse):
            if phase != "reverse":
                raise fail(action, "reverse step before EndForward()")
            if action.step != next_reverse:
                raise fail(action, f"out of order: expected the reverse of step {next_reverse}")
            if taping and taped != action.step:
                raise fail(action, f"does not directly follow its taping step "
                           f"Advance(end={action.step + 1})")
            if not taping and live != action.step:
                raise fail(action, f"taping-free reverse step needs the live state u_{action.step},"
                           f" it is {'unknown' if live is None else f'u_{live}'}")
            reverse_steps += 1
            next_reverse -= 1
            live = taped = None
        elif isinstance(action, EndForward):
            if phase != "forward":
                raise fail(action, "a second EndForward()")
            if n is None:
                n = live
            if live is None or live != n:
                raise fail(action, f"the forward sweep must end at u_{n}, the live state is "
                           f"{'unknown' if live is None else f'u_{live}'}")
            phase = "reverse"
            next_reverse = n - 1
        elif isinstance(action, EndReverse):
            if phase != "reverse":
                raise fail(action, "EndReverse() before EndForward()")
            if next_reverse != -1:
                raise fail(action, f"steps {next_reverse}..0 were never reversed")
            if l1 or l2:
                raise fail(action, f"left stored: Level-1 {sorted(l1)[:8]}, "
                           f"Level-2 {sorted(l2)[:8]}")
            phase = "ended"
        else:
            raise fail(action, f"is not a schedule action (type {type(action).__name__})")
    if phase != "ended":
        raise ScheduleError(f"the schedule ends after {position + 1} actions without "
                            f"{'EndForward()' if phase == 'forward' else 'EndReverse()'}")
    assert n is not None
    return SimulationResult(
        n_steps=n,
        forward_steps=forward_steps,
        reverse_steps=reverse_steps,
        l1_peak=l1_peak,
        prefetch_peak=prefetch_peak,
        l2_writes=l2_writes,
        l2_reads=l2_reads,
        l2_peak=l2_peak,
    )
