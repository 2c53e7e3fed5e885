"""pyrevolve.Revolver against asyncckpt.compat.Revolver on the same user objects, one JSON line.

n = 2000 steps of a 2 MiB state with the same Level-1 budget (10 slots): the time ratio
pyrevolve / asyncckpt.compat (medians of repetitions, interleaved; goal >= 1.8), the forward-step
counts of both, and whether their adjoints are equal bit for bit. asyncckpt also streams states
to the Level-2 that ``--level2`` names (a directory: the same memory as pyrevolve's; "dram", the
default: memory beside the slots, so the two do not hold the same bytes).

Usage: python benchmarks/bench_compat.py [--n 2000] [--mib 2] [--slots 10] [--repeats 3]
       [--level2 dram|DIR]
"""
from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from pathlib import Path

import numpy as np
from threadpoolctl import threadpool_limits

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _common import Rev, Workload  # noqa: E402
from _results import add_flag, record  # noqa: E402

from asyncckpt.compat import Revolver  # noqa: E402


class CountingForward:
    def __init__(self, w: Workload) -> None:
        self.w, self.steps = w, 0

    def apply(self, *, t_start: int, t_end: int) -> None:
        self.steps += t_end - t_start
        for _ in range(t_start, t_end):
            self.w.step()


LAST_STATS: dict[str, object] = {}


def run(revolver_class, w: Workload, n: int, slots: int,
        **options: object) -> tuple[float, int, bytes]:
    w.reset()
    fwd = CountingForward(w)
    start = time.perf_counter()
    revolver = revolver_class(w, fwd, Rev(w), slots, n, **options)
    revolver.apply_forward()
    revolver.apply_reverse()
    elapsed = time.perf_counter() - start
    if hasattr(revolver, "close"):
        stats = revolver.stats
        LAST_STATS.update(interval=stats.interval, write_stall_s=round(stats.write_stall_s, 3),
                          read_stall_s=round(stats.read_stall_s, 3),
                          write_busy_s=round(stats.write_busy_s, 3),
                          forward_s=round(stats.forward_s, 3), reverse_s=round(stats.reverse_s, 3))
        revolver.close()
    return elapsed, fwd.steps, w.adjoint.tobytes()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--n", type=int, default=2000)
    parser.add_argument("--mib", type=float, default=2.0)
    parser.add_argument("--slots", type=int, default=10)
    parser.add_argument("--passes", type=int, default=12)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--level2", default="dram",
                        help="asyncckpt's Level-2: dram (beside the slots) or a directory")
    add_flag(parser)
    args = parser.parse_args()
    import pyrevolve

    w = Workload(int(args.mib * 2**20), passes=args.passes)
    theirs, ours = [], []
    with threadpool_limits(limits=1, user_api="blas"):
        for _ in range(args.repeats):
            t_theirs, steps_theirs, adj_theirs = run(pyrevolve.Revolver, w, args.n, args.slots)
            # naming Level-2 makes compat's Revolver asynchronous (without, it is pyrevolve's)
            t_ours, steps_ours, adj_ours = run(Revolver, w, args.n, args.slots,
                                               storage=args.level2)
            theirs.append(t_theirs)
            ours.append(t_ours)
    row = {
        "n": args.n, "state_mib": args.mib, "slots": args.slots, "repeats": args.repeats,
        "level2": args.level2,
        "pyrevolve_s": round(statistics.median(theirs), 3),
        "asyncckpt_compat_s": round(statistics.median(ours), 3),
        "pyrevolve_over_asyncckpt": round(statistics.median(theirs) / statistics.median(ours), 3),
        "pyrevolve_forward_steps": steps_theirs, "asyncckpt_forward_steps": steps_ours,
        "adjoints_equal": adj_theirs == adj_ours and bool(np.isfinite(w.adjoint).all()),
        "asyncckpt_last_run": LAST_STATS,
    }
    print(json.dumps(row))
    record("bench_compat", row, ["n", "state_mib", "slots", "level2"], args=args)


if __name__ == "__main__":
    main()
