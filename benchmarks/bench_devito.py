"""Devito's acoustic gradient: pyrevolve vs asyncckpt.compat (taping and taping-free) vs Devito's
full-history gradient, interleaved in one process, one JSON line.

Each gradient goes through ``examples.seismic`` 's own ``jacobian_adjoint(checkpointing=True)``,
which builds a fresh ``Revolver(cp, fwd, rev, None, nt - 2)`` per call, with ``Revolver`` swapped
in the wavesolver's module: pyrevolve's (its default ``n_checkpoints=None``, and with
``--pyrevolve-slots``), asyncckpt's with ``interval="auto"`` (``ASYNCCKPT_TAPING=1`` and ``0``),
and Devito's full-history gradient (``checkpointing=False``, the wavefield saved by a forward
run outside the timing and let go after it: a program that checkpoints holds no full history,
so the checkpointed gradients run without it). Ratios are of medians; every gradient is
compared bit for bit with the full-history one.

With ``--intervals 1,2,4`` each asyncckpt protocol also runs at those fixed intervals
(``ASYNCCKPT_INTERVAL``), and the line gives "auto" over the best of them, medians of the runs
after each method's first.

Where the time goes: the same process also times the gradient's parts alone, through the
wavesolver's own operators (``quiet_s``: the forward sweep in one call and in one call per
step, the reverse calls, a warm copy of the state). Their sum is what a checkpointed gradient
cannot go below (``limit_s``: forward in one call, reverse calls, one warm copy per step, and
with taping one more forward call per step), and each asyncckpt protocol's last run is split
into the compute of its steps at those quiet costs, the compute beyond them inside the run,
its copies, the checkpoint descriptor's calls, the runtime's own bookkeeping and what ran
outside the checkpointer (``<method>_where``; they add up to the run's wall time).

Usage: python benchmarks/bench_devito.py [--shape 81x81x81] [--nt 772] [--repeats 3]
       [--intervals 1,2,4]
Needs the ``devito`` extra (``pip install -e '.[devito]'``).
"""
from __future__ import annotations

import argparse
import gc
import json
import os
import statistics
import time
from typing import Any

import numpy as np


def _problem(shape: tuple[int, ...], nt: int, space_order: int) -> Any:
    from examples.seismic.acoustic import acoustic_setup

    spacing = tuple(10.0 for _ in shape)
    probe = acoustic_setup(shape=shape, spacing=spacing, tn=1.0, space_order=space_order, nbl=10)
    tn = probe.model.critical_dt * (nt - 1)
    return acoustic_setup(shape=shape, spacing=spacing, tn=tn, space_order=space_order, nbl=10)


def _quiet_costs(solver: Any, rec: Any, nt: int, space_order: int,
                 repeats: int) -> dict[str, float]:
    """Median seconds of the gradient's parts alone, through the operators the wavesolver wraps
    for checkpointing: the forward sweep in one call and in a call per step, the reverse in a
    call per step, and one copy of the state into a buffer it was copied into before."""
    from devito import CheckpointOperator, DevitoCheckpoint, Function, TimeFunction

    from asyncckpt._buffers import aligned_buffer, copy_out

    grid, n = solver.model.grid, nt - 2
    u = TimeFunction(name="u", grid=grid, time_order=2, space_order=space_order)
    v = TimeFunction(name="v", grid=grid, time_order=2, space_order=space_order)
    grad = Function(name="grad", grid=grid)
    params = solver.model.physical_params()
    dt = solver.model.critical_dt
    fwd = CheckpointOperator(solver.op_fwd(save=False), src=solver.geometry.src, u=u, dt=dt,
                             **params)
    rev = CheckpointOperator(solver.op_grad(save=False), u=u, v=v, rec=rec, dt=dt, grad=grad,
                             **params)
    state = DevitoCheckpoint([u]).get_data(0)
    buffer = aligned_buffer(sum(a.nbytes for a in state))

    def one_call() -> None:
        fwd.apply(t_start=0, t_end=n)

    def forward_calls() -> None:
        for t in range(n):
            fwd.apply(t_start=t, t_end=t + 1)

    def reverse_calls() -> None:
        for t in range(n - 1, -1, -1):
            rev.apply(t_start=t, t_end=t + 1)

    def copies() -> None:
        for _ in range(100):
            copy_out(state, buffer)

    parts = {"forward_one_call": one_call, "forward_call_per_step": forward_calls,
             "reverse_call_per_step": reverse_calls, "copy_100_warm": copies}
    times: dict[str, list[float]] = {k: [] for k in parts}
    for _ in range(repeats):
        for name, part in parts.items():
            start = time.perf_counter()
            part()
            times[name].append(time.perf_counter() - start)
    quiet = {k: statistics.median(v) for k, v in times.items()}
    quiet["copy_warm"] = quiet.pop("copy_100_warm") / 100
    return quiet


