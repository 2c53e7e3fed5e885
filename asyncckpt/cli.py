"""The command line: ``python -m asyncckpt {simulate,tune,bench-storage,nodes}``."""
from __future__ import annotations

import argparse
import sys
import time
from collections.abc import Sequence

import numpy as np

from schedules import AsyncMultistage, Revolve, simulate
from schedules.model import (
    Costs,
    choose_interval,
    predict_async_multistage,
    predict_revolve,
    predict_store_all,
)

from ._cli_args import mib, positive_int, seconds, table
from ._cli_bound import add_bound
from ._memory import numa
from ._memory.buffers import aligned_buffer, copy_out
from ._tuning.calibrate import measure_transfer
from .storage import HostMemoryStorage, Storage, open_storage

__all__ = ["main", "build_parser"]


def cmd_simulate(args: argparse.Namespace) -> int:
    n, slots = args.n, args.l1_slots
    costs = Costs(tf=args.tf, tb=args.tb, tw=args.tw, tr=args.tr)
    store_all = predict_store_all(n, costs)
    rows = []
    revolve_steps = simulate(Revolve(n, slots)).forward_steps
    revolve = predict_revolve(n, slots, costs)
    rows.append(["revolve", "-", str(revolve_steps), f"{revolve_steps / n:.3f}",
                 f"{revolve.total_s:.4g}", f"{revolve.total_s / store_all.total_s:.3f}"])
    intervals = args.interval or sorted({1, 2, 5, 10, 20, 50, 100, 1000} & set(range(1, n + 1)))
    for interval in intervals:
        if interval > n:
            print(f"asyncckpt simulate: interval {interval} exceeds n = {n}", file=sys.stderr)
            return 2
        steps = simulate(AsyncMultistage(n, interval, slots)).forward_steps
        prediction = predict_async_multistage(n, interval, slots, costs)
        rows.append(["async", str(interval), str(steps), f"{steps / n:.3f}",
                     f"{prediction.total_s:.4g}", f"{prediction.total_s / store_all.total_s:.3f}"])
    print(f"n = {n}, l1_slots = {slots}, tf = {costs.tf:g} s, tb = {costs.tb:g} s, "
          f"tw = {costs.tw:g} s, tr = {costs.tr:g} s (forward steps validated by simulate())")
    print(table(rows, ["strategy", "interval", "forward steps", "F/n", "predicted s",
                        "vs store-all"]))
    if costs.tw == 0 and costs.tr == 0:
        print("tw = tr = 0 (the defaults): Level-2 transfers cost nothing here, so the shortest "
              "interval\nwins; give --tw and --tr, or measure them with "
              "'python -m asyncckpt tune'")
    best = choose_interval(n, slots, costs)
    print(f"best interval by the model: {best.interval} "
          f"({best.prediction.total_s / store_all.total_s:.3f} x store-all, "
          f"{revolve.total_s / best.prediction.total_s:.2f} x faster than Revolve)")
    return 0


def _storage(text: str) -> Storage:
    return open_storage(text)[0]


def cmd_tune(args: argparse.Namespace) -> int:
    nbytes = args.mib
    storage = _storage(args.storage)
    try:
        storage.reserve(nbytes, 4)
        tw, tr = measure_transfer(storage, nbytes, repeats=args.repeats)
    finally:
        storage.close()
    buffer, source = aligned_buffer(nbytes), aligned_buffer(nbytes)
    start = time.perf_counter()
    for _ in range(args.repeats):
        copy_out([source[:nbytes]], buffer)
    tc = (time.perf_counter() - start) / args.repeats
    costs = Costs(tf=args.tf, tb=args.tb, tw=tw, tr=tr, tc=tc, nbytes=nbytes)
    choice = choose_interval(args.n, args.l1_slots, costs)
    store_all = choice.store_all.total_s
    print(f"Level-2 {storage!r}: state of {nbytes / 2**20:.2f} MiB, write {tw * 1e3:.3f} ms "
          f"({nbytes / tw / 1e9:.2f} GB/s), read {tr * 1e3:.3f} ms ({nbytes / tr / 1e9:.2f} GB/s), "
          f"staging copy {tc * 1e3:.3f} ms")
    print(f"n = {args.n}, l1_slots = {args.l1_slots}, tf = {args.tf:g} s, tb = {args.tb:g} s")
    rows = [
        ["store-all (no memory limit)", "-", f"{store_all:.4g}", "1.000"],
        ["revolve", "-", f"{choice.revolve.total_s:.4g}", f"{choice.revolve.total_s / store_all:.3f}"],
        ["asyncckpt", str(choice.interval), f"{choice.prediction.total_s:.4g}",
         f"{choice.prediction.total_s / store_all:.3f}"],
    ]
    print(table(rows, ["strategy", "interval", "predicted s", "vs store-all"]))
    print(f"recommended interval: {choice.interval} (write stall {choice.prediction.write_stall_s:.3g} s, "
          f"read stall {choice.prediction.read_stall_s:.3g} s predicted)")
    return 0


