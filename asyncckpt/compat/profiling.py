"""pyrevolve's profiler: milliseconds and counts per (section, action), as the ``profiler``
argument of every revolver and storage in :mod:`asyncckpt.compat` fills it."""
from __future__ import annotations

import time
from typing import Any

__all__ = ["Profiler", "Timer"]


class Timer:
    """A context manager adding its elapsed milliseconds to ``profiler`` under
    (``section``, ``action``)."""

    def __init__(self, profiler: "Profiler", section: str, action: str) -> None:
        self.profiler, self.section, self.action = profiler, section, action
        self.elapsed = 0.0

    def __enter__(self) -> "Timer":
        self._start = time.perf_counter()
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.elapsed = 1000 * (time.perf_counter() - self._start)
        self.profiler.increment(self.section, self.action, self.elapsed)


class Profiler:
    """``timings[section][action]`` in milliseconds and ``counts[section][action]``."""

    def __init__(self) -> None:
        self.timings: dict[str, dict[str, float]] = {}
        self.counts: dict[str, dict[str, int]] = {}

    def get_timer(self, section: str, action: str) -> Timer:
        """A timer that adds its elapsed time to (``section``, ``action``) when its block ends.

        Parameters
        ----------
        section, action : str
            The keys of ``timings`` and ``counts`` it adds to.

        Returns
        -------
        Timer
            A context manager; its ``elapsed`` holds the block's milliseconds after it.
        """
        return Timer(self, section, action)

    def increment(self, section: str, action: str, elapsed: float) -> None:
        """Add ``elapsed`` milliseconds and one count to (``section``, ``action``).

        Parameters
        ----------
        section, action : str
            The keys of ``timings`` and ``counts``; made where they are new.
        elapsed : float
            Milliseconds.
        """
        timings = self.timings.setdefault(section, {})
        timings[action] = timings.get(action, 0.0) + elapsed
        counts = self.counts.setdefault(section, {})
        counts[action] = counts.get(action, 0) + 1

    def summary(self) -> str:
        """One line per section: each action's total milliseconds and count.

        Returns
        -------
        str
            ``"section: action 1.234 ms (n), ..."`` lines, in the order the sections were first
            timed.
        """
        lines = [f"{section}: " + ", ".join(
            f"{action} {ms:.3f} ms ({self.counts[section][action]})"
            for action, ms in actions.items()) for section, actions in self.timings.items()]
        return "\n".join(lines)

    def get_dict(self) -> dict[str, Any]:
        """The timings and counts flat, as pyrevolve's ``Profiler.get_dict`` gives them.

        Returns
        -------
        dict
            ``"{section}_{action}_timing"``: the milliseconds as a string of two decimals;
            ``"{section}_{action}_counts"``: the count.
        """
        result: dict[str, Any] = {}
        for section, actions in self.timings.items():
            for action, ms in actions.items():
                result[f"{section}_{action}_timing"] = f"{ms:.2f}"
                result[f"{section}_{action}_counts"] = self.counts[section][action]
        return result
