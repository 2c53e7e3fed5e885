"""How long "auto" takes to choose a run's plan, against the run's length n, as one JSON line.

Each n gets a fresh checkpointer over 800-byte states (one 4 KiB page each) with
``interval="auto"`` and a memory budget too small for every state (default 256 KiB, and 1 GiB,
which holds n = 2e5 and no more): its first ``apply_forward()`` probes the forward operator,
chooses the plan, and is stopped at its first step after the probe. The figure is
``stats.calibration["planning_s"]``, the time the choice took (the probe and Level-1's
allocation not included), the median of ``--repeats`` processes' worth of checkpointers.
Goal: at most a few milliseconds more at n = 1e9 than at n = 1e3.

Usage: python benchmarks/bench_planning.py [--budgets 256KiB,1GiB] [--repeats 3]
"""
from __future__ import annotations

import argparse
import json
import statistics
import sys
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _results import add_flag, record  # noqa: E402

from asyncckpt import ArrayCheckpoint, AsyncCheckpointer  # noqa: E402

LENGTHS = (10**3, 10**4, 10**5, 10**6, 10**7, 10**8, 10**9)


class _Stop(Exception):
    """Ends the forward sweep at its first step after the probe."""


class _Forward:
    def __init__(self, state: np.ndarray) -> None:
        self.state, self.calls = state, 0

    def apply(self, *, t_start: int, t_end: int) -> None:
        self.calls += 1
        if self.calls > 3:  # the probe's calls are the first three
            raise _Stop
        self.state += 1e-3


class _Reverse:
    def apply(self, *, t_start: int, t_end: int) -> None:
        pass


def planning_s(n: int, budget: str) -> float | None:
    """Seconds "auto" took to choose the plan of a run of ``n`` steps (None: it chose none,
    every state fitting in Level-1)."""
    state = np.zeros(100)
    with AsyncCheckpointer(ArrayCheckpoint([state]), _Forward(state), _Reverse(), n,
                           memory_budget=budget, interval="auto") as ckp:
        try:
            ckp.apply_forward()
        except _Stop:
            pass
        return ckp.stats.calibration.get("planning_s")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--budgets", default="256KiB,1GiB")
    parser.add_argument("--repeats", type=int, default=3)
    add_flag(parser)
    args = parser.parse_args()
    out: dict[str, object] = {}
    for budget in args.budgets.split(","):
        for n in LENGTHS:
            seen = [planning_s(n, budget) for _ in range(args.repeats)]
            if None in seen:
                out[f"{budget}_n{n:.0e}_ms"] = None  # every state in Level-1: nothing chosen
                continue
            out[f"{budget}_n{n:.0e}_ms"] = round(1e3 * statistics.median(seen), 1)
    print(json.dumps(out))
    record("bench_planning", out, args=args)


if __name__ == "__main__":
    main()
