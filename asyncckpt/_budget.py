"""``memory_budget=``: how many state buffers the host memory budget holds, and how they are split
between Level-1 slots, the transfer engine's buffers and the DRAM tier of Level-2."""
from __future__ import annotations

from dataclasses import dataclass

from ._buffers import padded
from .errors import InvalidValueError
from .storage import HostMemoryStorage, Storage, TieredStorage

__all__ = ["Budget", "dram_tier", "slot_candidates"]


@dataclass(frozen=True)
class Budget:
    """A host memory budget of ``nbytes`` for states of ``state_nbytes`` (each buffer padded to
    whole pages), with ``engine_buffers`` staging and prefetch buffers whenever Level-2 is used."""

    nbytes: int
    state_nbytes: int
    engine_buffers: int

    def __post_init__(self) -> None:
        if self.buffers < 1:
            raise InvalidValueError(
                f"memory_budget of {self.nbytes} bytes is too small for one state of "
                f"{self.state_nbytes} bytes ({padded(self.state_nbytes)} with its page padding)")

    @property
    def buffers(self) -> int:
        """State buffers the budget holds."""
        return self.nbytes // padded(self.state_nbytes)

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


def dram_tier(storage: Storage) -> int | None:
    """The index of the first in-process DRAM tier of a tiered Level-2 (the one the budget
    bounds), or None."""
    if isinstance(storage, TieredStorage):
        for index, tier in enumerate(storage.tiers):
            if isinstance(tier, HostMemoryStorage):
                return index
    return None


def slot_candidates(most: int) -> list[int]:
    """Level-1 slot counts worth pricing up to ``most``: 1, 2, 3, then about 1.5x apart."""
    found, value = set(), 1.0
    while value <= most:
        found.add(int(value))
        value = max(value + 1, value * 1.5)
    found.add(most)
    return sorted(c for c in found if c >= 1)
