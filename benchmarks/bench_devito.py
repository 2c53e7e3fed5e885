"""Devito's acoustic gradient: pyrevolve vs asyncckpt.compat (taping and taping-free) vs Devito's
full-history gradient, interleaved in one process (each round after the first in an order
of its own, drawn with the round's number as seed, and the cyclic GC run after every gradient,
outside its timing), one JSON line.

Each gradient goes through ``examples.seismic`` 's own ``jacobian_adjoint(checkpointing=True)``,
which builds a fresh ``Revolver(cp, fwd, rev, None, nt - 2)`` per call, with ``Revolver`` swapped
in the wavesolver's module: pyrevolve's (its default ``n_checkpoints=None``, and with
``--pyrevolve-slots``), asyncckpt's with ``interval="auto"`` (as it decides the protocol, and
forced by ``ASYNCCKPT_TAPING=1`` and ``0``),
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

The machine's bound (with ``--memory``): the least time any plan of the gradient could take in
the same bytes (``schedules.bound``), from the quiet costs, the state's copy and a write and a
read of a state on ``--disk`` measured while a thread computes beside them; the line gives each
method over it (``<method>_over_bound``).

Equal memory (``--memory SHARE|BYTES``): both sides get the same bytes for checkpoints. SHARE
is a share of the run's states ("2%" or "0.02"), BYTES a size ("148MiB"). pyrevolve gets as many
slots as whole states fit in it; asyncckpt gets it as ``memory_budget`` (Level-1 slots, staging
and prefetch buffers and DRAM Level-2 together), with Level-2 beyond it in files under
``--disk`` (the disk, not the page cache's share of RAM, holds them: the O_DIRECT path). The
line gives each side over the floor (the forward sweep in one call plus the reverse calls).

Compression (``--compression 'lz4;zstd'``): each asyncckpt protocol also runs with those codecs
(``ASYNCCKPT_COMPRESSION``); its runs give the compression ratio and the codec's seconds, and
``codec_errors`` each codec's largest error against the reference gradient over its runs
(relative L2, and the largest absolute difference over the reference's largest magnitude): 0
for a lossless one, the price of a lossy one (``'zfp:tolerance=1e-6'``). With ``--intervals``
too, each fixed interval also runs with each codec (``asyncckpt-taping-I4+lz4``): a short fixed
interval makes the disk the bottleneck, where "auto" would recompute instead.

Time against n (``--nt 772,1544,3088``, several values, with ``--memory`` in BYTES: a fixed
budget): one line per nt, then a plot of seconds per step against nt for pyrevolve, asyncckpt and
the floor (``--plot``). The disk is checked first for room for every state beyond the budget.
Devito's full history (held in memory) runs only where it fits in half the available memory;
every gradient is compared bit for bit with it, else with pyrevolve's.

Usage: python benchmarks/bench_devito.py [--shape 81x81x81] [--nt 772] [--repeats 3]
       [--intervals 1,2,4] [--memory 2%] [--disk DIR] [--plot PATH] [--compression 'lz4;zstd']
Needs the ``devito`` extra (``pip install -e '.[devito]'``).
"""
from __future__ import annotations

import argparse
import gc
import json
import os
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
from _common import gradient_error  # noqa: E402
from _results import add_flag, record  # noqa: E402


#: Devito objects built here, kept alive to the end: freeing a set whose operators never ran
#: can crash a later operator when the cyclic GC frees it
_KEEP: list[Any] = []


def _problem(shape: tuple[int, ...], nt: int, space_order: int) -> Any:
    from examples.seismic.acoustic import acoustic_setup

    spacing = tuple(10.0 for _ in shape)
    probe = acoustic_setup(shape=shape, spacing=spacing, tn=1.0, space_order=space_order, nbl=10)
    tn = probe.model.critical_dt * (nt - 1)
    solver = acoustic_setup(shape=shape, spacing=spacing, tn=tn, space_order=space_order, nbl=10)
    _KEEP.extend((probe, solver))
    return solver


