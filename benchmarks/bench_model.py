"""Measured time / predicted time of the performance model, and ``interval="auto"`` against a
sweep of fixed intervals, printed as one JSON line per workload.

Two workloads, so that the chosen intervals differ: a small state with heavy compute (Level-2 in
DRAM) and a large state with light compute (Level-2 on disk). For each: store-all (every state in
preallocated RAM), Revolve (pyrevolve) and asyncckpt with ``interval="auto"``, measured and
predicted from costs measured in the same run (goal: every ratio within 0.9..1.1); and the auto
run's time over the best of a sweep of fixed intervals (goal <= 1.05).

Usage: python benchmarks/bench_model.py [--n 400] [--repeats 3] [--disk DIR]
"""
from __future__ import annotations

import argparse
import json
import statistics
import sys
import tempfile
from pathlib import Path

from threadpoolctl import threadpool_limits

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _common import Fwd, Rev, Workload, median_time, pyrevolve_runner, store_all  # noqa: E402
from _results import add_flag, record  # noqa: E402

from asyncckpt import AsyncCheckpointer  # noqa: E402
from asyncckpt._memory.buffers import touched  # noqa: E402
from asyncckpt._execution.link import HostLink, measure_copy  # noqa: E402
from schedules.model import Costs, predict_revolve, predict_store_all  # noqa: E402

WORKLOADS = {
    "small-state-heavy-compute": dict(mib=0.25, passes=160, storage=None),
    "large-state-light-compute": dict(mib=8.0, passes=1, storage="disk"),
}


def copy_time(w: Workload) -> float:
    """Seconds to copy one state: into several buffers in turn, cache-cold, as a run copies
    into many distinct ones."""
    return measure_copy(HostLink(), [w.state], [touched(w.state.nbytes) for _ in range(8)],
                        repeats=5)


def store_all_time(w: Workload, n: int, repeats: int) -> float:
    """Median seconds of store-all into preallocated RAM (freed on return)."""
    buffers = [touched(w.state.nbytes).view(w.state.dtype) for _ in range(n)]
    return statistics.median(
        [median_time(lambda: store_all(w, n, buffers), 1) for _ in range(repeats)])


def measure(name: str, mib: float, passes: int, storage: str | None, n: int, slots: int,
            repeats: int, disk: str) -> dict[str, object]:
    w = Workload(int(mib * 2**20), passes=passes)
    fwd, rev = Fwd(w), Rev(w)
    level2 = disk if storage == "disk" else None
    med = statistics.median
    tf = median_time(w.step, 21)
    tb = median_time(lambda: (w.step(), w.reverse_step()), 21)
    tc = copy_time(w)
    costs = Costs(tf=tf, tb=tb, tc=tc)
    out: dict[str, object] = {"workload": name, "state_mib": mib, "n": n, "l1_slots": slots,
                              "level2": storage or "dram", "tf_ms": round(tf * 1e3, 3),
                              "tb_ms": round(tb * 1e3, 3), "tc_ms": round(tc * 1e3, 3)}

    measured = store_all_time(w, n, repeats)
    out["store_all_measured_over_predicted"] = measured / predict_store_all(n, costs).total_s

    revolve = pyrevolve_runner(w, slots, n)
    measured = med([median_time(revolve, 1) for _ in range(repeats)])
    out["revolve_measured_over_predicted"] = measured / predict_revolve(n, slots, costs).total_s

    def run(ckp: AsyncCheckpointer) -> float:
        w.reset()
        ckp.apply_forward()
        ckp.apply_reverse()
        return ckp.stats.total_s

    with AsyncCheckpointer(w, fwd, rev, n, l1_slots=slots, storage=level2) as auto:
        run(auto)  # the first run calibrates tf on one step; later runs use the whole run's costs
        ratios, totals = [], []
        for _ in range(repeats):
            totals.append(run(auto))
            ratios.append(auto.stats.calibration["measured_over_predicted"])
        chosen = auto.stats.interval
        out["auto_interval"] = chosen
        out["auto_measured_over_predicted"] = med(ratios)
        out["auto_calibration"] = {k: (round(v * 1e3, 4) if k.endswith("_s") else v)
                                   for k, v in auto.stats.calibration.items()
                                   if k in ("tf_s", "tb_s", "tw_s", "tr_s", "tc_s")}
    auto_total = med(totals)
    sweep = {}
    for interval in sorted({1, 2, 3, 4, 6, 8, 12, 16, 24, 32, chosen} & set(range(1, n + 1))):
        with AsyncCheckpointer(w, fwd, rev, n, l1_slots=slots, interval=interval,
                               storage=level2) as fixed:
            run(fixed)  # warm: Level-2 buffers and files allocated once
            sweep[interval] = med([run(fixed) for _ in range(repeats)])
    best = min(sweep, key=sweep.get)
    out["sweep_s"] = {k: round(v, 3) for k, v in sweep.items()}
    out["best_fixed_interval"] = best
    out["auto_over_best_fixed"] = auto_total / sweep[best]
    return {k: (round(v, 4) if isinstance(v, float) else v) for k, v in out.items()}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--n", type=int, default=400)
    parser.add_argument("--slots", type=int, default=10)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--disk", default=None, help="directory on disk (default: a temporary "
                                                      "one under the current directory)")
    parser.add_argument("--workloads", nargs="+", choices=list(WORKLOADS), default=list(WORKLOADS))
    add_flag(parser)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(dir=args.disk or ".") as disk, \
            threadpool_limits(limits=1, user_api="blas"):
        for name in args.workloads:
            row = measure(name, n=args.n, slots=args.slots, repeats=args.repeats,
                          disk=disk, **WORKLOADS[name])
            print(json.dumps(row), flush=True)
            record("bench_model", row, ["workload", "state_mib", "n", "l1_slots"], args=args)


if __name__ == "__main__":
    main()
