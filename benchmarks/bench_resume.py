"""A durable run's price, and several reverse sweeps over one forward.

Devito's acoustic gradient with ``run_dir=`` (every Level-2 state
flushed to the device and committed to a manifest) against the same gradient with Level-2 in a
plain file on the same disk, at equal memory, in paired rounds in one process (each round in an
order of its own); every gradient compared bit for bit with Devito's full history. One JSON line.

Both sides get ``--memory`` (a share of the run's states) as ``memory_budget`` and the same
fixed ``--interval``, so both write the same states to the same disk: the ratio is the price of
the flushes and the commits alone.

With ``--seeds K`` (K > 1) the same process then takes K gradients of K adjoint sources (the
residual scaled by 1, 2, ... K) over one forward sweep, with ``keep_forward=True``, against K
forward and reverse sweeps, paired over the rounds; each of the K gradients compared bit for bit
between the two.

Usage: python benchmarks/bench_resume.py [--shape 63x75x59] [--nt 800] [--memory 3%]
       [--interval 20] [--repeats 3] [--seeds 3] [--disk DIR]
Needs the ``devito`` extra.
"""
from __future__ import annotations

import argparse
import gc
import json
import random
import shutil
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _results import add_flag, record  # noqa: E402
from bench_devito import _problem, memory_bytes, parse_memory  # noqa: E402


def measure(args: argparse.Namespace, solver: Any, rec: Any, state_bytes: int) -> dict[str, Any]:
    """Durable against plain gradients of ``solver`` for the residual ``rec`` (see the
    module's doc); ``state_bytes``: a checkpoint's."""
    from examples.seismic.acoustic import wavesolver

    import asyncckpt.compat as compat

    n = args.nt - 2
    memory = memory_bytes(args.memory, n * state_bytes)
    disk = Path(tempfile.mkdtemp(prefix="bench-resume-", dir=args.disk))
    _, u_saved, _ = solver.forward(save=True)
    reference, _ = solver.jacobian_adjoint(rec, u_saved, checkpointing=False)
    reference = reference.data.copy()
    del u_saved
    method = {"name": ""}

    class Swapped(compat.Revolver):
        def __init__(self, cp, fwd, rev, n_checkpoints, n_timesteps, **kw):
            kw.update(memory_budget=memory, interval=args.interval)
            if method["name"] == "durable":
                kw["run_dir"] = disk / "run"
            else:
                kw["storage"] = disk  # the same disk, one nameless file
            super().__init__(cp, fwd, rev, n_checkpoints, n_timesteps, **kw)

    wavesolver.Revolver = Swapped
    names = ["plain", "durable"]
    times: dict[str, list[float]] = {name: [] for name in names}
    equal = {name: True for name in names}
    for repeat in range(args.repeats):
        order = names[:] if repeat == 0 else random.Random(repeat).sample(names, len(names))
        for name in order:
            method["name"] = name
            start = time.perf_counter()
            grad, _ = solver.jacobian_adjoint(rec, None, checkpointing=True)
            times[name].append(time.perf_counter() - start)
            equal[name] &= bool(np.array_equal(grad.data, reference))
            gc.collect()
    shutil.rmtree(disk, ignore_errors=True)
    paired = statistics.median(d / p for d, p in zip(times["durable"], times["plain"]))
    return {"shape": args.shape, "nt": args.nt, "memory": args.memory, "interval": args.interval,
            "state_mib": round(state_bytes / 2**20, 2), "memory_bytes": memory,
            "runs_s": {k: [round(t, 3) for t in v] for k, v in times.items()},
            "durable_over_plain": round(statistics.median(times["durable"])
                                        / statistics.median(times["plain"]), 3),
            "durable_over_plain_paired": round(paired, 3),
            "bitwise_equal_to_full_history": equal, "disk": str(disk)}


def seeds(args: argparse.Namespace, solver: Any, rec: Any, state_bytes: int) -> dict[str, Any]:
    """K gradients over one kept forward sweep against K full runs (see the module's doc);
    ``rec``'s data is scaled for each adjoint source."""
    from devito import CheckpointOperator, DevitoCheckpoint, Function, TimeFunction

    import asyncckpt.compat as compat

    residual = rec.data.copy()
    grid, order = solver.model.grid, solver.space_order
    n = args.nt - 2
    memory = memory_bytes(args.memory, n * state_bytes)
    u = TimeFunction(name="u", grid=grid, time_order=2, space_order=order)
    v = TimeFunction(name="v", grid=grid, time_order=2, space_order=order)
    grad = Function(name="grad", grid=grid)
    params = solver.model.physical_params()
    fwd = CheckpointOperator(solver.op_fwd(save=False), src=solver.geometry.src, u=u,
                             dt=solver.dt, **params)
    rev = CheckpointOperator(solver.op_grad(save=False), u=u, v=v, rec=rec, dt=solver.dt,
                             grad=grad, **params)
    _KEEP_ALIVE.extend((fwd, rev, u, v, grad))

    def gradients(keep: bool) -> tuple[float, list[np.ndarray]]:
        out = []
        start = time.perf_counter()
        with compat.Revolver(DevitoCheckpoint([u]), fwd, rev, None, n, interval=args.interval,
                             memory_budget=memory, keep_forward=keep) as revolver:
            for seed in range(args.seeds):
                if seed == 0 or not keep:
                    u.data[:] = 0.0
                    revolver.apply_forward()
                rec.data[:] = residual * (seed + 1)
                v.data[:], grad.data[:] = 0.0, 0.0
                revolver.apply_reverse()
                out.append(grad.data.copy())
        return time.perf_counter() - start, out

    times: dict[str, list[float]] = {"kept": [], "full": []}
    equal = True
    for repeat in range(args.repeats):
        order = ["kept", "full"] if repeat % 2 == 0 else ["full", "kept"]
        got = {}
        for name in order:
            seconds, got[name] = gradients(name == "kept")
            times[name].append(seconds)
            gc.collect()
        equal &= all(a.tobytes() == b.tobytes() for a, b in zip(got["kept"], got["full"]))
    paired = statistics.median(k / f for k, f in zip(times["kept"], times["full"]))
    return {"seeds": args.seeds, "runs_s": {k: [round(t, 3) for t in v] for k, v in times.items()},
            "kept_over_full": round(statistics.median(times["kept"])
                                    / statistics.median(times["full"]), 3),
            "kept_over_full_paired": round(paired, 3), "bitwise_equal": equal}


#: Devito objects kept alive: the cyclic GC freeing unapplied operators can crash a later one
_KEEP_ALIVE: list[Any] = []


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--shape", default="63x75x59")
    parser.add_argument("--nt", type=int, default=800)
    parser.add_argument("--memory", type=parse_memory, default=parse_memory("3%"))
    parser.add_argument("--interval", type=int, default=20)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--seeds", type=int, default=1)
    parser.add_argument("--disk", type=Path, default=None)
    add_flag(parser)
    args = parser.parse_args()
    # one problem for both measurements: Devito compiles its operators once
    solver = _problem(tuple(int(x) for x in args.shape.split("x")), args.nt, 4)
    rec, u, _ = solver.forward(save=False)
    state_bytes = u._data[0].nbytes * 2  # the checkpoint: two time levels
    row = measure(args, solver, rec, state_bytes)
    if args.seeds > 1:
        row["keep_forward"] = seeds(args, solver, rec, state_bytes)
    print(json.dumps(row))
    record("bench_resume", row, ["shape", "nt", "memory", "interval"], args=args)


if __name__ == "__main__":
    main()
