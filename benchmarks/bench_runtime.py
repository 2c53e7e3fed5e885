"""Runtime ratios measured side by side in one run, printed as one JSON line.

- ``stream_over_bare_at_auto``: forward sweep with streaming at the interval ``interval="auto"``
  chose (least total time) / bare forward sweep; ``stream_over_bare_by_interval``: the same at
  intervals 1 to 16, and the smallest interval that keeps it within 5% (goal <= 1.05 at the
  interval tuned for the forward sweep).
- ``interval1_over_store_all``: forward+reverse with interval 1 on DRAM / store-all in RAM under the
  same protocol (goal <= 1.10).
- ``pyrevolve_over_asyncckpt``: pyrevolve Revolver with the same Level-1 slots / asyncckpt with
  ``interval="auto"``, n = 1500, s = 10 (goal >= 1.8).
- ``l2_write_over_raw``: Level-2 write throughput of the engine / raw memcpy (DRAM) or raw pwrite
  (file) of the same bytes measured in the same run (goal >= 0.8).

Usage: python benchmarks/bench_runtime.py [--mib 2] [--n 1500] [--repeats 3] [--storage dram|PATH]
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

import numpy as np
from threadpoolctl import threadpool_limits

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _common import (  # noqa: E402
    Fwd, Rev, Workload, median_time, pyrevolve_runner, store_all, touched)
from _results import add_flag, record  # noqa: E402

from asyncckpt import AsyncCheckpointer  # noqa: E402
from asyncckpt._memory.buffers import aligned_buffer  # noqa: E402


def asyncckpt_run(ckp: AsyncCheckpointer, w: Workload) -> None:
    w.reset()
    ckp.apply_forward()
    ckp.apply_reverse()


def raw_write_speed(storage: str, nbytes: int, count: int) -> float:
    """Bytes per second of the plainest write to the device: memcpy for DRAM, pwrite for a file."""
    src = aligned_buffer(nbytes)[:nbytes]
    if storage == "dram":
        dst = [touched(nbytes) for _ in range(count)]
        start = time.perf_counter()
        for d in dst:
            np.copyto(d, src)
        return count * nbytes / (time.perf_counter() - start)
    directory = tempfile.mkdtemp(dir=storage)
    path = os.path.join(directory, "raw.dat")
    flags = os.O_RDWR | os.O_CREAT | getattr(os, "O_DIRECT", 0)
    fd = os.open(path, flags, 0o600)
    try:
        os.posix_fallocate(fd, 0, count * nbytes)
        start = time.perf_counter()
        for i in range(count):
            os.pwrite(fd, src, i * nbytes)
        return count * nbytes / (time.perf_counter() - start)
    finally:
        os.close(fd)
        os.unlink(path)
        os.rmdir(directory)


def forward_sweep(ckp: AsyncCheckpointer, w: Workload) -> float:
    """Seconds of one forward sweep (the reverse sweep then runs, untimed, to end the run)."""
    w.reset()
    start = time.perf_counter()
    ckp.apply_forward()
    elapsed = time.perf_counter() - start
    ckp.apply_reverse()
    return elapsed


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--mib", type=float, default=2.0, help="state size in MiB (0.5 to 8)")
    parser.add_argument("--n", type=int, default=1500)
    parser.add_argument("--slots", type=int, default=10)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--storage", default="dram", help="dram, or a directory (tmpfs or disk)")
    parser.add_argument("--passes", type=int, default=12,
                        help="ufunc passes per step (12: about 2 ms at 2 MiB here)")
    parser.add_argument("--skip-pyrevolve", action="store_true")
    add_flag(parser)
    args = parser.parse_args()
    nbytes = int(args.mib * 2**20)
    n, slots, repeats = args.n, args.slots, args.repeats
    w = Workload(nbytes, passes=args.passes)
    fwd, rev = Fwd(w), Rev(w)
    storage = args.storage  # "dram" or a path, as the checkpointer reads it
    med = statistics.median
    out: dict[str, object] = {"state_mib": args.mib, "n": n, "l1_slots": slots,
                              "storage": args.storage, "repeats": repeats}

    with threadpool_limits(limits=1, user_api="blas"):
        # Level-2 throughput: a forward sweep of empty steps is write-bound
        raw = raw_write_speed(args.storage, nbytes, 64)
        empty = Workload(nbytes, passes=0)
        with AsyncCheckpointer(empty, Fwd(empty), Rev(empty), 64, l1_slots=1, interval=1,
                               storage=storage, transfers="background") as ckp:
            speeds = []
            empty.reset()
            ckp.apply_forward()  # warm-up: Level-2 allocated once, as raw's buffers are
            ckp.apply_reverse()
            for _ in range(repeats):
                empty.reset()
                start = time.perf_counter()
                ckp.apply_forward()
                ckp.drain()  # every write on the device
                speeds.append(64 * nbytes / (time.perf_counter() - start))
                ckp.apply_reverse()
        out.update(raw_write_gbs=raw / 1e9, engine_write_gbs=med(speeds) / 1e9,
                   l2_write_over_raw=med(speeds) / raw)

        bare = med([median_time(lambda: (w.reset(), fwd.apply(t_start=0, t_end=n)), 1)
                    for _ in range(repeats)])
        with AsyncCheckpointer(w, fwd, rev, n, l1_slots=slots, storage=storage) as auto:
            auto_totals = []
            for _ in range(repeats + 1):  # the first run calibrates tf; the rest use tf and tb
                w.reset()
                auto.apply_forward()
                auto.apply_reverse()
                auto_totals.append(auto.stats.total_s)
            chosen = auto.stats.interval
            calibration = auto.stats.calibration
            auto_forward = med([forward_sweep(auto, w) for _ in range(repeats)])
        out.update(auto_interval=chosen, tf_ms=calibration["tf_s"] * 1e3,
                   tb_ms=calibration["tb_s"] * 1e3, tw_ms=calibration["tw_s"] * 1e3,
                   tc_ms=calibration["tc_s"] * 1e3,
                   auto_measured_over_predicted=calibration.get("measured_over_predicted"),
                   stream_over_bare_at_auto=auto_forward / bare)
        # the forward sweep alone, at a sweep of intervals, each after a warm-up run
        stream = {}
        for interval in sorted({1, 2, 4, 8, 16} & set(range(1, n + 1))):
            with AsyncCheckpointer(w, fwd, rev, n, l1_slots=slots, interval=interval,
                                   storage=storage) as ckp:
                forward_sweep(ckp, w)
                stream[interval] = med([forward_sweep(ckp, w) for _ in range(repeats)]) / bare
        out["stream_over_bare_by_interval"] = {k: round(v, 4) for k, v in stream.items()}
        quiet = [k for k, v in stream.items() if v <= 1.05]
        out["smallest_interval_streaming_within_5pct"] = min(quiet) if quiet else None

        best_total = med(auto_totals[1:])
        if n * nbytes < 12 * 2**30:
            buffers = [touched(nbytes).view(np.float64) for _ in range(n)]
            with AsyncCheckpointer(w, fwd, rev, n, l1_slots=slots, interval=1,
                                   storage=storage) as every:
                pairs = [(median_time(lambda: asyncckpt_run(every, w), 1),
                          median_time(lambda: store_all(w, n, buffers), 1))
                         for _ in range(repeats)]
            del buffers
            out["interval1_over_store_all"] = med([a / b for a, b in pairs])
            out["store_all_s"] = med([b for _, b in pairs])
        if not args.skip_pyrevolve:
            pyrevolve_run = pyrevolve_runner(w, slots, n)
            out["pyrevolve_over_asyncckpt"] = med(
                [median_time(pyrevolve_run, 1) for _ in range(repeats)]) / best_total
    row = {k: (round(v, 4) if isinstance(v, float) else v) for k, v in out.items()}
    print(json.dumps(row))
    record("bench_runtime", row, ["state_mib", "n", "l1_slots", "storage"], args=args)


if __name__ == "__main__":
    main()