def cmd_bench_storage(args: argparse.Namespace) -> int:
    from tqdm import tqdm

    nbytes = args.state_mib
    count = max(1, int(args.total_gib * 2**30) // nbytes)
    storage = _storage(args.path)
    try:
        storage.reserve(nbytes, count)
        buffer = aligned_buffer(nbytes)
        view = buffer[:nbytes]
        view[:] = np.random.default_rng(0).integers(0, 256, nbytes, dtype=np.uint8)
        start = time.perf_counter()
        for key in tqdm(range(count), desc="write", unit="state"):
            storage.put(key, view)
        drop = getattr(storage, "drop_cache", None)
        if drop is not None:
            drop()
        write_s = time.perf_counter() - start
        start = time.perf_counter()
        for key in tqdm(range(count - 1, -1, -1), desc="read (reverse order)", unit="state"):
            storage.get(key, view)
        read_s = time.perf_counter() - start
    finally:
        storage.close()
    total = count * nbytes
    cold = "cold" if getattr(storage, "drop_cache", None) else "DRAM"
    print(f"{storage!r}: {count} states of {nbytes / 2**20:.2f} MiB ({total / 2**30:.2f} GiB)")
    print(f"sustained write {total / write_s / 1e9:.2f} GB/s (flushed to the device), "
          f"{cold} read in reverse order {total / read_s / 1e9:.2f} GB/s")
    return 0


def _node_rates(node: int, nbytes: int, repeats: int) -> tuple[str, str]:
    """Write and read rates of one state in ``node``'s memory, as the calibration measures a
    ``"numa:N"`` tier (from and to this thread's memory); dashes where it cannot be bound."""
    try:
        storage = HostMemoryStorage(node)
    except ValueError as exc:
        print(f"node {node}: {exc}", file=sys.stderr)
        return "-", "-"
    try:
        tw, tr = measure_transfer(storage, nbytes, repeats=repeats)
    finally:
        storage.close()
    return f"{nbytes / tw / 1e9:.2f}", f"{nbytes / tr / 1e9:.2f}"


def cmd_nodes(args: argparse.Namespace) -> int:
    nodes = numa.memory_nodes()
    kernel, hwloc = numa.kernel_tiers(), numa.hwloc_tiers()
    rows = []
    for node in nodes:
        try:
            memory = numa.node_memory(node)
            size, free, available = (f"{value / 2**30:.1f}" for value in
                                     (memory.total, memory.free, memory.available))
        except ValueError:
            size = free = available = "-"
        write, read = _node_rates(node, args.mib, args.repeats)
        rows.append([str(node), size, free, available, write, read, kernel.get(node, "-"),
                     hwloc.get(node, "-"), " ".join(map(str, numa.distances(node))) or "-"])
    print(table(rows, ["node", "GiB", "free GiB", "available GiB", "write GB/s", "read GB/s",
                        "kernel tier", "hwloc", "distances"]))
    print(f"rates: one state of {args.mib / 2**20:.2f} MiB copied into and out of the node's "
          f"memory by this thread, median of {args.repeats}; use l1_node=N for Level-1 and "
          "storage='numa:N' for Level-2 (docs/numa.md)")
    if not hwloc:
        print("hwloc: lstopo-no-graphics not found (install hwloc 2.10 or later for its tier "
              "names)")
    return 0


def build_parser() -> argparse.ArgumentParser:
    """The argparse parser of ``python -m asyncckpt``."""
    parser = argparse.ArgumentParser(prog="python -m asyncckpt", description=__doc__)
    sub = parser.add_subparsers(dest="command", required=True)
    sim = sub.add_parser("simulate", help="forward-step counts and predicted times of Revolve "
                         "against asynchronous multistage checkpointing",
                         description="Print a table of Revolve against asynchronous multistage "
                         "checkpointing at several intervals: forward steps (each schedule "
                         "validated) and the performance model's predicted time.")
    sim.add_argument("--n", type=positive_int, default=1000, help="time steps (default 1000)")
    sim.add_argument("--l1-slots", type=positive_int, default=10,
                     help="Level-1 checkpoint slots (default 10)")
    sim.add_argument("--interval", type=positive_int, action="append",
                     help="an interval to show (repeatable; default 1, 2, 5, 10, ... up to n)")
    sim.add_argument("--tf", type=seconds, default=1.0, help="seconds per forward step (default 1)")
    sim.add_argument("--tb", type=seconds, default=2.0,
                     help="seconds per reverse step, its taping step included (default 2)")
    sim.add_argument("--tw", type=seconds, default=0.0,
                     help="seconds to write a state to Level-2 (default 0: free, so every "
                          "interval hides its transfers; 'tune' measures a device)")
    sim.add_argument("--tr", type=seconds, default=0.0,
                     help="seconds to read a state back (default 0, as --tw)")
    sim.set_defaults(func=cmd_simulate)

    tune = sub.add_parser("tune", help="measure a Level-2 device and recommend an interval",
                          description="Measure the write and read time of one state on a Level-2 "
                          "device through the runtime's own I/O path, then print the interval "
                          "the performance model predicts fastest, with its predicted time "
                          "against store-all and Revolve.")
    tune.add_argument("--storage", default="dram",
                      help="'dram', 'numa:N' (NUMA node N's memory) or a directory on the "
                           "device (default dram)")
    tune.add_argument("--mib", type=mib, default=8 * 2**20, help="state size in MiB (default 8)")
    tune.add_argument("--tf", type=seconds, required=True, help="seconds per forward step")
    tune.add_argument("--tb", type=seconds, required=True,
                      help="seconds per reverse step, its taping step included")
    tune.add_argument("--n", type=positive_int, default=1000, help="time steps (default 1000)")
    tune.add_argument("--l1-slots", type=positive_int, default=10,
                      help="Level-1 slots (default 10)")
    tune.add_argument("--repeats", type=positive_int, default=5,
                      help="measurements, median taken (default 5)")
    tune.set_defaults(func=cmd_tune)

    bench = sub.add_parser("bench-storage", help="sustained write and cold read bandwidth of a "
                           "Level-2 device",
                           description="Write states back to back to a Level-2 device through "
                           "the runtime's own I/O path, flush them, drop them from the page cache "
                           "and read them back in reverse order.")
    bench.add_argument("path", help="a directory on the device, or 'dram'")
    bench.add_argument("--state-mib", type=mib, default=8 * 2**20,
                       help="state size in MiB (default 8)")
    bench.add_argument("--total-gib", type=float, default=1.0,
                       help="GiB to write in all (default 1)")
    bench.set_defaults(func=cmd_bench_storage)

    nodes = sub.add_parser("nodes", help="the machine's NUMA nodes: sizes, free memory, copy "
                           "rates and memory tiers",
                           description="List the NUMA nodes with memory: their size, free "
                           "memory, the rates at which a state is copied into and out of each "
                           "(as the calibration measures a 'numa:N' tier), the kernel's memory "
                           "tier and hwloc's names where hwloc is installed.")
    nodes.add_argument("--mib", type=mib, default=64 * 2**20,
                       help="state size in MiB (default 64)")
    nodes.add_argument("--repeats", type=positive_int, default=5,
                       help="measurements, median taken (default 5)")
    nodes.set_defaults(func=cmd_nodes)
    add_bound(sub)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    """Run the command line; return the exit status."""
    parser = build_parser()
    args = parser.parse_args(argv)
    try:
        return int(args.func(args))
    except (ValueError, OSError) as exc:
        parser.error(str(exc))
        return 2
