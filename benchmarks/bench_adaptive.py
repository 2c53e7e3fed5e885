"""``interval="adaptive"`` against fixed intervals, and runs of unknown length against n known,
measured side by side and printed as one JSON line.

Scenarios (each checkpointer built once and run ``repeats + 1`` times, interleaved; the first
run of each calibrates; medians of the rest):

- ``steady``: ``adaptive_over_auto``, adaptive over ``interval="auto"`` (goal <= 1.05).
- ``compute_speeds_up``: steps cost ``passes`` ufunc passes for the first half of the run and a
  quarter of that after: a Level-2 write then spans four times as many steps.
  ``adaptive_over_best_fixed``: adaptive over the fastest of a sweep of fixed intervals
  (goal <= 1.05).
- ``device_slows_down``: Level-2 writes and reads of the second half's states each take
  ``--slow-ms`` more (a device slowing down, or a neighbour taking its bandwidth).
  ``adaptive_over_best_fixed`` as above.
- ``compute_slows_down``: a device that takes ``--device-ms`` per transfer throughout, and
  steps that cost ``--rise`` times as much from halfway on (the interval that suited the first
  half stores too rarely in the second).
- ``device_slows_10x``: that device, ``--slowdown`` times slower from halfway on.
- ``online``: ``n_timesteps=None`` with ``stop`` at u_n, over the same checkpointer with n known
  (both with the default "auto", which means "adaptive" for an unknown n; goal <= 1.10).

Usage: python benchmarks/bench_adaptive.py [--mib 1] [--n 300] [--passes 8] [--slots 8]
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _common import Rev, Workload  # noqa: E402
from _results import add_flag, record  # noqa: E402

from asyncckpt import AsyncCheckpointer, FileStorage  # noqa: E402

FIXED = (1, 2, 4, 8, 16, 32)


class ChangingForward:
    """The workload's forward step, with ``later`` passes from step ``switch`` on."""

    def __init__(self, w: Workload, switch: int, later: int) -> None:
        self.w, self.switch, self.later = w, switch, later
        self.first = w.passes

    def apply(self, *, t_start: int, t_end: int) -> None:
        w = self.w
        for t in range(t_start, t_end):
            w.passes = self.first if t < self.switch else self.later
            w.step()
        w.passes = self.first


class SlowingFile(FileStorage):
    """A file Level-2 whose transfers take ``before`` seconds more for states before ``switch``
    and ``delay`` seconds more from it on (sleeping, as a device that is busy does: the caller's
    thread runs on)."""

    def __init__(self, path: str, *, switch: int, delay: float, before: float = 0.0) -> None:
        super().__init__(path)
        self.switch, self.delay, self.before = switch, delay, before

    def _wait(self, key: int) -> None:
        extra = self.delay if key >= self.switch else self.before
        if extra:
            time.sleep(extra)

    def put(self, key: int, buf: np.ndarray) -> None:
        self._wait(key)
        super().put(key, buf)

    def get(self, key: int, out: np.ndarray) -> None:
        self._wait(key)
        super().get(key, out)


def run(checkpointers: dict[str, AsyncCheckpointer], w: Workload, repeats: int,
        stop: dict[str, Any]) -> dict[str, float]:
    """Median forward+reverse seconds of each checkpointer, runs interleaved."""
    times: dict[str, list[float]] = {name: [] for name in checkpointers}
    for attempt in range(repeats + 1):
        for name, ckp in checkpointers.items():
            w.reset()
            start = time.perf_counter()
            ckp.apply_forward(**stop.get(name, {}))
            ckp.apply_reverse()
            if attempt:
                times[name].append(time.perf_counter() - start)
    return {name: statistics.median(t) for name, t in times.items()}


