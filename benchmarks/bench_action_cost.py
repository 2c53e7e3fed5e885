"""The runtime's own cost per step: a forward+reverse run of operators that do nothing, as one
JSON line.

Each state is a few bytes (``--state-bytes``, default 8 and 64) and the operators return at
once, so what a run costs is the runtime's: the schedule's actions, the Level-1 copies, the
transfer engine's Level-2 writes, reads, checksums and deletes, the timing of every call. The
figure is the seconds of ``apply_forward()`` + ``apply_reverse()`` over n, in microseconds a
step, for n = 2,000 to 20,000 (``--lengths``), at interval 1, 10 and 0 (Revolve in the Level-1
slots alone), ``l1_slots=10``, Level-2 in DRAM. Beside it, on the same states and operators:

- ``pyrevolve_10``: pyrevolve's ``Revolver`` with 10 checkpoints (its classic Revolve);
- ``pyrevolve_same_memory``: pyrevolve with as many checkpoints as asyncckpt held states at its
  peak at that interval (Level-1 slots, engine buffers and Level-2 states: ``l1_bytes`` over a
  state's page, plus ``l2_peak_states``), capped at n and at the 10,000 pyrevolve's C++
  Revolve accepts (``snapsup``); the row names the count;
- ``floor``: the operators called directly, n forward and n reverse calls.

Every configuration runs once per repetition, in turn (interleaved), after one warm-up run; the
figures are medians of ``--repeats`` (default 5). Goal: under 10 us a step at interval 1 and
under 5 us at interval 10.

Usage: python benchmarks/bench_action_cost.py [--lengths 2000,20000] [--state-bytes 8,64]
       [--repeats 5]
"""
from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from collections.abc import Callable
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _results import add_flag, record  # noqa: E402

from asyncckpt import ArrayCheckpoint, AsyncCheckpointer  # noqa: E402

INTERVALS = (1, 10, 0)
L1_SLOTS = 10
PAGE = 4096
#: the most checkpoints pyrevolve's C++ Revolve takes (its compiled-in ``snapsup``)
PYREVOLVE_MAX_SLOTS = 10_000


class _Nothing:
    """An operator that does nothing: what a run then costs is the runtime's."""

    def apply(self, *, t_start: int, t_end: int) -> None:
        pass


def _pyrevolve_run(state: np.ndarray, slots: int, n: int) -> Callable[[], None]:
    """One forward+reverse run of pyrevolve's Revolver with ``slots`` checkpoints."""
    import pyrevolve

    class Descriptor(pyrevolve.Checkpoint):
        size, dtype = state.size, state.dtype

        def get_data(self, t: int) -> list[np.ndarray]:
            return [state]

        def get_data_location(self, t: int) -> list[np.ndarray]:
            return [state]

    fwd, rev = _Nothing(), _Nothing()

    def run() -> None:
        revolver = pyrevolve.Revolver(Descriptor(), fwd, rev, slots, n)
        revolver.apply_forward()
        revolver.apply_reverse()

    return run


def _floor_run(n: int) -> Callable[[], None]:
    """The operators called directly, n times each."""
    fwd, rev = _Nothing(), _Nothing()

    def run() -> None:
        for t in range(n):
            fwd.apply(t_start=t, t_end=t + 1)
        for t in range(n - 1, -1, -1):
            rev.apply(t_start=t, t_end=t + 1)

    return run


def _seconds(run: Callable[[], object]) -> float:
    start = time.perf_counter()
    run()
    return time.perf_counter() - start


def measure(n: int, state_bytes: int, repeats: int) -> dict[str, object]:
    """The row of one length and state size: microseconds a step of each configuration."""
    state = np.zeros(max(1, state_bytes // 8))
    runs: dict[str, Callable[[], object]] = {}
    same_memory: dict[int, int] = {}
    checkpointers = []
    try:
        for interval in INTERVALS:
            ckp = AsyncCheckpointer(ArrayCheckpoint([state]), _Nothing(), _Nothing(), n,
                                    l1_slots=L1_SLOTS, interval=interval, storage="dram")
            checkpointers.append(ckp)
            ckp.apply_forward()  # warm-up: buffers made, Level-2 allocated once
            ckp.apply_reverse()
            stats = ckp.stats
            held = min(n, PYREVOLVE_MAX_SLOTS, -(-stats.l1_bytes // PAGE) + stats.l2_peak_states)
            same_memory[interval] = held
            runs[f"interval{interval}"] = (
                lambda ckp=ckp: (ckp.apply_forward(), ckp.apply_reverse()))
            runs[f"pyrevolve_same_memory_interval{interval}"] = _pyrevolve_run(state, held, n)
        runs["pyrevolve_10"] = _pyrevolve_run(state, L1_SLOTS, n)
        runs["floor"] = _floor_run(n)
        seen: dict[str, list[float]] = {name: [] for name in runs}
        for run in runs.values():  # warm-up
            run()
        for _ in range(repeats):
            for name, run in runs.items():
                seen[name].append(_seconds(run))
    finally:
        for ckp in checkpointers:
            ckp.close()
    us = {name: 1e6 * statistics.median(times) / n for name, times in seen.items()}
    row: dict[str, object] = {"n": n, "state_bytes": state.nbytes, "l1_slots": L1_SLOTS,
                              "storage": "dram", "repeats": repeats}
    row.update({f"{name}_us": round(value, 2) for name, value in us.items()})
    for interval in INTERVALS:
        mine = us[f"interval{interval}"]
        row[f"pyrevolve_10_over_interval{interval}"] = round(us["pyrevolve_10"] / mine, 3)
        row[f"pyrevolve_same_memory_over_interval{interval}"] = round(
            us[f"pyrevolve_same_memory_interval{interval}"] / mine, 3)
        row[f"pyrevolve_same_memory_slots_interval{interval}"] = same_memory[interval]
    return row


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--lengths", default="2000,20000",
                        help="comma-separated n (default 2000,20000)")
    parser.add_argument("--state-bytes", default="8,64",
                        help="comma-separated state sizes in bytes (default 8,64)")
    parser.add_argument("--repeats", type=int, default=5)
    add_flag(parser)
    args = parser.parse_args()
    for state_bytes in (int(b) for b in args.state_bytes.split(",")):
        for n in (int(x) for x in args.lengths.split(",")):
            row = measure(n, state_bytes, args.repeats)
            print(json.dumps(row), flush=True)
            record("bench_action_cost", row, ["n", "state_bytes", "l1_slots", "storage"],
                   args=args)


if __name__ == "__main__":
    main()
