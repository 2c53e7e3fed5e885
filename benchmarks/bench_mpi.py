"""The cost of one collective plan, measured under mpiexec and printed by rank 0 as one JSON line.

Each rank checkpoints its own workload (a state of ``--mib`` MiB, ``--n`` steps, ``--interval``, Level-2
in a private directory per rank under ``--dir``) twice per repeat, interleaved: with
``comm=COMM_WORLD`` and with no communicator. ``collective_over_independent`` is the slowest
rank's median forward+reverse time with the collective plan over the slowest rank's without
it; ``collectives_per_run`` counts the reductions of one run (``Stats.collectives``). ``level2_write_gbs`` is the
aggregate Level-2 write rate of all ranks during the collective runs.

Usage: mpiexec -n 4 python benchmarks/bench_mpi.py [--mib 1] [--n 300] [--passes 8]
[--interval 4]
"""
from __future__ import annotations

import argparse
import json
import statistics
import sys
import tempfile
import time
from pathlib import Path

from mpi4py import MPI

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _common import Fwd, Rev, Workload  # noqa: E402
from _results import add_flag, record  # noqa: E402

from asyncckpt import AsyncCheckpointer  # noqa: E402


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--mib", type=float, default=1.0)
    parser.add_argument("--n", type=int, default=300)
    parser.add_argument("--passes", type=int, default=8)
    parser.add_argument("--slots", type=int, default=8)
    parser.add_argument("--interval", default="4",
                        help="the interval of both runs (default 4: the same plan, so the ratio "
                             "is the cost of the collectives); 'auto' lets each choose")
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--dir", default=tempfile.gettempdir())
    add_flag(parser)
    args = parser.parse_args()
    comm = MPI.COMM_WORLD
    w = Workload(int(args.mib * 2**20), passes=args.passes)
    times: dict[str, list[float]] = {"collective": [], "independent": []}
    written = busy = 0.0
    interval = int(args.interval) if args.interval.isdigit() else args.interval
    with AsyncCheckpointer(w, Fwd(w), Rev(w), args.n, l1_slots=args.slots, storage=args.dir,
                           interval=interval, comm=comm) as collective, \
            AsyncCheckpointer(w, Fwd(w), Rev(w), args.n, l1_slots=args.slots,
                              interval=interval,
                              storage=Path(args.dir) / f"solo{comm.Get_rank()}") as independent:
        for attempt in range(args.repeats + 1):
            pair = [("collective", collective), ("independent", independent)]
            for name, ckp in pair if attempt % 2 else pair[::-1]:  # neither always first
                comm.Barrier()
                w.reset()
                start = time.perf_counter()
                ckp.apply_forward()
                ckp.apply_reverse()
                if attempt:
                    times[name].append(time.perf_counter() - start)
                    if name == "collective":
                        collectives = ckp.stats.collectives
                        written += ckp.stats.bytes_written
                        busy += ckp.stats.forward_s
        interval = collective.stats.interval
    medians = {k: statistics.median(v) for k, v in times.items()}
    slowest = {k: max(comm.allgather(v)) for k, v in medians.items()}
    rate = sum(comm.allgather(written)) / max(comm.allgather(busy)) / 1e9
    if comm.Get_rank() == 0:
        row = {
            "ranks": comm.Get_size(), "state_mib": args.mib, "n": args.n,
            "collective_over_independent": slowest["collective"] / slowest["independent"],
            "collectives_per_run": collectives, "interval": interval,
            "level2_write_gbs": round(rate, 3),
            "seconds": {k: round(v, 4) for k, v in slowest.items()}}
        print(json.dumps(row))
        record("bench_mpi", row, ["ranks", "state_mib", "n"], args=args)
    return 0


if __name__ == "__main__":
    sys.exit(main())
