"""H-Revolve over memory and disk on Devito's 3D acoustic gradient: pyrevolve's
``MultiLevelRevolver`` against asyncckpt.compat's on the same storage list, at equal memory, with
pyrevolve's ``Revolver`` and asyncckpt's asynchronous ``Revolver`` given the same bytes beside
them; interleaved in one process, one JSON line.

Every method gets ``--memory`` (a share of the run's states, "2%", or bytes) for states in host
memory: the multi-level revolvers as a ``NumpyStorage`` of that many slots with a
``DiskStorage`` of ``--disk-slots`` under ``--disk`` behind it, pyrevolve's ``Revolver`` as
slots, asyncckpt's ``Revolver`` as ``memory_budget`` with Level-2 beyond it under ``--disk``.
H-Revolve's costs are measured here first, in forward steps: a reverse step, a copy into memory
and a write and a read of the disk storage (both sides plan with the same numbers). Each
gradient runs through ``jacobian_adjoint(checkpointing=True)`` with the wavesolver's
``Revolver`` swapped, and is compared bit for bit with pyrevolve's ``Revolver``'s. The times
include building each revolver, where pyrevolve's multi-level one computes H-Revolve's tables
in Python.

Usage: python benchmarks/bench_multilevel.py [--shape 81x81x81] [--nt 772] [--memory 2%]
       [--disk-slots 64] [--disk DIR] [--repeats 2]
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
from bench_devito import (_problem, _quiet_costs, check_disk, memory_bytes,  # noqa: E402
                          parse_memory)
from _results import add_flag, record  # noqa: E402


def _disk_costs(state_bytes: int, directory: Path, repeats: int = 3) -> tuple[float, float]:
    """Median seconds to write and to read one state through a compat DiskStorage."""
    from asyncckpt.compat import DiskStorage

    size = state_bytes // 4
    storage = DiskStorage(size, 1, np.float32, filedir=str(directory))
    data = [np.random.default_rng(0).random(size, dtype=np.float32)]
    into = [np.empty_like(data[0])]
    writes, reads = [], []
    for _ in range(repeats):
        start = time.perf_counter()
        storage.save(0, data)
        writes.append(time.perf_counter() - start)
        start = time.perf_counter()
        storage.load(0, into)
        reads.append(time.perf_counter() - start)
    storage.removeDatdir()
    return statistics.median(writes), statistics.median(reads)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--shape", default="81x81x81")
    parser.add_argument("--nt", type=int, default=772)
    parser.add_argument("--space-order", type=int, default=4)
    parser.add_argument("--memory", type=parse_memory, default=parse_memory("2%"))
    parser.add_argument("--disk-slots", type=int, default=64)
    parser.add_argument("--disk", type=Path, default=Path(tempfile.gettempdir()))
    parser.add_argument("--repeats", type=int, default=2)
    add_flag(parser)
    args = parser.parse_args()

    import pyrevolve
    from examples.seismic.acoustic import wavesolver

    import asyncckpt.compat as compat

    shape = tuple(int(x) for x in args.shape.split("x"))
    solver = _problem(shape, args.nt, args.space_order)
    rec, u, _ = solver.forward(save=False)
    n = args.nt - 2
    state_bytes = u._data[0].nbytes * 2
    memory = memory_bytes(args.memory, n * state_bytes)
    slots = memory // state_bytes
    if slots < 1:
        raise SystemExit(f"--memory {args.memory} holds no state of {state_bytes} bytes")
    check_disk(args.disk, max(args.disk_slots, n - slots) * state_bytes)
    quiet = _quiet_costs(solver, rec, args.nt, args.space_order, 2)
    step = quiet["forward_call_per_step"] / n
    write_s, read_s = _disk_costs(state_bytes, args.disk)
    units = {"uf": 1.0, "ub": round(quiet["reverse_call_per_step"] / n / step, 2),
             "memory_wd": round(quiet["copy_warm"] / step, 2),
             "memory_rd": round(quiet["copy_warm"] / step, 2),
             "disk_wd": round(write_s / step, 2), "disk_rd": round(read_s / step, 2)}

    def multilevel(module: Any) -> type:
        class MultiLevel:
            def __new__(cls, cp, fwd, rev, n_checkpoints, n_timesteps):  # type: ignore[no-untyped-def]
                storages = [
                    module.NumpyStorage(cp.size, slots, cp.dtype, wd=units["memory_wd"],
                                        rd=units["memory_rd"]),
                    module.DiskStorage(cp.size, args.disk_slots, cp.dtype,
                                       filedir=str(args.disk) + os.sep, wd=units["disk_wd"],
                                       rd=units["disk_rd"])]
                return module.MultiLevelRevolver(cp, fwd, rev, n_timesteps,
                                                 storage_list=storages, uf=units["uf"],
                                                 ub=units["ub"])
        return MultiLevel

    class PyrevolveSlots(pyrevolve.Revolver):  # type: ignore[misc]
        def __init__(self, cp, fwd, rev, n_checkpoints, n_timesteps):  # type: ignore[no-untyped-def]
            super().__init__(cp, fwd, rev, slots, n_timesteps)

    class Asynchronous(compat.Revolver):
        def __init__(self, cp, fwd, rev, n_checkpoints, n_timesteps):  # type: ignore[no-untyped-def]
            super().__init__(cp, fwd, rev, None, n_timesteps, memory_budget=memory,
                             storage=["dram", args.disk])

    methods = {"pyrevolve-revolver": PyrevolveSlots,
               "pyrevolve-multilevel": multilevel(pyrevolve),
               "asyncckpt-multilevel": multilevel(compat),
               "asyncckpt-revolver": Asynchronous}
    os.environ["ASYNCCKPT_TAPING"] = "1"
    times: dict[str, list[float]] = {m: [] for m in methods}
    equal = {m: True for m in methods}
    reference = None
    for _ in range(args.repeats):
        for method, revolver in methods.items():
            wavesolver.Revolver = revolver
            start = time.perf_counter()
            grad, _ = solver.jacobian_adjoint(rec, None, checkpointing=True)
            times[method].append(time.perf_counter() - start)
            data = grad.data.copy()
            reference = data if reference is None else reference
            equal[method] &= bool(np.array_equal(data, reference))
    median = {m: statistics.median(v) for m, v in times.items()}
    floor = quiet["forward_one_call"] + quiet["reverse_call_per_step"]
    row = {
        "shape": args.shape, "nt": args.nt, "repeats": args.repeats,
        "state_mib": round(state_bytes / 2**20, 2),
        "memory": {"bytes": memory, "slots": slots, "disk_slots": args.disk_slots,
                   "disk": str(args.disk)},
        "costs_in_forward_steps": units,
        "seconds": {m: round(v, 3) for m, v in median.items()},
        "runs_s": {m: [round(t, 2) for t in v] for m, v in times.items()},
        "floor_s": round(floor, 3),
        "bitwise_equal_to_pyrevolve_revolver": equal,
        "pyrevolve_multilevel_over_asyncckpt_multilevel": round(
            median["pyrevolve-multilevel"] / median["asyncckpt-multilevel"], 3),
        "pyrevolve_revolver_over_asyncckpt_revolver": round(
            median["pyrevolve-revolver"] / median["asyncckpt-revolver"], 3),
        "asyncckpt_multilevel_over_asyncckpt_revolver": round(
            median["asyncckpt-multilevel"] / median["asyncckpt-revolver"], 3),
    }
    print(json.dumps(row), flush=True)
    record("bench_multilevel", {**row, "memory_option": args.memory},
           ["shape", "nt", "memory_option"], args=args)


if __name__ == "__main__":
    main()
