"""The command line: ``python -m asyncckpt {simulate,tune,bench-storage}``."""
from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence

from schedules import AsyncMultistage, Revolve, simulate
from schedules.model import (
    Costs,
    choose_interval,
    predict_async_multistage,
    predict_revolve,
    predict_store_all,
)

__all__ = ["main", "build_parser"]


def _positive_int(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a positive integer, got {text!r}") from None
    if value < 1:
        raise argparse.ArgumentTypeError(f"expected a positive integer, got {value}")
    return value


def _seconds(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a time in seconds, got {text!r}") from None
    if not value >= 0:
        raise argparse.ArgumentTypeError(f"expected a time >= 0 seconds, got {text!r}")
    return value


def _table(rows: list[list[str]], header: list[str]) -> str:
    widths = [max(len(r[i]) for r in rows + [header]) for i in range(len(header))]
    line = "  ".join(h.rjust(w) for h, w in zip(header, widths))
    body = ["  ".join(c.rjust(w) for c, w in zip(r, widths)) for r in rows]
    return "\n".join([line, "  ".join("-" * w for w in widths), *body])


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
    print(_table(rows, ["strategy", "interval", "forward steps", "F/n", "predicted s",
                        "vs store-all"]))
    best = choose_interval(n, slots, costs)
    print(f"best interval by the model: {best.interval} "
          f"({best.prediction.total_s / store_all.total_s:.3f} x store-all, "
          f"{revolve.total_s / best.prediction.total_s:.2f} x faster than Revolve)")
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
    sim.add_argument("--n", type=_positive_int, default=1000, help="time steps (default 1000)")
    sim.add_argument("--l1-slots", type=_positive_int, default=10,
                     help="Level-1 checkpoint slots (default 10)")
    sim.add_argument("--interval", type=_positive_int, action="append",
                     help="an interval to show (repeatable; default 1, 2, 5, 10, ... up to n)")
    sim.add_argument("--tf", type=_seconds, default=1.0, help="seconds per forward step (default 1)")
    sim.add_argument("--tb", type=_seconds, default=2.0,
                     help="seconds per reverse step, its taping step included (default 2)")
    sim.add_argument("--tw", type=_seconds, default=0.0, help="seconds to write a state to Level-2")
    sim.add_argument("--tr", type=_seconds, default=0.0, help="seconds to read a state back")
    sim.set_defaults(func=cmd_simulate)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    """Run the command line; return the exit status."""
    parser = build_parser()
    args = parser.parse_args(argv)
    try:
        return int(args.func(args))
    except ValueError as exc:
        parser.error(str(exc))
        return 2