def sweep(make_forward, storage_for, w: Workload, n: int, slots: int,
          repeats: int) -> dict[str, Any]:
    """Adaptive, "auto" and each fixed interval on one scenario."""
    configs: dict[str, int | str] = {"adaptive": "adaptive", "auto": "auto"}
    configs.update({f"I={i}": i for i in FIXED if i <= n})
    checkpointers: dict[str, AsyncCheckpointer] = {}
    opened: list[FileStorage] = []
    try:
        for name, interval in configs.items():
            storage = storage_for()
            if isinstance(storage, FileStorage):
                opened.append(storage)
            checkpointers[name] = AsyncCheckpointer(
                w, make_forward(), Rev(w), n, l1_slots=slots, interval=interval,
                storage=storage, transfers="background")
        medians = run(checkpointers, w, repeats, {})
        adaptive = checkpointers["adaptive"].stats
        auto = checkpointers["auto"].stats
    finally:
        for ckp in checkpointers.values():
            ckp.close()
        for storage in opened:
            storage.close()
    fixed = {k: v for k, v in medians.items() if k.startswith("I=")}
    best = min(fixed, key=fixed.__getitem__)
    return {
        "adaptive_over_auto": medians["adaptive"] / medians["auto"],
        "adaptive_over_best_fixed": medians["adaptive"] / fixed[best],
        "best_fixed": best,
        "auto_interval": auto.interval,
        "adaptive_least_interval": adaptive.interval,
        "adaptive_mean_interval": round(adaptive.mean_interval, 2),
        "adaptive_measured_over_predicted": adaptive.calibration.get("measured_over_predicted"),
        "seconds": {k: round(v, 4) for k, v in medians.items()},
    }


CONFIG = ("state_mib", "n", "slots", "passes")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--mib", type=float, default=1.0, help="state size in MiB (default 1)")
    parser.add_argument("--n", type=int, default=300, help="time steps (default 300)")
    parser.add_argument("--passes", type=int, default=8,
                        help="ufunc passes per step (8: about 0.6 ms at 1 MiB here)")
    parser.add_argument("--slots", type=int, default=8, help="Level-1 slots (default 8)")
    parser.add_argument("--slow-ms", type=float, default=3.0,
                        help="extra ms per Level-2 transfer once the device slows (default 3)")
    parser.add_argument("--device-ms", type=float, default=2.5,
                        help="ms per Level-2 transfer of the slow device (default 2.5)")
    parser.add_argument("--rise", type=float, default=6.0,
                        help="how many times a step costs more from halfway on (default 6)")
    parser.add_argument("--slowdown", type=float, default=10.0,
                        help="how many times slower the slow device gets halfway (default 10)")
    parser.add_argument("--only", nargs="*", default=None,
                        help="run only these scenarios (default: all)")
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--dir", default=tempfile.gettempdir(),
                        help="directory for the file Level-2 (default: the temporary directory)")
    add_flag(parser)
    args = parser.parse_args()
    nbytes = int(args.mib * 2**20)
    n, slots, repeats = args.n, args.slots, args.repeats
    w = Workload(nbytes, passes=args.passes)
    half = n // 2
    results: dict[str, Any] = {"state_mib": args.mib, "n": n, "slots": slots,
                               "passes": args.passes, "cpus": os.cpu_count()}
    device_s = args.device_ms / 1e3
    scenarios = {
        "steady": (lambda: ChangingForward(w, n, args.passes), lambda: args.dir),
        "compute_speeds_up": (lambda: ChangingForward(w, half, max(1, args.passes // 4)),
                              lambda: args.dir),
        "device_slows_down": (lambda: ChangingForward(w, n, args.passes),
                              lambda: SlowingFile(args.dir, switch=half,
                                                  delay=args.slow_ms / 1e3)),
        "compute_slows_down": (
            lambda: ChangingForward(w, half, max(1, round(args.passes * args.rise))),
            lambda: SlowingFile(args.dir, switch=half, delay=device_s, before=device_s)),
        "device_slows_10x": (
            lambda: ChangingForward(w, n, args.passes),
            lambda: SlowingFile(args.dir, switch=half, delay=device_s * args.slowdown,
                                before=device_s)),
    }
    for name, (make_forward, storage_for) in scenarios.items():
        if args.only is None or name in args.only:
            results[name] = sweep(make_forward, storage_for, w, n, slots, repeats)
    if args.only is not None and "online" not in args.only:
        print(json.dumps(results))
        record("bench_adaptive", results, CONFIG, args=args)
        return 0
    with AsyncCheckpointer(w, ChangingForward(w, n, args.passes), Rev(w), n, l1_slots=slots,
                           storage=args.dir) as known, \
            AsyncCheckpointer(w, ChangingForward(w, n, args.passes), Rev(w), None,
                              l1_slots=slots, storage=args.dir) as online:
        medians = run({"known": known, "online": online}, w, repeats,
                      {"online": {"stop": lambda t: t >= n}})
        results["online"] = {"online_over_known": medians["online"] / medians["known"],
                             "known_interval": known.stats.interval,
                             "online_mean_interval": round(online.stats.mean_interval, 2),
                             "seconds": {k: round(v, 4) for k, v in medians.items()}}
    print(json.dumps(results))
    record("bench_adaptive", results, CONFIG, args=args)
    return 0


if __name__ == "__main__":
    sys.exit(main())