def _where(run: dict[str, float], quiet: dict[str, float], n: int) -> dict[str, float]:
    """Split a run's wall time: its steps at their quiet costs (recomputed forward steps
    apart), the compute beyond that inside the run, its copies, the checkpoint descriptor's
    calls, the runtime's own bookkeeping and what ran outside the checkpointer."""
    forward_step = quiet["forward_call_per_step"] / n
    reverse_step = quiet["reverse_call_per_step"] / n
    extra = run["forward_steps"] - n * (1 if run["taping_free"] else 2)  # beyond sweep and tape
    at_quiet = run["forward_steps"] * forward_step + run["reverse_steps"] * reverse_step
    compute = run["forward_compute_s"] + run["reverse_compute_s"]
    parts = {
        "steps_at_quiet_cost_s": at_quiet - extra * forward_step,
        "recomputed_steps_at_quiet_cost_s": extra * forward_step,
        "compute_beyond_quiet_s": compute - at_quiet,
        "copies_s": run["copy_s"],
        "copies_beyond_warm_s": run["copy_s"] - run["copies"] * quiet["copy_warm"],
        "descriptor_s": run["descriptor_s"],
        "runtime_s": run["total_s"] - compute - run["copy_s"] - run["descriptor_s"],
        "outside_checkpointer_s": run["wall_s"] - run["total_s"],
    }
    return {k: round(v, 3) for k, v in parts.items()}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--shape", default="81x81x81", help="grid points per axis, e.g. 101x101")
    parser.add_argument("--nt", type=int, default=772, help="time samples (n = nt - 2 steps)")
    parser.add_argument("--space-order", type=int, default=4)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--pyrevolve-slots", type=int, default=20,
                        help="pyrevolve run beside its default; 0 skips it")
    parser.add_argument("--intervals", default="",
                        help="fixed intervals to run beside 'auto', e.g. 1,2,4 (default: none)")
    args = parser.parse_args()

    from devito import configuration

    configuration["log-level"] = "WARNING"
    import pyrevolve
    from examples.seismic.acoustic import wavesolver

    import asyncckpt.compat as compat

    shape = tuple(int(x) for x in args.shape.split("x"))
    solver = _problem(shape, args.nt, args.space_order)
    rec, u_saved, _ = solver.forward(save=True)
    state_bytes = u_saved._data[0].nbytes * 2  # the checkpoint: two time levels
    last_stats: dict[str, Any] = {}

    class PyrevolveWithSlots(pyrevolve.Revolver):  # type: ignore[misc]
        def __init__(self, cp, fwd, rev, n_checkpoints, n_timesteps, **kw):  # type: ignore[no-untyped-def]
            super().__init__(cp, fwd, rev, args.pyrevolve_slots, n_timesteps, **kw)

    class Compat(compat.Revolver):
        def apply_reverse(self) -> None:
            super().apply_reverse()
            last_stats["stats"] = self.stats

    def gradient(method: str) -> tuple[float, np.ndarray]:
        nonlocal u_saved
        if method == "full-history":
            if u_saved is None:  # outside the timing
                _, u_saved, _ = solver.forward(save=True)
            start = time.perf_counter()
            grad, _ = solver.jacobian_adjoint(rec, u_saved, checkpointing=False)
            seconds = time.perf_counter() - start
            # a program that checkpoints holds no full history: the others run without it
            # (held, it took 7.7 GB of the 24 that the default budget takes a quarter of)
            u_saved = None
            gc.collect()
            return seconds, grad.data.copy()
        wavesolver.Revolver = {"pyrevolve": pyrevolve.Revolver,
                               "pyrevolve-slots": PyrevolveWithSlots}.get(method, Compat)
        protocol, _, interval = method.partition("-I")
        os.environ["ASYNCCKPT_TAPING"] = "0" if protocol == "asyncckpt-taping-free" else "1"
        os.environ["ASYNCCKPT_INTERVAL"] = interval or "auto"
        start = time.perf_counter()
        # with checkpointing the wavesolver makes its own u (two time levels): none is passed
        grad, _ = solver.jacobian_adjoint(rec, None, checkpointing=True)
        return time.perf_counter() - start, grad.data.copy()

    protocols = ["asyncckpt-taping", "asyncckpt-taping-free"]
    fixed = [int(k) for k in args.intervals.split(",") if k.strip()]
    methods = ["full-history", "pyrevolve", *protocols]
    methods += [f"{protocol}-I{k}" for protocol in protocols for k in fixed]
    if args.pyrevolve_slots:
        methods.insert(2, "pyrevolve-slots")
    times: dict[str, list[float]] = {m: [] for m in methods}
    equal = {m: True for m in methods}
    runs: dict[str, list[dict[str, float]]] = {m: [] for m in methods if "asyncckpt" in m}
    reference = None
    quiet = _quiet_costs(solver, rec, args.nt, args.space_order, args.repeats)
    n = args.nt - 2
    for _ in range(args.repeats):
        for method in methods:
            seconds, grad = gradient(method)
            times[method].append(seconds)
            if method == "full-history":
                reference = grad
            equal[method] &= bool(np.array_equal(grad, reference))
            if method in runs:
                stats = last_stats.pop("stats")
                calibration = stats.calibration
                runs[method].append({
                    "interval": stats.interval, "l1_slots": stats.l1_slots,
                    "recompute_factor": stats.recompute_factor,
                    "forward_compute_s": stats.forward_compute_s,
                    "reverse_compute_s": stats.reverse_compute_s, "copy_s": stats.copy_s,
                    "stall_s": stats.write_stall_s + stats.read_stall_s,
                    "overhead_s": stats.total_s - stats.forward_compute_s
                    - stats.reverse_compute_s - stats.copy_s,
                    "measured_over_predicted": calibration.get("measured_over_predicted", 0.0),
                    "fresh_s": stats.fresh_s,
                    "forward_steps": stats.forward_steps, "reverse_steps": stats.reverse_steps,
                    "copies": stats.copies, "descriptor_s": stats.descriptor_s,
                    "total_s": stats.total_s, "wall_s": seconds,
                    "taping_free": not stats.taping,
                })
    median = {m: statistics.median(v) for m, v in times.items()}
    out: dict[str, Any] = {
        "shape": args.shape, "nt": args.nt, "repeats": args.repeats,
        "state_mib": round(state_bytes / 2**20, 2),
        "seconds": {m: round(v, 3) for m, v in median.items()},
        # every run in order: the first gradients of a process pay for fresh memory
        "runs_s": {m: [round(t, 2) for t in v] for m, v in times.items()},
        "bitwise_equal_to_full_history": equal,
        "quiet_s": {k: float(f"{v:.4g}") for k, v in quiet.items()},
    }
    warm_copies = n * quiet["copy_warm"]
    limit = {"asyncckpt-taping-free": quiet["forward_one_call"]
             + quiet["reverse_call_per_step"] + warm_copies}
    limit["asyncckpt-taping"] = limit["asyncckpt-taping-free"] + quiet["forward_call_per_step"]
    out["limit_s"] = {m: round(v, 3) for m, v in limit.items()}
    # "auto" against fixed intervals once memory is warm: "auto" runs first, so its first
    # gradient faults in the memory that every fixed interval's first gradient then reuses
    warm = {m: statistics.median(v[1:] or v) for m, v in times.items()}
    for protocol in protocols if fixed else []:
        best = min(fixed, key=lambda k: warm[f"{protocol}-I{k}"])
        out[f"{protocol}_auto_over_best_fixed"] = {  # within 5% where the ratio is <= 1.05
            "best_interval": best, "ratio": round(warm[protocol] / warm[f"{protocol}-I{best}"], 3),
            "medians_after_the_first_run": True}
    for method in protocols:
        out[f"pyrevolve_over_{method}"] = round(median["pyrevolve"] / median[method], 3)
        if args.pyrevolve_slots:
            out[f"pyrevolve{args.pyrevolve_slots}_over_{method}"] = round(
                median["pyrevolve-slots"] / median[method], 3)
        out[f"{method}_over_full_history"] = round(median[method] / median["full-history"], 3)
        out[f"{method}_over_limit"] = round(median[method] / limit[method], 3)
        # the last run: where the time went, once costs were learned
        last = runs[method][-1]
        out[f"{method}_last_run"] = {k: round(float(v), 3) for k, v in last.items()}
        out[f"{method}_where"] = _where(last, quiet, n)
        # each run's plan: (interval, 0 for Level-1 alone; slots; measured/predicted; faults)
        out[f"{method}_plans"] = [[r["interval"], r["l1_slots"],
                                   round(r["measured_over_predicted"], 2), round(r["fresh_s"], 1)]
                                  for r in runs[method]]
    print(json.dumps(out))


if __name__ == "__main__":
    main()
