"""Generation + validation time of Revolve schedules, printed as one JSON line.

Times ``simulate(Revolve(n, s))`` (which generates every action and checks every invariant) for
(n, s) = (10^5, 100) and (10^6, 100), medians of repetitions, and, where checkpoint_schedules is
installed, the ratio of its closed-form ``MultistageCheckpointSchedule`` (iterated to the end) on
the same (n, s) to ours. Goal: Revolve(10^5, 100) in under one second.

Usage: python benchmarks/bench_schedules.py [--repeats 3]
"""
from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _common import median_time  # noqa: E402
from _results import add_flag, record  # noqa: E402

from schedules import Revolve, simulate  # noqa: E402
from schedules.revolve import optimal_forward_steps  # noqa: E402


def checkpoint_schedules_time(n: int, s: int, repeats: int) -> float | None:
    try:
        from checkpoint_schedules import MultistageCheckpointSchedule, StorageType
    except ImportError:
        return None

    def run() -> None:
        schedule = MultistageCheckpointSchedule(n, s, 0)
        for action in schedule:
            if type(action).__name__ == "EndReverse":
                break
    del StorageType
    return median_time(run, repeats)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=3)
    add_flag(parser)
    args = parser.parse_args()
    out: dict[str, object] = {}
    for n, s in ((10**5, 100), (10**6, 100)):
        result = simulate(Revolve(n, s))
        assert result.forward_steps == optimal_forward_steps(n, s)
        repeats = args.repeats if n <= 10**5 else 1
        ours = median_time(lambda n=n, s=s: simulate(Revolve(n, s)), repeats)
        key = f"revolve_n{n}_s{s}"
        out[f"{key}_s"] = round(ours, 3)
        theirs = checkpoint_schedules_time(n, s, repeats)
        if theirs is not None:
            out[f"{key}_checkpoint_schedules_over_ours"] = round(theirs / ours, 2)
    print(json.dumps(out))
    record("bench_schedules", out, args=args)


if __name__ == "__main__":
    main()
