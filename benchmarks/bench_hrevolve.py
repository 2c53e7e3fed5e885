"""H-Revolve schedule generation: ``schedules.HRevolve`` against pyrevolve's Python H-Revolve on
the same levels, printed as one JSON line per n.

For each n, the time to build the tables and generate every action (ours: ``simulate`` of the
schedule, which also validates it; pyrevolve: ``HRevolve`` built and ``next()`` called to
``TERMINATE``), medians of ``--repeats``, their ratio, and whether the makespans agree. Levels:
memory of 10 slots (write and read cost 1) over a disk of 100 (cost 5), step costs 1. pyrevolve
runs only for n <= ``--pyrevolve-max`` (its table takes minutes beyond a few thousand steps).
The first of our runs also compiles the table builder (numba); the median excludes it where
``--repeats`` >= 3.

Usage: python benchmarks/bench_hrevolve.py [--n 1000 10000] [--repeats 3] [--pyrevolve-max 1000]
"""
from __future__ import annotations

import argparse
import json
import sys
import time
import types
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _common import median_time  # noqa: E402
from _results import add_flag, record  # noqa: E402

from schedules import HRevolve, Level, simulate  # noqa: E402

LEVELS = [Level(10, 1.0, 1.0), Level(100, 5.0, 5.0)]


def pyrevolve_run(n: int) -> float | None:
    """pyrevolve's makespan for n after generating its whole schedule, or None without it."""
    try:
        from pyrevolve.schedulers import HRevolve as TheirHRevolve
        from pyrevolve.schedulers.base import Action, Architecture
    except ImportError:
        return None
    storages = [types.SimpleNamespace(wd=lv.write, rd=lv.read, nckp=lv.slots) for lv in LEVELS]
    scheduler = TheirHRevolve(n, n, Architecture(storages))
    while scheduler.next().type != Action.TERMINATE:
        pass
    return float(scheduler.makespan)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--n", type=int, nargs="+", default=[1000, 10000])
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--pyrevolve-max", type=int, default=1000)
    add_flag(parser)
    args = parser.parse_args()
    for n in args.n:
        # taping-free: a chain of n steps in the model, as pyrevolve's scheduler plans n
        start = time.perf_counter()
        ours = HRevolve(n, LEVELS, taping=False)
        simulate(ours)
        first = time.perf_counter() - start
        ours_s = median_time(lambda: simulate(HRevolve(n, LEVELS, taping=False)),
                             args.repeats - 1) \
            if args.repeats > 1 else first
        row = {"bench": "hrevolve", "n": n, "levels": [vars(lv) for lv in LEVELS],
               "ours_s": round(ours_s, 4), "ours_first_s": round(first, 4),
               "makespan": ours.makespan}
        if n <= args.pyrevolve_max:
            theirs: list[float | None] = []
            theirs_s = median_time(lambda: theirs.append(pyrevolve_run(n)), args.repeats)
            if theirs and theirs[0] is not None:
                row.update(pyrevolve_s=round(theirs_s, 4),
                           pyrevolve_over_ours=round(theirs_s / ours_s, 1),
                           pyrevolve_makespan=theirs[0],
                           makespans_equal=abs(theirs[0] - ours.makespan) < 1e-9)
        print(json.dumps(row), flush=True)
        record("bench_hrevolve", row, ["n", "levels"], args=args)


if __name__ == "__main__":
    main()
