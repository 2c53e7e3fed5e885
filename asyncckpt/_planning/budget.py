"""``memory_budget=``: the state buffers a budget holds, split between Level-1 slots, the
transfer engine's buffers and the DRAM tier of Level-2 (the memory plan)."""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from .._execution.device_link import DIGEST_WORD_BYTES
from .._memory.buffers import padded
from ..errors import CheckpointError, InvalidValueError, MemoryBudgetError
from .codec_room import fit_codec
from .environment import Environment
from .host_bound import (MEMORY_SHARE, available_memory, bound_source, check_node_holds,
                         default_bound)
from .transfer_buffers import (DEFAULT_STAGING_BUFFERS, codec_buffers, codec_threads,
                               engine_buffers)

__all__ = ["Budget", "DEFAULT_STAGING_BUFFERS", "MEMORY_SHARE", "MemoryPlan", "available_memory",
           "check_node_holds", "codec_buffers", "codec_threads", "default_bound",
           "engine_buffers", "slot_candidates"]


@dataclass(frozen=True)
class Budget:
    """A host memory budget of ``nbytes`` for states of ``state_nbytes`` (each buffer padded to
    whole pages), with ``engine_buffers`` staging and prefetch buffers whenever Level-2 is used."""

    nbytes: int
    state_nbytes: int
    engine_buffers: int
    #: bytes of the budget that hold no state (on the host what a codec's threads keep, on a
    #: device the engine buffers' digest words)
    reserved: int = 0

    def __post_init__(self) -> None:
        if self.buffers < 1:
            beside = f" beside {self.reserved} bytes set aside" if self.reserved else ""
            raise InvalidValueError(
                f"memory_budget of {self.nbytes} bytes is too small for one state of "
                f"{self.state_nbytes} bytes ({padded(self.state_nbytes)} with its page "
                f"padding){beside}")

    @property
    def buffers(self) -> int:
        """State buffers the budget holds."""
        return max(0, self.nbytes - self.reserved) // padded(self.state_nbytes)

    @property
    def max_slots_with_level2(self) -> int:
        """Most Level-1 slots beside the engine's buffers (0: no room for Level-2 at all)."""
        return max(0, self.buffers - self.engine_buffers)

    def dram_states(self, l1_slots: int) -> int:
        """States the DRAM tier of Level-2 may hold beside ``l1_slots`` slots and the engine."""
        return max(0, self.buffers - self.engine_buffers - l1_slots)

    def check_slots(self, l1_slots: int, level2: bool) -> None:
        """Raise unless ``l1_slots`` (and the engine's buffers, with Level-2) fit."""
        need = l1_slots + (self.engine_buffers if level2 else 0)
        if need > self.buffers:
            beside = f" beside {self.engine_buffers} staging and prefetch buffers" if level2 else ""
            raise InvalidValueError(
                f"l1_slots={l1_slots} does not fit in memory_budget={self.nbytes} bytes: "
                f"{need} buffers of {padded(self.state_nbytes)} bytes{beside} are needed, it "
                f"holds {self.buffers}")


def slot_candidates(most: int) -> list[int]:
    """Level-1 slot counts worth pricing up to ``most``: 1, 2, 3, then about 1.5x apart."""
    found, value = set(), 1.0
    while value <= most:
        found.add(int(value))
        value = max(value + 1, value * 1.5)
    found.add(most)
    return sorted(c for c in found if c >= 1)


