"""What the performance model prices with and what it returns: a run's unit costs, a
Level-2 tier's, a codec's, and a predicted run (docs/model.md).

Times are in seconds; :mod:`schedules.model` states what each cost means.
"""
from __future__ import annotations

import math
from dataclasses import dataclass, replace

from ._errors import InvalidValueError

__all__ = ["CodecCosts", "Costs", "Level2Tier", "Prediction"]


@dataclass(frozen=True, slots=True)
class Costs:
    """Measured or assumed unit costs, in seconds (``nbytes`` for reference only).

    ``tx`` is what each Level-2 transfer takes from the compute beside it while the I/O thread
    moves it (memory bandwidth, caches, the other core), paid on the main thread: a schedule
    that moves fewer states runs its steps and copies nearer their cost alone.

    ``slack`` is not a cost but what the state's arrays keep: the forward steps from u_t after
    which they still hold u_t (a ring of time levels with that many rows beyond a state's, as
    Devito's buffered fields have 1), so that loading u_t then copies nothing
    (:func:`schedules.revolve.loads_kept`). 0: every load copies.
    """

    tf: float
    tb: float
    tw: float = 0.0
    tr: float = 0.0
    tc: float = 0.0
    nbytes: int = 0
    tcall: float = 0.0
    tx: float = 0.0
    slack: int = 0

    def __post_init__(self) -> None:
        if not isinstance(self.slack, int) or isinstance(self.slack, bool) or self.slack < 0:
            raise InvalidValueError(f"Costs.slack must be an int >= 0 (forward steps after "
                                    f"which u_t's arrays still hold it), got {self.slack!r}")
        for name in ("tf", "tb", "tw", "tr", "tc", "tcall", "tx"):
            value = getattr(self, name)
            if not isinstance(value, (int, float)) or isinstance(value, bool) or not math.isfinite(value):
                raise InvalidValueError(f"Costs.{name} must be a finite number of seconds, got {value!r}")
            if value < 0:
                raise InvalidValueError(f"Costs.{name} must be >= 0, got {value!r}")
        if self.tf <= 0:
            raise InvalidValueError(f"Costs.tf must be > 0 (the time of one forward step), got {self.tf!r}")
        if self.tb < self.tf:
            raise InvalidValueError(f"Costs.tb includes the taping forward step, so it must be >= tf "
                             f"({self.tf!r}); got {self.tb!r}")

    def advance(self, steps: int) -> float:
        """Seconds of one forward call of ``steps`` steps."""
        return self.tcall + steps * self.tf

    @property
    def adjoint(self) -> float:
        """Seconds of one reverse call alone (its taping step not included)."""
        return self.tb - self.tf


@dataclass(frozen=True, slots=True)
class Prediction:
    """A predicted forward+reverse run."""

    strategy: str
    total_s: float
    forward_s: float
    reverse_s: float
    forward_steps: int
    write_stall_s: float = 0.0
    read_stall_s: float = 0.0


@dataclass(frozen=True, slots=True)
class Level2Tier:
    """One tier of a tiered Level-2, fastest first: ``capacity`` states at most (None: any
    number), each written in ``tw`` and read back in ``tr`` seconds. ``in_memory``: its states
    occupy the process's own memory (host DRAM), whose first touch a
    :class:`schedules.model.FirstTouch` prices."""

    capacity: int | None
    tw: float
    tr: float
    in_memory: bool = False


@dataclass(frozen=True, slots=True)
class CodecCosts:
    """What a codec in front of Level-2 costs per state: ``compress_s`` on the I/O thread before
    each write, ``decompress_s`` after each read, and ``stored``, the share of a state's bytes
    it stores (compressed size over size, at most 1; a mean over a run, whose states may
    compress unlike each other).

    A transfer's cost is taken to scale with the bytes it moves, so a write costs
    ``compress_s + stored * tw`` and a read ``stored * tr + decompress_s``, and a tier bounded
    by bytes holds ``capacity / stored`` states.
    """

    compress_s: float
    decompress_s: float
    stored: float

    def __post_init__(self) -> None:
        for name in ("compress_s", "decompress_s", "stored"):
            value = getattr(self, name)
            if (not isinstance(value, (int, float)) or isinstance(value, bool)
                    or not math.isfinite(value) or value < 0):
                raise InvalidValueError(f"CodecCosts.{name} must be a finite number >= 0, got "
                                        f"{value!r}")
        if not 0 < self.stored <= 1:
            raise InvalidValueError(f"CodecCosts.stored must be in (0, 1] (compressed size over "
                                    f"size), got {self.stored!r}")

    def write(self, tw: float) -> float:
        """Seconds to compress and write a state that takes ``tw`` to write uncompressed."""
        return self.compress_s + self.stored * tw

    def read(self, tr: float) -> float:
        """Seconds to read back and decompress a state that takes ``tr`` to read uncompressed."""
        return self.stored * tr + self.decompress_s

    def tier(self, tier: Level2Tier) -> Level2Tier:
        """``tier`` holding compressed states."""
        capacity = None if tier.capacity is None else int(tier.capacity / self.stored)
        return replace(tier, capacity=capacity, tw=self.write(tier.tw), tr=self.read(tier.tr))
