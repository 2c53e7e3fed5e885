"""A memory budget against unlimited DRAM, measured side by side, printed as one JSON line.

- ``budget_over_unlimited``: forward+reverse time with ``memory_budget`` = 10% of the run's
  states and Level-2 tiers ``["dram", DISK]``, over the same run with ``l1_slots`` slots and
  Level-2 in unlimited DRAM, both with ``interval="auto"`` (goal <= 1.10 where the disk keeps up
  with the forward sweep).
- ``budget_dram_share``: of the budgeted run's Level-2 writes, the share the DRAM tier took.

Each checkpointer is built once and run ``repeats + 1`` times, interleaved (the first run of
each calibrates); medians of the rest.

Usage: python benchmarks/bench_budget.py [--mib 2] [--n 400] [--passes 12] [--disk DIR]
"""
from __future__ import annotations

import argparse
import json
import statistics
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _common import Fwd, Rev, Workload  # noqa: E402
from _results import add_flag, record  # noqa: E402

from asyncckpt import AsyncCheckpointer  # noqa: E402
from asyncckpt._memory.buffers import padded  # noqa: E402


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--mib", type=float, default=2.0, help="state size in MiB (default 2)")
    parser.add_argument("--n", type=int, default=400, help="time steps (default 400)")
    parser.add_argument("--slots", type=int, default=10,
                        help="Level-1 slots of the unlimited run (default 10)")
    parser.add_argument("--passes", type=int, default=12,
                        help="ufunc passes per step (12: about 2 ms at 2 MiB here)")
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--disk", default=None,
                        help="directory on the disk for the second tier (default: the temporary "
                             "directory)")
    add_flag(parser)
    args = parser.parse_args()
    nbytes = int(args.mib * 2**20)
    n, repeats = args.n, args.repeats
    budget = max(1, n // 10) * padded(nbytes)
    disk = args.disk or tempfile.gettempdir()
    w = Workload(nbytes, passes=args.passes)
    fwd, rev = Fwd(w), Rev(w)
    times: dict[str, list[float]] = {"unlimited": [], "budget": []}
    with AsyncCheckpointer(w, fwd, rev, n, l1_slots=args.slots, storage=None) as unlimited, \
            AsyncCheckpointer(w, fwd, rev, n, memory_budget=budget,
                              storage=["dram", disk]) as budgeted:
        for run in range(repeats + 1):
            for name, ckp in (("unlimited", unlimited), ("budget", budgeted)):
                w.reset()
                ckp.apply_forward()
                ckp.apply_reverse()
                if run:
                    times[name].append(ckp.stats.total_s)
        writes = budgeted.storage.writes  # type: ignore[attr-defined]
        out = {
            "state_mib": args.mib, "n": n, "passes": args.passes, "repeats": repeats,
            "budget_mib": round(budget / 2**20, 1), "disk": disk,
            "unlimited_interval": unlimited.stats.interval,
            "budget_interval": budgeted.stats.interval,
            "budget_l1_slots": budgeted.l1_slots,
            "budget_dram_share": round(writes[0] / max(1, sum(writes)), 3),
            "unlimited_s": round(statistics.median(times["unlimited"]), 4),
            "budget_s": round(statistics.median(times["budget"]), 4),
        }
        out["budget_over_unlimited"] = round(out["budget_s"] / out["unlimited_s"], 3)
    print(json.dumps(out))
    record("bench_budget", out, ["state_mib", "n", "passes", "budget_mib"], args=args)
    return 0


if __name__ == "__main__":
    sys.exit(main())