@dataclass(frozen=True)
class MemoryPlan:
    """How a checkpointer's memory is split between Level-1 slots, the transfer engine's
    buffers and the bounded DRAM tier of Level-2.

    ``budget`` bounds the memory Level-1 lives in (host memory, or a device's); ``host_states``
    is, for states on a device, how many Level-2 states ``host_memory_budget`` (or the default
    bound) leaves room for in page-locked host memory (None: unbounded); ``host_buffers``, on
    the host without a budget, how many state buffers the default bound holds for Level-1
    slots, the engine and DRAM Level-2 together (None: unbounded); ``default_bound``, the
    bytes of the default bound where it bounds the run (None: a budget given, or one the run
    cannot reach); ``staging_buffers``, the option (for messages); ``codec_buffers``, the
    state buffers the threads running a codec keep in host memory (:func:`codec_buffers`),
    set aside before the rest is split: out of ``memory_budget`` on the host, else out of
    ``host_memory_budget`` or the default bound."""

    nbytes: int
    n_timesteps: int | None
    taping: bool
    engine_buffers: int
    budget: Budget | None
    host_states: int | None
    on_host: bool
    host_buffers: int | None = None
    default_bound: int | None = None
    staging_buffers: int = DEFAULT_STAGING_BUFFERS
    codec_buffers: int = 0
    #: why ``compression="auto"`` runs no codec: its buffers leave Level-2 no room ("": it may)
    codec_declined: str = ""
    #: the ``ASYNCCKPT_*`` variables of the construction (the default bound's)
    environment: Environment = Environment()

    @classmethod
    def make(cls, nbytes: int, options: Any, *, on_host: bool, ranks: Any,
             default_storage: bool = False, resident_level2: bool = True) -> "MemoryPlan":
        """The plan for states of ``nbytes`` bytes under a checkpointer's ``options`` (an
        :class:`~asyncckpt._planning.options.Options`); with an MPI job's ``ranks`` every budget
        is the least of the ranks', so that all run one plan. ``default_storage``: Level-2 is in
        host memory, wholly or a tier (:func:`~asyncckpt.storage.in_host_memory`), which
        without a budget :func:`default_bound` bounds where a run could reach it.

        ``resident_level2``: Level-2 may keep states resident (None, a tier in host memory by
        name or a backend's or a tmpfs directory); where not and ``l1_slots`` is given without
        a budget, the slots and the engine's buffers bound what stays resident.

        A codec's :func:`codec_buffers` are set aside first, unless the run needs no Level-2
        without them (then no codec runs). Where they leave Level-2 no room beside the slots
        and the engine's buffers, ``compression="auto"`` is declined (``codec_declined`` says
        why, and a log line) and a codec asked for by name is refused naming the bytes."""
        made = dict(on_host=on_host, ranks=ranks, default_storage=default_storage,
                    resident_level2=resident_level2)
        plain = cls._make(nbytes, options, 0, **made)
        if options.codec is None:
            return plain
        return fit_codec(plain, options,
                         lambda codec: cls._make(nbytes, options, codec, **made))

    @classmethod
    def _make(cls, nbytes: int, options: Any, codec: int, *, on_host: bool, ranks: Any,
              default_storage: bool, resident_level2: bool) -> "MemoryPlan":
        """:meth:`make`'s plan with ``codec`` state buffers set aside."""
        memory_budget, host_memory_budget = options.memory_budget, options.host_memory_budget
        buffers = engine_buffers(options.staging_buffers, options.io_threads)
        budget = None
        if memory_budget is not None:
            budget = Budget(ranks.min(memory_budget), nbytes, buffers,
                            reserved=(codec * padded(nbytes) if on_host
                                      else DIGEST_WORD_BYTES * buffers))
        host_states = host_buffers = bound = None
        if host_memory_budget is not None:
            if on_host:
                raise InvalidValueError(
                    "host_memory_budget is for states on a device; u_0 is in host memory, "
                    "where memory_budget counts Level-1 and Level-2 DRAM together")
            host = ranks.min(host_memory_budget)
            host_states = host // padded(nbytes) - buffers - codec
            if host_states < 0:
                beside = f" and the codec's {codec}" if codec else ""
                raise MemoryBudgetError(
                    f"host_memory_budget={host} bytes cannot hold the {buffers} pinned "
                    f"staging and prefetch buffers{beside} of {padded(nbytes)} bytes")
        elif (budget is None or not on_host) and ranks.all(default_storage):
            # where every rank's is: one tier structure
            bound = ranks.min(default_bound(options.environment))
            held = bound // padded(nbytes) - codec
            # the most a run may hold in host memory: n states on Level-2 beside the buffers
            # (and on the host the slots); below the bound the DRAM tier needs no limit
            n, slots = options.n_timesteps, options.l1_slots if on_host else 0
            if n is None or n + buffers + min(slots or 0, n) > held:
                if on_host:
                    host_buffers = held
                else:
                    host_states = max(0, held - buffers)
            else:
                bound = None  # the run cannot reach it
        if on_host and budget is None and options.l1_slots is not None and not resident_level2:
            # l1_slots alone: what stays resident is the slots and the engine's buffers,
            # Level-2 goes where no resident memory is held (a DRAM tier of no room)
            n, slots = options.n_timesteps, options.l1_slots
            held = (slots if n is None else min(slots, n)) + buffers
            host_buffers = held if host_buffers is None else min(host_buffers, held)
        return cls(nbytes, options.n_timesteps, options.taping, buffers, budget, host_states,
                   on_host, host_buffers, bound, options.staging_buffers, codec,
                   environment=options.environment)

    def split(self, fixed_slots: int | None, interval: int | str) -> tuple[int, bool]:
        """Level-1 slots, and whether the run needs no Level-2 (``interval=0`` asks for none;
        otherwise every state the reverse sweep reads fits in Level-1, or the budget leaves no
        room for the transfer engine)."""
        n, budget = self.n_timesteps, self.budget
        alone = interval == 0  # Revolve in Level-1 alone: its slots, or the budget's
        guess = interval if isinstance(interval, int) else 10  # "auto" revises it every run
        if n is None:  # an online run needs Level-2: only n tells when Level-1 is enough
            if alone:
                raise InvalidValueError("interval=0 (Revolve in Level-1 alone) needs "
                                        "n_timesteps: a run of unknown length stores its "
                                        "states in Level-2")
            if budget is None:
                assert fixed_slots is not None
                self.check_default_bound(fixed_slots, True)
                return fixed_slots, False
            if budget.max_slots_with_level2 < 1:
                raise MemoryBudgetError(
                    f"memory_budget={budget.nbytes} bytes leaves no room for Level-2 beside "
                    f"{budget.engine_buffers} staging and prefetch buffers, which a run of "
                    "unknown length needs")
            if fixed_slots is not None:
                budget.check_slots(fixed_slots, True)
                return fixed_slots, False
            return max(1, min(guess, budget.max_slots_with_level2)), False
        needed = max(1, n - (1 if self.taping else 0))
        if budget is None:
            assert fixed_slots is not None
            level1_only = alone or fixed_slots >= needed
            self.check_default_bound(fixed_slots, not level1_only)
            return fixed_slots, level1_only
        if fixed_slots is not None:
            level1_only = alone or fixed_slots >= needed or budget.max_slots_with_level2 < 1
            budget.check_slots(fixed_slots, not level1_only)
            return fixed_slots, level1_only
        if alone or budget.buffers >= needed:
            return min(budget.buffers, needed), True
        if budget.max_slots_with_level2 < 1:
            return min(budget.buffers, n), True  # Revolve in the budget's slots alone
        return max(1, min(guess, budget.max_slots_with_level2)), False

    def host_room(self) -> int:
        """Bytes of host memory the run may hold: the budget, else the default bound (as the
        construction's environment sets it)."""
        return self.budget.nbytes if self.budget is not None else default_bound(self.environment)

    def check_default_bound(self, l1_slots: int, level2: bool) -> None:
        """Raise unless ``l1_slots`` slots (with ``level2``, beside the engine's staging and
        prefetch buffers) fit in the default bound, where it bounds host memory: the bound
        is the account without a budget, whatever the options ask for."""
        if self.budget is not None or self.host_buffers is None:
            return
        used = l1_slots if self.n_timesteps is None else min(l1_slots, self.n_timesteps)
        need = used + (self.engine_buffers if level2 else 0)
        if need <= self.host_buffers:
            return
        size = padded(self.nbytes)
        beside = (f" and staging_buffers={self.staging_buffers} ({self.engine_buffers} staging "
                  f"and prefetch buffers in all)" if level2 else "")
        raise MemoryBudgetError(
            f"l1_slots={l1_slots}{beside} need {need} buffers of {size} bytes ({need * size} "
            f"bytes), but without memory_budget host memory holds at most the default bound of "
            f"{self.default_bound} bytes ({bound_source(self.environment)}), {self.host_buffers} "
            "buffers: give "
            "memory_budget, fewer slots or staging buffers, or storage on a disk")

    @property
    def bound_buffers(self) -> int | None:
        """State buffers the memory Level-1 lives in may hold: the budget's, or on the host
        without one the default bound's (None: unbounded)."""
        return self.budget.buffers if self.budget is not None else self.host_buffers

    def bounds_level2(self, in_level1: bool) -> bool:
        """Whether a budget (or the default bound) limits what Level-2 keeps in process memory:
        on the host ``memory_budget``, on a device ``host_memory_budget``."""
        bound = self.bound_buffers if self.on_host else self.host_states
        return bound is not None and not in_level1

    def dram_states(self, l1_slots: int) -> int:
        """States the bounded DRAM tier of Level-2 holds beside ``l1_slots`` slots."""
        if self.host_states is not None:
            return self.host_states
        if self.budget is None:
            assert self.host_buffers is not None
            return max(0, self.host_buffers - self.engine_buffers - l1_slots)
        return self.budget.dram_states(l1_slots)

    def l1_bytes(self, l1_slots: int, in_level1: bool) -> int:
        """Bytes of Level-1 memory: the slots a run can use and, with Level-2, the engine's
        buffers (each padded to whole pages)."""
        used = l1_slots if self.n_timesteps is None else min(l1_slots, self.n_timesteps)
        return (used + (0 if in_level1 else self.engine_buffers)) * padded(self.nbytes)

