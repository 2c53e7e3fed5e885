"""The transfer engine's staging and prefetch buffers, held only by the runs that use Level-2."""
from __future__ import annotations

from typing import Any

from .link import Link

__all__ = ["EngineBuffers"]


class EngineBuffers:
    """The free staging buffers (a Level-2 write is staged in one) and prefetch buffers (a
    Level-2 read lands in one), made by the ``link``: ``staging`` and ``prefetch`` of them for
    a run that uses Level-2, none for Revolve in Level-1 alone, whose budget they would take.

    The lists are mutated in place, never replaced: the engine pops from them and returns to
    them."""

    def __init__(self, link: Link, nbytes: int, staging: int, prefetch: int) -> None:
        self.link, self.nbytes, self.counts = link, nbytes, (staging, prefetch)
        self.free_staging: list[Any] = []
        self.free_prefetch: list[Any] = []

    def equip(self) -> None:
        """Make every buffer missing: those never made, and those an interrupt or a stalled
        transfer took."""
        for free, count, make in ((self.free_staging, self.counts[0], self.link.staging_buffer),
                                  (self.free_prefetch, self.counts[1],
                                   self.link.prefetch_buffer)):
            free.extend(make(self.nbytes) for _ in range(count - len(free)))

    def release(self) -> None:
        """Let the free buffers go to the link (on the host, to the process pool)."""
        free = self.free_staging + self.free_prefetch
        self.free_staging.clear()  # first: an interrupt then loses a buffer, never shares one
        self.free_prefetch.clear()
        self.link.release(free)

    @property
    def free(self) -> int:
        """Buffers free now."""
        return len(self.free_staging) + len(self.free_prefetch)
