"""Timing the user's operators: a least-squares fit of a forward call's fixed and per-step
costs (:class:`CallFit`), and the timers that feed it during a sweep, by the clock on the host
(:class:`HostTimer`) or by events on a device's compute stream (:class:`DeviceTimer`)."""
from __future__ import annotations

import time
from dataclasses import dataclass, field
from collections.abc import Callable
from typing import Any

from ..devices import Device, Event
from ..stats import Stats

__all__ = ["CallFit", "HostTimer", "DeviceTimer", "RUN_DECAY"]

#: What the runs before the last weigh in the compute costs (a pooled fit's calls, the means of
#: a reverse call's and a copy's cost), each run half the next: a step's cost moves from one
#: gradient to the next, so the last run alone mispredicts the next by as much (docs/model.md).
RUN_DECAY = 0.5


@dataclass
class CallFit:
    """Least-squares fit of ``seconds = tcall + steps * tf`` over forward calls (weighted: see
    :meth:`pooled`)."""

    calls: float = 0.0
    steps: float = 0.0
    steps2: float = 0.0
    seconds: float = 0.0
    cross: float = 0.0
    lengths: set[int] = field(default_factory=set)
    #: where a run's second half begins (None: not split); ``halves`` holds the calls, steps
    #: and seconds of the calls that start before it and from it on
    midpoint: int | None = None
    halves: list[list[float]] = field(default_factory=lambda: [[0.0] * 3, [0.0] * 3])

    def add(self, steps: int, seconds: float, start: int | None = None) -> None:
        """Record one call of ``steps`` steps from u_``start`` that took ``seconds``."""
        self.calls += 1
        self.steps += steps
        self.steps2 += steps * steps
        self.seconds += seconds
        self.cross += steps * seconds
        if steps not in self.lengths and len(self.lengths) < 2:
            self.lengths.add(steps)
        if self.midpoint is not None and start is not None:
            half = self.halves[start >= self.midpoint]
            half[0] += 1
            half[1] += steps
            half[2] += seconds

    def drift(self, tcall: float) -> float | None:
        """A step's seconds in the run's second half over its first, each half's calls less
        ``tcall`` each (a half of shorter calls is no dearer per step for it: the cost of a
        call as known before the run, since a fit over a run whose step cost changed is no
        measure of it); None where a half has no calls or the run was not split."""
        (early_calls, early_steps, early_s), (late_calls, late_steps, late_s) = self.halves
        if not early_steps or not late_steps:
            return None
        early = (early_s - early_calls * tcall) / early_steps
        late = (late_s - late_calls * tcall) / late_steps
        return late / early if early > 0 and late > 0 else None

    def pooled(self, run: "CallFit") -> "CallFit":
        """This fit's calls, each weighing :data:`RUN_DECAY` of what it did, with ``run``'s."""
        return CallFit(RUN_DECAY * self.calls + run.calls, RUN_DECAY * self.steps + run.steps,
                       RUN_DECAY * self.steps2 + run.steps2,
                       RUN_DECAY * self.seconds + run.seconds, RUN_DECAY * self.cross + run.cross,
                       set(sorted(self.lengths | run.lengths)[:2]))

    def fit(self) -> tuple[float, float] | None:
        """(tcall, tf), or None when every call had the same length (no way to tell them apart).

        tcall is clamped at 0 and tf kept positive: noise must not make a call cost negative."""
        if len(self.lengths) < 2:
            return None
        n, sx, sxx, sy, sxy = self.calls, self.steps, self.steps2, self.seconds, self.cross
        denominator = n * sxx - sx * sx
        if denominator <= 0:
            return None
        tf = (n * sxy - sx * sy) / denominator
        tcall = (sy - tf * sx) / n
        if tf <= 0 or tcall < 0:
            return 0.0, max(sy / sx, 1e-9)
        return tcall, tf



class HostTimer:
    """Times operator calls by the clock, at once."""

    __slots__ = ("stats", "fit")

    def __init__(self, stats: Stats, fit: CallFit) -> None:
        self.stats, self.fit = stats, fit

    #: A mark that :meth:`end` measures a call from: the clock itself, called for every
    #: operator call with no Python frame of its own.
    begin: Callable[[], Any] = staticmethod(time.perf_counter)

    def end(self, mark: Any, steps: int, start: int | None = None) -> None:
        """A forward call of ``steps`` steps from u_``start`` (0 steps: a reverse step) that
        began at ``mark``."""
        elapsed = time.perf_counter() - mark
        if steps:  # :meth:`add`, unrolled: it runs for every call of a sweep
            self.stats.forward_compute_s += elapsed
            self.fit.add(steps, elapsed, start)
        else:
            self.stats.reverse_compute_s += elapsed

    def add(self, elapsed: float, steps: int, start: int | None = None) -> None:
        if steps:
            self.stats.forward_compute_s += elapsed
            self.fit.add(steps, elapsed, start)
        else:
            self.stats.reverse_compute_s += elapsed

    def settle(self) -> None:
        """Nothing is pending on the host."""


class DeviceTimer(HostTimer):
    """Times operator calls by events on the compute stream, counted once they have run."""

    __slots__ = ("device", "_pending")

    def __init__(self, stats: Stats, fit: CallFit, device: Device) -> None:
        super().__init__(stats, fit)
        self.device = device
        self._pending: list[tuple[Event, Event, int, int | None]] = []

    def begin(self) -> Any:
        return self.device.current_stream().record()

    def end(self, mark: Any, steps: int, start: int | None = None) -> None:
        self._pending.append((mark, self.device.current_stream().record(), steps, start))
        self._count(wait=False)

    def _count(self, wait: bool) -> None:
        if wait:  # one wait: the stream runs in order, so the last event is the last to fire
            self._pending[-1][1].synchronize()
        done = 0
        for begun, end, steps, start in self._pending:
            if not wait and not end.query():
                break
            self.add(self.device.elapsed(begun, end), steps, start)
            done += 1
        del self._pending[:done]

    def settle(self) -> None:
        """Wait for the compute stream and count every call (the end of a sweep)."""
        if self._pending:
            self._count(wait=True)
        else:
            self.device.current_stream().synchronize()
