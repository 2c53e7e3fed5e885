"""The schedule the next run follows: its Level-1 slots, its interval, the schedule built from
them and the Level-2 room they need; and :class:`RunPlan`, the read-only view of it that
``AsyncCheckpointer.plan`` gives."""
from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from schedules import AsyncMultistage, OnlineMultistage, Revolve

from .._execution.bounded import BoundedCalls
from .._execution.decisions import RunDecisions
from .budget import MemoryPlan
from .._memory.buffers import padded
from .._memory.pool import POOL
from ..errors import CheckpointError, MemoryBudgetError, StorageFullError, TransferError
from ..storage import Storage, memory_tier, tiers_of

__all__ = ["Planner", "RunPlan", "UNDECIDED"]

#: What :attr:`RunPlan.schedule` says before the model has chosen
UNDECIDED = "chosen at the first apply_forward()"


@dataclass(frozen=True)
class RunPlan:
    """What the next (or current) run of a checkpointer will do.

    Attributes
    ----------
    l1_slots : int
        Level-1 slots the schedule may hold.
    interval : int
        I: every I-th state goes to Level-2; 0 for Revolve in the Level-1 slots alone.
        With ``interval="adaptive"`` or unknown n, the least interval.
    schedule : str
        "Revolve" (Level-1 alone), "AsyncMultistage" (a fixed interval), "OnlineMultistage"
        (intervals or n decided as the run goes), or before the first run of ``interval="auto"``
        ``UNDECIDED`` (the model chooses then, from what the run measures).
    level2 : tuple of str
        Level-2's tiers, fastest first (one for an untiered Level-2).
    capacities : tuple of int or None
        States each tier may hold beside the slots (None: no limit).
    l1_bytes : int
        Level-1 bytes: the slots and, with Level-2, the staging and prefetch buffers.
    transfers : str
        "background" (on the I/O threads) or "inline".
    taping : bool
        The protocol of the reverse calls.
    predicted_s : float or None
        The model's prediction of the run's seconds ("auto" and "adaptive" after a plan was
        chosen), else None.
    """

    l1_slots: int
    interval: int
    schedule: str
    level2: tuple[str, ...]
    capacities: tuple[int | None, ...]
    l1_bytes: int
    transfers: str
    taping: bool
    predicted_s: float | None = None