def _quiet_costs(solver: Any, rec: Any, nt: int, space_order: int,
                 repeats: int) -> dict[str, float]:
    """Median seconds of the gradient's parts alone, through the operators the wavesolver wraps
    for checkpointing: the forward sweep in one call and in a call per step, the reverse in a
    call per step, and one copy of the state into a buffer it was copied into before."""
    from devito import CheckpointOperator, DevitoCheckpoint, Function, TimeFunction

    from asyncckpt._memory.buffers import aligned_buffer, copy_out

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


def _bound(n: int, memory: int, state_bytes: int, quiet: dict[str, float], disk: Path,
           repeats: int) -> dict[str, Any]:
    """The least time any plan of the gradient could take in ``memory`` bytes on this machine
    (:func:`schedules.bound.machine_bound`): the quiet step costs, the state's copy, and a
    write and a read on the disk measured while a thread computes beside them."""
    from asyncckpt._cli_bound import device_costs
    from asyncckpt._memory.buffers import padded
    from schedules.bound import machine_bound
    from schedules.model import Costs

    tw, tr, _ = device_costs(str(disk), state_bytes, max(3, repeats))
    tf = quiet["forward_one_call"] / n
    costs = Costs(tf=tf, tb=tf + quiet["reverse_call_per_step"] / n, tw=tw, tr=tr,
                  tc=quiet["copy_warm"])
    found = machine_bound(n, max(1, memory // padded(state_bytes)), costs, taping=False)
    return {"total_s": round(found.total_s, 3), "compute_s": round(found.compute_s, 3),
            "device_s": round(found.device_s, 3), "interval": found.interval,
            "slots": found.slots, "tw_ms": round(tw * 1e3, 3), "tr_ms": round(tr * 1e3, 3)}


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


def paired(numerator: list[float], denominator: list[float], *,
           skip_first: bool = False) -> float:
    """The median over rounds of one method's time over another's in the same round: on this
    shared machine a whole round runs up to 25% faster or slower than the next, which a ratio
    of medians over rounds takes for a difference between the methods. ``skip_first``: from
    the second round on (the first faults memory in)."""
    pairs = list(zip(numerator, denominator))
    if skip_first and len(pairs) > 1:
        pairs = pairs[1:]
    return round(statistics.median(a / b for a, b in pairs), 3)


def parse_memory(text: str) -> float | int:
    """``--memory``: a share of all the run's states ("2%", "0.02"; a float in (0, 1]) or a
    size ("148MiB", "160000000"; an int of bytes)."""
    from asyncckpt.planning import parse_bytes

    text = text.strip()
    try:
        share = float(text[:-1]) / 100 if text.endswith("%") else float(text)
    except ValueError:
        share = None
    if share is None or (not text.endswith("%") and share >= 1):
        try:  # argparse would replace its message with a generic one
            return parse_bytes("--memory", text if share is None else int(share))
        except ValueError as exc:
            raise argparse.ArgumentTypeError(str(exc)) from None
    if not 0 < share <= 1:
        raise argparse.ArgumentTypeError(f"--memory share must be in (0, 100%], got {text!r}")
    return share


def memory_bytes(memory: float | int, all_states_bytes: int) -> int:
    """The bytes of a ``--memory`` value, a share of ``all_states_bytes`` or a size."""
    return int(memory * all_states_bytes) if isinstance(memory, float) else memory


def check_disk(directory: Path, nbytes: int) -> None:
    """Refuse to start a run whose Level-2 beyond the budget cannot fit on ``directory``."""
    free = shutil.disk_usage(directory).free
    if free < nbytes * 1.05:
        raise SystemExit(f"--disk {directory}: {nbytes / 2**30:.1f} GiB needed for every state "
                         f"beyond the budget (and 5% spare), {free / 2**30:.1f} GiB free; name "
                         f"another --disk, or lower --nt")


def measure(args: argparse.Namespace, nt: int, disk: Path) -> dict[str, Any]:
    """Every method's gradient at ``nt``, interleaved ``args.repeats`` times; one JSON dict."""
    import psutil
    import pyrevolve
    from examples.seismic.acoustic import wavesolver

    import asyncckpt.compat as compat

    shape = tuple(int(x) for x in args.shape.split("x"))
    solver = _problem(shape, nt, args.space_order)
    rec, u, _ = solver.forward(save=False)
    n = nt - 2
    state_bytes = u._data[0].nbytes * 2  # the checkpoint: two time levels
    # Devito's full history holds one time level per step
    history_bytes = u._data[0].nbytes * nt
    with_history = history_bytes < psutil.virtual_memory().available / 2
    memory = None if args.memory is None else memory_bytes(args.memory, n * state_bytes)
    slots = memory // state_bytes if memory else args.pyrevolve_slots
    if memory is not None:
        if slots < 1:
            raise SystemExit(f"--memory {args.memory} ({memory} bytes) holds no state of "
                             f"{state_bytes} bytes")
        check_disk(disk, (n - slots) * state_bytes)
    last: dict[str, Any] = {}
    u_saved = None

    class PyrevolveWithSlots(pyrevolve.Revolver):  # type: ignore[misc]
        def __init__(self, cp, fwd, rev, n_checkpoints, n_timesteps, **kw):  # type: ignore[no-untyped-def]
            super().__init__(cp, fwd, rev, slots, n_timesteps, **kw)

    class Compat(compat.Revolver):
        def __init__(self, cp, fwd, rev, n_checkpoints, n_timesteps, **kw):  # type: ignore[no-untyped-def]
            if memory is not None:
                kw.update(memory_budget=memory, storage=["dram", disk])
            super().__init__(cp, fwd, rev, n_checkpoints, n_timesteps, **kw)

        def apply_reverse(self) -> None:
            super().apply_reverse()
            last["stats"], last["plan"] = self.stats, self.checkpointer.plan

    def gradient(method: str) -> tuple[float, np.ndarray]:
        nonlocal u_saved
        if method == "full-history":
            if u_saved is None:  # outside the timing
                _, u_saved, _ = solver.forward(save=True)
            start = time.perf_counter()
            grad, _ = solver.jacobian_adjoint(rec, u_saved, checkpointing=False)
            seconds = time.perf_counter() - start
            # a program that checkpoints holds no full history: the others run without it (the
            # loop's collection after every gradient frees it)
            u_saved = None
            return seconds, grad.data.copy()
        wavesolver.Revolver = {"pyrevolve": pyrevolve.Revolver,
                               "pyrevolve-slots": PyrevolveWithSlots}.get(method, Compat)
        base, _, codec = method.partition("+")
        protocol, _, interval = base.partition("-I")
        if protocol == "asyncckpt":  # the default: the runtime decides from the operators
            os.environ.pop("ASYNCCKPT_TAPING", None)
        else:
            os.environ["ASYNCCKPT_TAPING"] = "0" if protocol == "asyncckpt-taping-free" else "1"
        os.environ["ASYNCCKPT_INTERVAL"] = interval or "auto"
        os.environ["ASYNCCKPT_COMPRESSION"] = codec
        start = time.perf_counter()
        # with checkpointing the wavesolver makes its own u (two time levels): none is passed
        grad, _ = solver.jacobian_adjoint(rec, None, checkpointing=True)
        return time.perf_counter() - start, grad.data.copy()

    protocols = ["asyncckpt", "asyncckpt-taping", "asyncckpt-taping-free"]
    fixed = [int(k) for k in args.intervals.split(",") if k.strip()]
    # with --memory, "pyrevolve" is pyrevolve with the same bytes; else its default, and
    # "pyrevolve-slots" beside it
    peer = "pyrevolve-slots" if memory is not None else "pyrevolve"
    methods = (["full-history"] if with_history else []) + [peer]
    if memory is None and slots:
        methods.append("pyrevolve-slots")
    methods += protocols + [f"{protocol}-I{k}" for protocol in protocols for k in fixed]
    codecs = [c.strip() for c in args.compression.split(";") if c.strip()]
    # a codec beside "auto" and beside each fixed interval: with an interval fixed short
    # enough the disk is the bottleneck, which "auto" avoids by recomputing instead
    methods += [f"{protocol}{fix}+{codec}" for protocol in protocols
                for fix in ["", *(f"-I{k}" for k in fixed)] for codec in codecs]
    times: dict[str, list[float]] = {m: [] for m in methods}
    equal = {m: True for m in methods}
    errors: dict[str, dict[str, float]] = {}  # a codec's largest error against the reference
    runs: dict[str, list[dict[str, float]]] = {m: [] for m in methods if "asyncckpt" in m}
    plans: dict[str, Any] = {}
    reference = None
    quiet = _quiet_costs(solver, rec, nt, args.space_order, args.repeats)
    for repeat in range(args.repeats):
        # the first round in the order above (the full history's gradient is the reference);
        # each later one in an order of its own: a method run after another's large free runs
        # slower, and rotating the order (as this did) keeps every method after the same one
        # (auto after pyrevolve every round: 7% slower than interval 0 running the same plan)
        order = list(methods)
        if repeat:
            random.Random(repeat).shuffle(order)
        for method in order:
            seconds, grad = gradient(method)
            # a Revolver's storage freed by the cyclic GC inside the next gradient's timing
            # would be charged to that method
            gc.collect()
            times[method].append(seconds)
            if reference is None:  # the full history, else pyrevolve
                reference = grad
            equal[method] &= bool(np.array_equal(grad, reference))
            if "+" in method:  # with a codec: how far a lossy one moved the gradient
                worst = errors.setdefault(method, {"relative_l2": 0.0, "max_abs_over_max": 0.0})
                for key, value in gradient_error(grad, reference).items():
                    worst[key] = max(worst[key], value)
            if method in runs:
                stats, plans[method] = last.pop("stats"), last.pop("plan")
                calibration = stats.calibration
                runs[method].append({
                    "interval": stats.interval, "l1_slots": stats.l1_slots,
                    "recompute_factor": stats.recompute_factor,
                    "forward_compute_s": stats.forward_compute_s,
                    "reverse_compute_s": stats.reverse_compute_s, "copy_s": stats.copy_s,
                    "stall_s": stats.write_stall_s + stats.read_stall_s,
                    "write_stall_s": stats.write_stall_s, "read_stall_s": stats.read_stall_s,
                    "overhead_s": stats.total_s - stats.forward_compute_s
                    - stats.reverse_compute_s - stats.copy_s,
                    "measured_over_predicted": calibration.get("measured_over_predicted", 0.0),
                    "step_drift": calibration.get("step_drift") or 0.0,
                    "fresh_s": stats.fresh_s,
                    "forward_steps": stats.forward_steps, "reverse_steps": stats.reverse_steps,
                    "copies": stats.copies, "loads_kept": stats.loads_kept,
                    "descriptor_s": stats.descriptor_s,
                    "total_s": stats.total_s, "wall_s": seconds,
                    "taping_free": not stats.taping, "taping_reason": stats.taping_reason,
                    "l2_writes_per_tier": [tier["writes"] for tier in stats.l2_tiers],
                    "compression_ratio": round(stats.compression_ratio, 3),
                    "compress_s": stats.compress_s, "decompress_s": stats.decompress_s,
                    # whether the plan compressed every state ("auto" may decline and sample)
                    "plan_compressed": bool(calibration.get("compressed", False)),
                    "encoded_states": stats.encoded_states,
                })
    median = {m: statistics.median(v) for m, v in times.items()}
    out: dict[str, Any] = {
        "shape": args.shape, "nt": nt, "repeats": args.repeats,
        "state_mib": round(state_bytes / 2**20, 2),
        "seconds": {m: round(v, 3) for m, v in median.items()},
        # every run in order: the first gradients of a process pay for fresh memory
        "runs_s": {m: [round(t, 2) for t in v] for m, v in times.items()},
        "bitwise_equal_to": "full-history" if with_history else peer,
        "bitwise_equal": equal,
        "codec_errors": {m: {k: float(f"{v:.3g}") for k, v in e.items()}
                         for m, e in errors.items()},
        "quiet_s": {k: float(f"{v:.4g}") for k, v in quiet.items()},
    }
    if memory is not None:
        out["memory"] = {
            "bytes": memory, "share_of_all_states": round(memory / (n * state_bytes), 4),
            "pyrevolve_slots": slots,
            # what asyncckpt's plan made of the same bytes: slots, staging and prefetch
            # buffers, DRAM Level-2 states; the rest of Level-2 went to --disk
            "asyncckpt": {m: {"l1_slots": plans[m].l1_slots, "l1_bytes": plans[m].l1_bytes,
                              "interval": plans[m].interval,
                              "level2": list(plans[m].level2),
                              "capacities": list(plans[m].capacities)} for m in protocols},
            "disk": str(disk)}
    floor = quiet["forward_one_call"] + quiet["reverse_call_per_step"]
    out["floor_s"] = round(floor, 3)
    if memory:  # the machine's bound at the same memory (schedules.bound)
        out["bound"] = _bound(n, memory, state_bytes, quiet, disk, args.repeats)
    out["seconds_per_step"] = {m: round(v / n, 6) for m, v in median.items()}
    out["seconds_per_step"]["floor"] = round(floor / n, 6)
    warm_copies = n * quiet["copy_warm"]
    limit = {"asyncckpt-taping-free": floor + warm_copies}
    limit["asyncckpt-taping"] = limit["asyncckpt-taping-free"] + quiet["forward_call_per_step"]
    limit["asyncckpt"] = limit["asyncckpt-taping-free" if runs["asyncckpt"][-1]["taping_free"]
                               else "asyncckpt-taping"]
    out["limit_s"] = {m: round(v, 3) for m, v in limit.items()}
    # "auto" against fixed intervals once memory is warm: "auto" runs first, so its first
    # gradient faults in the memory that every fixed interval's first gradient then reuses
    warm = {m: statistics.median(v[1:] or v) for m, v in times.items()}
    for protocol in protocols if fixed else []:
        best = min(fixed, key=lambda k: warm[f"{protocol}-I{k}"])
        out[f"{protocol}_auto_over_best_fixed"] = {  # within 5% where the ratio is <= 1.05
            "best_interval": best, "ratio": round(warm[protocol] / warm[f"{protocol}-I{best}"], 3),
            "medians_after_the_first_run": True,
            # against each fixed interval in the same rounds; the largest is against the best
            "paired": {k: paired(times[protocol], times[f"{protocol}-I{k}"], skip_first=True)
                       for k in fixed}}
    out[f"{peer}_over_floor"] = round(median[peer] / floor, 3)
    if "bound" in out:
        out[f"{peer}_over_bound"] = round(median[peer] / out["bound"]["total_s"], 3)
    for method in (m for m in methods if "+" in m):  # with a codec: beside the same protocol
        final = runs[method][-1]
        out[f"{method}_over_uncompressed"] = round(
            median[method] / median[method.partition("+")[0]], 3)
        out[f"{method}_last_run"] = {k: final[k] for k in (
            "interval", "l1_slots", "compression_ratio", "compress_s", "decompress_s",
            "plan_compressed", "encoded_states", "write_stall_s", "read_stall_s",
            "l2_writes_per_tier", "total_s")}
    for method in protocols:
        out[f"{peer}_over_{method}"] = round(median[peer] / median[method], 3)
        out[f"{peer}_over_{method}_paired"] = paired(times[peer], times[method])
        if peer != "pyrevolve-slots" and "pyrevolve-slots" in median:
            out[f"pyrevolve{slots}_over_{method}"] = round(
                median["pyrevolve-slots"] / median[method], 3)
        out[f"{method}_over_floor"] = round(median[method] / floor, 3)
        if with_history:
            out[f"{method}_over_full_history"] = round(median[method] / median["full-history"], 3)
        out[f"{method}_over_limit"] = round(median[method] / limit[method], 3)
        if "bound" in out:
            out[f"{method}_over_bound"] = round(median[method] / out["bound"]["total_s"], 3)
        # the last run: where the time went, once costs were learned
        final = runs[method][-1]
        out[f"{method}_last_run"] = {k: v if isinstance(v, (list, str)) else round(float(v), 3)
                                     for k, v in final.items()}
        out[f"{method}_where"] = _where(final, quiet, n)
        # each run's plan: (interval, 0 for Level-1 alone; slots; measured/predicted; faults;
        # a step's cost in the run's second half over its first)
        out[f"{method}_plans"] = [[r["interval"], r["l1_slots"],
                                   round(r["measured_over_predicted"], 2), round(r["fresh_s"], 1),
                                   round(r["step_drift"], 2)]
                                  for r in runs[method]]
    return out


def plot_time_against_n(lines: list[dict[str, Any]], path: Path) -> None:
    """Seconds per step against n for every method and the floor (the paper's Figure 5)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(6.4, 5.0))
    steps = [line["nt"] - 2 for line in lines]
    names = {"pyrevolve-slots": "pyrevolve (Revolve), same bytes",
             "asyncckpt-taping": "asyncckpt, taping", "asyncckpt-taping-free":
             "asyncckpt, taping-free", "full-history": "Devito full history",
             "floor": "floor: forward in one call + reverse calls"}
    for method, label in names.items():
        points = [(s, line["seconds_per_step"][method] * 1e3) for s, line in zip(steps, lines)
                  if method in line["seconds_per_step"]]
        if points:
            ax.plot(*zip(*points), marker="o", label=label,
                    linestyle="--" if method == "floor" else "-")
    memory = lines[0]["memory"]
    ax.set_xlabel("time steps n")
    ax.set_ylabel("milliseconds per step (median)")
    ax.set_title(f"Devito acoustic {lines[0]['shape']}, {lines[0]['state_mib']} MiB states, "
                 f"{memory['bytes'] / 2**20:.0f} MiB for checkpoints", fontsize=9)
    ax.set_ylim(bottom=0)
    # below the axes: inside, it covers the floor's points at the largest n
    ax.legend(fontsize=8, loc="upper center", bbox_to_anchor=(0.5, -0.16), ncol=2)
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=120)
    plt.close(fig)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--shape", default="81x81x81", help="grid points per axis, e.g. 101x101")
    parser.add_argument("--nt", default="772",
                        help="time samples (n = nt - 2 steps); several, comma-separated, give "
                             "time against n at a fixed --memory")
    parser.add_argument("--space-order", type=int, default=4)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--memory", type=parse_memory, default=None,
                        help="equal memory: a share of all states ('2%%', '0.05') or bytes "
                             "('148MiB') for each side's checkpoints")
    parser.add_argument("--disk", type=Path, default=None,
                        help="directory for asyncckpt's Level-2 beyond --memory (default: a "
                             "temporary directory under the system's)")
    parser.add_argument("--plot", type=Path, default=Path("results/devito/time_vs_n.png"),
                        help="with several --nt: the plot's path")
    parser.add_argument("--pyrevolve-slots", type=int, default=20,
                        help="without --memory: pyrevolve with this many slots beside its "
                             "default; 0 skips it")
    parser.add_argument("--compression", default="",
                        help="asyncckpt with these codecs too, ';'-separated as "
                             "$ASYNCCKPT_COMPRESSION spells them, e.g. 'lz4;zstd' "
                             "(default: none)")
    parser.add_argument("--intervals", default="",
                        help="fixed intervals to run beside 'auto', e.g. 1,2,4 (default: none)")
    add_flag(parser)
    args = parser.parse_args()
    nts = sorted({int(x) for x in args.nt.split(",") if x.strip()})
    if len(nts) > 1 and not isinstance(args.memory, int):
        parser.error("several --nt compare at a fixed budget: give --memory in bytes ('148MiB')")

    from devito import configuration

    configuration["log-level"] = "WARNING"
    with tempfile.TemporaryDirectory(prefix="bench-devito-", dir=args.disk) as disk:
        lines = []
        for nt in nts:
            lines.append(measure(args, nt, Path(disk)))
            print(json.dumps(lines[-1]), flush=True)
            record("bench_devito", {**lines[-1], "memory_option": args.memory,
                                    "intervals": args.intervals, "compression": args.compression},
                   ["shape", "nt", "memory_option", "intervals", "compression"], args=args)
    if len(lines) > 1:
        plot_time_against_n(lines, args.plot)
        print(json.dumps({"plot": str(args.plot), "seconds_per_step": {
            line["nt"]: line["seconds_per_step"] for line in lines}}))


if __name__ == "__main__":
    main()
