"""``python -m asyncckpt bound``: the least time any plan the runtime could run would take on this
machine (:func:`schedules.bound.machine_bound`), from the step costs the user measured and the
Level-2 device's, measured here while a thread computes beside it."""
from __future__ import annotations

import argparse
import threading
import time
from typing import Any

import numpy as np

from schedules.bound import machine_bound
from schedules.model import Costs

from ._cli_args import mib, positive_int, seconds, table
from ._memory.buffers import aligned_buffer, copy_out, padded
from ._tuning.calibrate import measure_transfer
from .storage import open_storage

__all__ = ["add_bound", "cmd_bound", "device_costs"]


def _run(text: str) -> tuple[str, float]:
    name, _, value = text.rpartition("=")
    if not name:
        raise argparse.ArgumentTypeError(f"expected NAME=SECONDS, got {text!r}")
    return name, seconds(value)


def add_bound(sub: Any) -> None:
    """Add the ``bound`` command to the command line's subparsers ``sub``."""
    bound = sub.add_parser(
        "bound", help="the least time any plan could take on this machine",
        description="Measure one state's write and read on a Level-2 device while a thread "
        "computes beside them, then print the least time any plan of a run of n steps could "
        "take in the memory given, with every transfer overlapped with the compute "
        "(schedules.bound), the plan that reaches it and the floor (the forward sweep and "
        "the reverse calls), and each run given with --run over both.")
    bound.add_argument("--storage", required=True,
                       help="a directory on the Level-2 device (or 'dram')")
    bound.add_argument("--mib", type=mib, default=8 * 2**20, help="state size in MiB (default 8)")
    bound.add_argument("--tf", type=seconds, required=True, help="seconds per forward step")
    bound.add_argument("--tb", type=seconds, required=True,
                       help="seconds per reverse call (the reverse operator alone)")
    bound.add_argument("--n", type=positive_int, required=True, help="time steps")
    bound.add_argument("--memory-mib", type=mib, required=True,
                       help="the memory given to checkpoints, in MiB (Level-1, buffers and DRAM "
                            "Level-2 together)")
    bound.add_argument("--taping", action=argparse.BooleanOptionalAction, default=False,
                       help="the reverse operator needs a forward step before each call "
                            "(pyrevolve's taping; default: no)")
    bound.add_argument("--run", type=_run, action="append", default=[],
                       help="NAME=SECONDS of a run to set against the bound (repeatable)")
    bound.add_argument("--repeats", type=positive_int, default=5,
                       help="measurements, median taken (default 5)")
    bound.set_defaults(func=cmd_bound)


def _beside_compute(nbytes: int, measure: Any) -> Any:
    """``measure()`` while a thread streams through memory, as a solver's steps do."""
    done = threading.Event()
    left, right = np.ones(max(1, nbytes // 8)), np.ones(max(1, nbytes // 8))

    def compute() -> None:
        while not done.is_set():
            np.add(left, right, out=left)

    worker = threading.Thread(target=compute, name="asyncckpt-bound-compute", daemon=True)
    worker.start()
    try:
        return measure()
    finally:
        done.set()
        worker.join()


def device_costs(path: str, nbytes: int, repeats: int) -> tuple[float, float, float]:
    """Seconds to write and to read one state of ``nbytes`` bytes on the Level-2 device at
    ``path`` while a thread computes beside them, and to copy one in memory: medians of
    ``repeats``."""
    storage = open_storage(path)[0]
    try:
        storage.reserve(nbytes, 4)
        tw, tr = _beside_compute(nbytes, lambda: measure_transfer(storage, nbytes,
                                                                  repeats=repeats))
    finally:
        storage.close()
    buffer, source = aligned_buffer(nbytes), aligned_buffer(nbytes)
    copies = [_timed(lambda: copy_out([source[:nbytes]], buffer)) for _ in range(repeats)]
    return tw, tr, float(np.median(copies))


def cmd_bound(args: argparse.Namespace) -> int:
    """Measure the device, print the bound and the runs against it."""
    nbytes = args.mib
    tw, tr, tc = device_costs(args.storage, nbytes, args.repeats)
    # the model's tb holds a forward step beside the reverse call (pyrevolve's convention)
    costs = Costs(tf=args.tf, tb=args.tf + args.tb, tw=tw, tr=tr, tc=tc, nbytes=nbytes)
    memory_states = args.memory_mib // padded(nbytes)
    if memory_states < 1:
        print(f"asyncckpt bound: --memory-mib holds no state of {nbytes} bytes")
        return 2
    found = machine_bound(args.n, memory_states, costs, taping=args.taping)
    plan = ("Revolve in memory alone" if found.interval == 0 else
            f"interval {found.interval}, {found.slots} slots")
    print(f"Level-2 {args.storage!r} beside a computing thread: write {tw * 1e3:.3f} ms, read "
          f"{tr * 1e3:.3f} ms; copy {tc * 1e3:.3f} ms; memory {memory_states} states")
    print(f"floor {found.floor_s:.4g} s; bound {found.total_s:.4g} s ({plan}: compute "
          f"{found.compute_s:.4g} s, device {found.device_s:.4g} s)")
    rows = [[name, f"{value:.4g}", f"{value / found.total_s:.3f}", f"{value / found.floor_s:.3f}"]
            for name, value in args.run]
    if rows:
        print(table(rows, ["run", "seconds", "over bound", "over floor"]))
    return 0


def _timed(work: Any) -> float:
    start = time.perf_counter()
    work()
    return time.perf_counter() - start
