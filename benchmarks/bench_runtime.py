"""Runtime ratios measured side by side in one run, printed as one JSON line.

- ``stream_over_bare``: forward sweep with streaming at the tuned interval / bare forward sweep
  (goal <= 1.05).
- ``interval1_over_store_all``: forward+reverse with interval 1 on DRAM / store-all in RAM under the
  same protocol (goal <= 1.10).
- ``pyrevolve_over_asyncckpt``: pyrevolve Revolver with the same Level-1 slots / asyncckpt at its
  best interval, n = 1500, s = 10 (goal >= 1.8).
- ``l2_write_over_raw``: Level-2 write throughput of the engine / raw memcpy (DRAM) or raw pwrite
  (file) of the same bytes measured in the same run (goal >= 0.8).

Usage: python benchmarks/bench_runtime.py [--mib 4] [--n 1500] [--repeats 5] [--storage dram|PATH]
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
from _common import Fwd, Rev, Workload, median_time, touched  # noqa: E402

from asyncckpt import AsyncCheckpointer  # noqa: E402
from asyncckpt._buffers import aligned_buffer  # noqa: E402
from schedules.model import Costs, choose_interval  # noqa: E402


def store_all(w: Workload, n: int, buffers: list[np.ndarray]) -> None:
    """Store every state in preallocated RAM, then reverse under the pyrevolve protocol."""
    w.reset()
    for t in range(n):
        np.copyto(buffers[t], w.state)
        w.step()
    w.reverse_step()
    for t in range(n - 2, -1, -1):
        np.copyto(w.state, buffers[t])
        w.step()
        w.reverse_step()


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


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--mib", type=float, default=4.0, help="state size in MiB (0.5 to 8)")
    parser.add_argument("--n", type=int, default=1500)
    parser.add_argument("--slots", type=int, default=10)
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--storage", default="dram", help="dram, or a directory (tmpfs or disk)")
    parser.add_argument("--skip-pyrevolve", action="store_true")
    args = parser.parse_args()
    nbytes = int(args.mib * 2**20)
    n = args.n
    w = Workload(nbytes)
    fwd, rev = Fwd(w), Rev(w)
    storage = None if args.storage == "dram" else args.storage
    out: dict[str, object] = {"state_mib": args.mib, "n": n, "l1_slots": args.slots,
                              "storage": args.storage, "repeats": args.repeats}

    with threadpool_limits(limits=1, user_api="blas"):
        # calibrate: forward and reverse step times, and a Level-2 write through the runtime
        tf = median_time(w.step, 20)
        tb = median_time(lambda: (w.step(), w.reverse_step()), 20)
        raw = raw_write_speed(args.storage, nbytes, 64)
        with AsyncCheckpointer(w, Fwd(Workload(8)), rev, 64, l1_slots=1, interval=1,
                               storage=storage, staging_buffers=2) as probe:
            pass
        # engine write throughput: a forward sweep of trivial steps is write-bound
        trivial = Workload(nbytes, passes=0)
        with AsyncCheckpointer(trivial, Fwd(trivial), Rev(trivial), 64, l1_slots=1, interval=1,
                               storage=storage) as ckp:
            speeds = []
            for _ in range(args.repeats):
                trivial.reset()
                start = time.perf_counter()
                ckp.apply_forward()
                ckp._engine.drain()
                speeds.append(64 * nbytes / (time.perf_counter() - start))
                ckp.apply_reverse()
        engine_speed = statistics.median(speeds)
        tw = nbytes / engine_speed
        costs = Costs(tf=tf, tb=tb, tw=tw, tr=tw)
        choice = choose_interval(n, args.slots, costs)
        interval = choice.interval
        out.update(tf_ms=tf * 1e3, tb_ms=tb * 1e3, tw_ms=tw * 1e3, interval=interval,
                   raw_write_gbs=raw / 1e9, engine_write_gbs=engine_speed / 1e9,
                   l2_write_over_raw=engine_speed / raw)
        del probe

        bare_times, stream_times, total1_times, storeall_times = [], [], [], []
        best_times, pyrevolve_times = [], []
        buffers = [touched(nbytes).view(np.float64) for _ in range(n)] if n * nbytes < 12 * 2**30 else None
        import pyrevolve  # noqa: F401 - anchor

        with AsyncCheckpointer(w, fwd, rev, n, l1_slots=args.slots, interval=interval,
                               storage=storage) as best, \
             AsyncCheckpointer(w, fwd, rev, n, l1_slots=args.slots, interval=1,
                               storage=storage) as every:
            class PyCheckpoint(pyrevolve.Checkpoint):
                size = w.size
                dtype = w.dtype

                def get_data(self, t: int) -> list[np.ndarray]:
                    return [w.state]

                def get_data_location(self, t: int) -> list[np.ndarray]:
                    return [w.state]

            for _ in range(args.repeats):
                w.reset()
                bare_times.append(median_time(lambda: fwd.apply(t_start=0, t_end=n), 1))
                w.reset()
                start = time.perf_counter()
                best.apply_forward()
                stream_times.append(time.perf_counter() - start)
                best.apply_reverse()
                best_times.append(best.stats.total_s)
                total1_times.append(median_time(lambda: asyncckpt_run(every, w), 1))
                if buffers is not None:
                    storeall_times.append(median_time(lambda: store_all(w, n, buffers), 1))
                if not args.skip_pyrevolve:
                    def pyrevolve_run() -> None:
                        w.reset()
                        revolver = pyrevolve.Revolver(PyCheckpoint(), fwd, rev, args.slots, n)
                        revolver.apply_forward()
                        revolver.apply_reverse()
                    pyrevolve_times.append(median_time(pyrevolve_run, 1))
            out["forward_steps"] = best.stats.forward_steps
            out["write_stall_s"] = best.stats.write_stall_s
            out["read_stall_s"] = best.stats.read_stall_s
    med = statistics.median
    out["stream_over_bare"] = med(stream_times) / med(bare_times)
    if storeall_times:
        out["interval1_over_store_all"] = med(total1_times) / med(storeall_times)
    if pyrevolve_times:
        out["pyrevolve_over_asyncckpt"] = med(pyrevolve_times) / med(best_times)
    out["predicted_over_store_all"] = choice.prediction.total_s / choice.store_all.total_s
    print(json.dumps({k: (round(v, 4) if isinstance(v, float) else v) for k, v in out.items()}))


if __name__ == "__main__":
    main()