class Planner:
    """Builds the schedule of each run from the slots and interval chosen for it, and keeps the
    budgeted DRAM tier of Level-2 to what the memory plan leaves beside the slots.

    Parameters
    ----------
    memory : MemoryPlan
        The split of the memory budget.
    storage : Storage
        Level-2 (a tiered one when a budget bounds its DRAM tier).
    calls : BoundedCalls
        How Level-2 is called (within the deadline).
    adaptive : bool
        Whether each run decides its intervals (then its schedule is made per run).
    l1_slots, in_level1 : int, bool
        The first plan's slots, and whether every run stays in Level-1.
    """

    def __init__(self, memory: MemoryPlan, storage: Storage, calls: BoundedCalls, *,
                 adaptive: bool, l1_slots: int, in_level1: bool) -> None:
        self.memory = memory
        self.storage, self.calls = storage, calls
        self.adaptive = adaptive
        self.in_level1 = in_level1
        self.n_timesteps = memory.n_timesteps
        #: the tier a budget bounds (None: none is bounded)
        self.dram = memory_tier(storage) if memory.bounds_level2(in_level1) else None
        #: further tiers in memory (a tmpfs directory beside DRAM): RAM the budget gave the
        #: DRAM tier, so they hold nothing
        self.no_room = [] if self.dram is None else [
            index for index, tier in enumerate(tiers_of(storage))
            if tier.holds_process_memory and index != self.dram]
        self.interval = 0
        self.schedule: AsyncMultistage | OnlineMultistage | Revolve | None = None
        self.predicted_s: float | None = None
        self._planned: tuple[int, int] | None = None  # (interval, slots) planned for
        self.use_slots(l1_slots)

    @property
    def planned(self) -> bool:
        """Whether a plan with Level-2 is set (an interval, possibly the least of a run)."""
        return self._planned is not None

    def use_slots(self, l1_slots: int) -> None:
        """Run with ``l1_slots`` Level-1 slots; the DRAM tier of Level-2 gets what the budget
        leaves beside them."""
        self.l1_slots = l1_slots
        if self.dram is not None:
            # bytes, not states: states smaller than the largest are counted at their size
            self.storage.set_byte_limit(
                self.dram, self.memory.dram_states(l1_slots) * padded(self.memory.nbytes))
            for index in self.no_room:
                self.storage.set_byte_limit(index, 0)

    @property
    def l1_bytes(self) -> int:
        """Level-1 bytes of the plan: its slots and, unless it runs Revolve in Level-1 alone,
        the engine's staging and prefetch buffers."""
        alone = self.in_level1 or isinstance(self.schedule, Revolve)
        return self.memory.l1_bytes(self.l1_slots, alone)

    def capacities(self, l1_slots: int, *, devices: bool = True) -> list[int | None] | None:
        """Each Level-2 tier's capacity with ``l1_slots`` slots (None: one untiered Level-2 of
        no known limit), where ``devices`` a device's room too, where it holds fewer than the n
        states a run could write."""
        nbytes, n = self.memory.nbytes, self.n_timesteps
        known = self.storage.capacities

        def room_of(tier: Storage) -> int | None:
            if not devices or n is None:
                return None
            room = self._level2(f"room_for({nbytes}) of {tier!r}", tier.room_for, nbytes)
            return room if room is not None and room < n else None

        if self.storage.tiers is None or known is None:
            room = room_of(self.storage)
            return None if room is None else [room]
        capacities = list(known)
        if self.dram is not None:
            capacities[self.dram] = self.memory.dram_states(l1_slots)
        for index in self.no_room:
            capacities[index] = 0
        for index, tier in enumerate(self.storage.tiers):
            room, capacity = room_of(tier), capacities[index]
            if room is not None:
                capacities[index] = room if capacity is None else min(room, capacity)
        return capacities

    def level1_only(self) -> None:
        """Revolve in the Level-1 slots alone, no Level-2 (store-all where every state
        fits)."""
        n = self.n_timesteps
        assert n is not None
        if memory_tier(self.storage) is not None:  # RAM an earlier plan took goes back
            self._level2("reserve of no state", self.storage.reserve, self.memory.nbytes, 0)
        self.interval = 0
        self._planned = None
        self.schedule = Revolve(n, min(self.l1_slots, n), taping=self.memory.taping)

    def with_interval(self, interval: int) -> None:
        """Use ``interval`` from now on (the least one, for adaptive and online runs): build its
        schedule, where it is fixed in advance, and make room on Level-2."""
        n = self.n_timesteps
        if self._planned == (interval, self.l1_slots):
            return
        if n is not None:
            l2_states = len(range(0, n, interval))
            self._check_room(interval, l2_states)
            self._pool_beside_ram_tier()
            self._level2(f"reserve of {l2_states} states of {self.memory.nbytes} bytes",
                         self.storage.reserve, self.memory.nbytes, l2_states)
        self.interval = interval
        self._planned = interval, self.l1_slots
        # an adaptive or online run's schedule is made per run, fed by that run
        self.schedule = (None if self.adaptive or n is None
                         else AsyncMultistage(n, interval, self.l1_slots,
                                              taping=self.memory.taping))

    def _level2(self, what: str, fn: Callable[..., Any], /, *args: Any) -> Any:
        """``fn(*args)``, the Level-2 call ``what``, within the deadline (a hung mount stalls a
        statvfs too); a device's own error is named as a failure of Level-2."""
        try:
            return self.calls.call(what, fn, *args)
        except CheckpointError:
            raise
        except Exception as exc:
            raise TransferError(f"{what} on Level-2 {self.storage!r} failed: {exc!r}") from exc

    def _pool_beside_ram_tier(self) -> None:
        """Before Level-2 reserves room in a tier in RAM outside the pool (a tmpfs file, backed
        at once), let the pool keep at most what the bound leaves beside that room, the slots
        and the engine's buffers (else the probes' buffers stay beside the file)."""
        bound = self.memory.bound_buffers
        if (bound is None or self.dram is None or not self.memory.on_host
                or tiers_of(self.storage)[self.dram].draws_from_pool):
            return
        beside = (self.memory.dram_states(self.l1_slots) + self.l1_slots
                  + self.memory.engine_buffers)
        POOL.keep_at_most(self.memory.nbytes, max(0, bound - beside))

    def _check_room(self, interval: int, l2_states: int) -> None:
        """Raise unless Level-2 holds the ``l2_states`` of ``interval``, naming the least
        interval that fits (:class:`MemoryBudgetError`, or :class:`~asyncckpt.StorageFullError`
        where a device is short)."""
        room = _room(self.capacities(self.l1_slots))
        if room is None or room >= l2_states:
            return
        n = self.n_timesteps
        assert n is not None
        fits = (f"interval {-(-n // room)} is the least that fits" if room
                else "no interval fits")
        budgeted = _room(self.capacities(self.l1_slots, devices=False))
        if budgeted is not None and budgeted < l2_states:
            budget = self.memory.budget
            raise MemoryBudgetError(
                f"interval {interval} keeps {l2_states} states on Level-2, but its tiers hold "
                f"{room} within memory_budget={None if budget is None else budget.nbytes} "
                f"bytes (tiers in RAM, tmpfs directories included, count against it): {fits}; "
                "give a larger interval or budget, or a disk tier")
        raise StorageFullError(
            f"interval {interval} writes {l2_states} states of {self.memory.nbytes} bytes to "
            f"Level-2 {self.storage!r}, whose devices have room for {room}: {fits}")

    def online(self, decisions: RunDecisions) -> None:
        """This run's schedule: one whose intervals (adaptive) or end (unknown n) ``decisions``
        make as it goes, none shorter than their ``min_interval``."""
        self.schedule = OnlineMultistage(self.l1_slots, decisions, n_steps=self.n_timesteps,
                                         min_interval=decisions.min_interval,
                                         taping=self.memory.taping)

    def min_interval(self) -> int:
        """The shortest interval an adaptive run may take below the planned one: 1 where
        Level-2 has room for any number of states; where a budget bounds its tiers, the
        planned interval, for which they were sized; where only its devices' room does, the
        least interval whose states fit there."""
        if _room(self.capacities(self.l1_slots, devices=False)) is not None:
            return self.interval
        room, n = _room(self.capacities(self.l1_slots)), self.n_timesteps
        if room is None:
            return 1
        return self.interval if n is None or room < 1 else min(self.interval, -(-n // room))

    def view(self, transfers: str) -> RunPlan:
        """The read-only :class:`RunPlan` of what is planned now."""
        if self._planned is None and self.schedule is None:
            kind = UNDECIDED
        elif self._planned is None:
            kind = "Revolve"
        elif self.adaptive or self.n_timesteps is None:
            kind = "OnlineMultistage"
        else:
            kind = "AsyncMultistage"
        capacities = self.capacities(self.l1_slots)
        tiers = tiers_of(self.storage)
        return RunPlan(
            l1_slots=self.l1_slots, interval=self.interval, schedule=kind,
            level2=tuple(repr(tier) for tier in tiers),
            capacities=tuple(capacities) if capacities is not None else (None,),
            l1_bytes=self.l1_bytes, transfers=transfers, taping=self.memory.taping,
            predicted_s=self.predicted_s)

    def fit_memory(self, level1: Any, engine: Any) -> None:
        """Before a run's first step, hold the buffers its plan uses and no more: Level-1's
        slots (those of a schedule fixed in advance made now, the fresh ones faulting in on
        several threads together instead of one by one in the sweep), the engine's staging and
        prefetch buffers only where the run uses Level-2, and under a budget on the host no
        more kept in the process pool than the budget leaves beside them."""
        schedule = self.schedule
        fixed = schedule if isinstance(schedule, (Revolve, AsyncMultistage)) else None
        peak = self.l1_slots if fixed is None else fixed.l1_peak
        # spares the DRAM tier keeps beyond its limit (the probe's state, written before the
        # limit could apply to it) go to the pool first, where this run's buffers find them
        self.use_slots(self.l1_slots)
        level1.shed(peak)
        if self._planned is not None:
            engine.buffers.equip()
        else:  # Revolve in Level-1 alone: every byte of the budget may be a slot
            engine.buffers.release()
        slots = max(level1.made, peak if fixed is not None else 0)
        room = self.room(slots, engine)
        if room is not None and self.memory.on_host:
            # before the slots are made: the pool keeps those they take from it, not more
            POOL.keep_at_most(self.memory.nbytes, max(0, room), slots - level1.made)
        if fixed is not None:
            level1.reserve(peak)
        if room is not None and self.memory.on_host:
            POOL.keep_at_most(self.memory.nbytes, max(0, room))

    def room(self, slots: int, engine: Any) -> int | None:
        """State buffers the memory budget (or the default bound) leaves beside ``slots``
        Level-1 slots and those held now by the engine and Level-2 in process memory (None:
        unbounded)."""
        bound = self.memory.bound_buffers
        if bound is None:
            return None
        size = padded(self.memory.nbytes)
        held, level2 = slots + engine.buffers_held, self.storage.nbytes_held
        if self._planned is not None and self.memory.codec_buffers and self.dram is not None:
            # counted full: compressed, it fills with buffers of their sizes, never with the
            # pool's of a state's size
            tier = tiers_of(self.storage)[self.dram]
            level2 += max(0, self.memory.dram_states(self.l1_slots) * size - tier.nbytes_held)
        return bound - held - level2 // size

    def record_forward(self, stats: Any) -> None:
        """After a forward sweep: where it ended (unknown n) and the intervals it took."""
        schedule = self.schedule
        if isinstance(schedule, OnlineMultistage):
            assert schedule.n_reached is not None
            stats.n_timesteps = schedule.n_reached
            stats.interval_starts = list(schedule.stores)
        elif isinstance(schedule, AsyncMultistage):
            stats.interval_starts = list(range(0, schedule.n_steps, schedule.interval))


def _room(capacities: list[int | None] | None) -> int | None:
    """States ``capacities`` hold together (None: no limit)."""
    if capacities is None or None in capacities:
        return None
    return sum(c for c in capacities if c is not None)
