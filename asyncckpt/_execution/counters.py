"""What the transfer engine counts in a run, in one place that the run's meter reads."""
from __future__ import annotations

import threading
from dataclasses import dataclass, field, fields

__all__ = ["TransferCounters"]


@dataclass
class TransferCounters:
    """Counts and seconds of one run's Level-2 transfers. The I/O threads add their busy seconds
    through :meth:`busy` (under a lock); everything else is counted on the caller's thread."""

    writes: int = 0
    reads: int = 0
    bytes_written: int = 0
    bytes_read: int = 0
    #: seconds the caller waited for a free staging buffer, and for a prefetch to arrive
    write_stall_s: float = 0.0
    read_stall_s: float = 0.0
    #: seconds the I/O path spent writing and reading: the run's real tw and tr
    write_busy_s: float = 0.0
    read_busy_s: float = 0.0
    #: states on Level-2 (stored, not yet freed), and the most at once
    held: int = 0
    peak_held: int = 0
    #: transfers that failed and were survived (recompute policy)
    failures: int = 0
    #: staging copies and loads on the caller's thread, as they cost inside the run
    copies: int = 0
    copy_s: float = 0.0
    _lock: threading.Lock = field(default_factory=threading.Lock, repr=False, compare=False)

    def reset(self) -> None:
        """Zero the counts of one run (``held`` stays: states outlive a run's counts)."""
        with self._lock:
            for name in (f.name for f in fields(self)):
                if name not in ("_lock", "held"):
                    setattr(self, name, type(getattr(self, name))())

    def busy(self, write: bool, seconds: float) -> None:
        """Add an I/O thread's ``seconds`` of writing (``write``) or reading."""
        with self._lock:
            if write:
                self.write_busy_s += seconds
            else:
                self.read_busy_s += seconds

    def completed(self, in_flight: int) -> tuple[int, float]:
        """The writes completed (all but ``in_flight``) and their busy seconds in all."""
        with self._lock:
            return self.writes - in_flight, self.write_busy_s

    def stored(self, nbytes: int) -> None:
        """A write of ``nbytes`` bytes was handed over."""
        self.writes += 1
        self.bytes_written += nbytes
        self.held += 1
        if self.held > self.peak_held:
            self.peak_held = self.held
