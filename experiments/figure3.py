"""The paper's Figure 3 from the performance model: predicted time of one forward+reverse pass
against n, for Revolve and for asynchronous multistage checkpointing at several intervals.

    python -m experiments.figure3 --out results/figure3.png [--tf 1 --tb 2 --slots 10]
        [--measured results.json]

``--measured`` overlays measured points: a JSON list of {"strategy", "n", "time_s"} (for
example written by benchmarks/bench_model.py), with strategy "revolve" or "async-I".
"""
from __future__ import annotations

import argparse
import json
from pathlib import Path

import numpy as np

from schedules.model import Costs, predict_async_multistage, predict_revolve, predict_store_all


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", type=Path, default=Path("results/figure3.png"),
                        help="where the figure goes (default results/figure3.png, under the "
                             "current directory)")
    parser.add_argument("--tf", type=float, default=1.0,
                        help="seconds per forward step (default 1)")
    parser.add_argument("--tb", type=float, default=2.0,
                        help="seconds per reverse step (default 2)")
    parser.add_argument("--slots", type=int, default=10, help="Level-1 slots s (default 10)")
    parser.add_argument("--intervals", type=int, nargs="+", default=[10, 100, 1000],
                        help="intervals I to draw (default 10 100 1000)")
    parser.add_argument("--n-max", type=int, default=100000,
                        help="the longest run drawn (default 100000)")
    parser.add_argument("--measured", type=Path, help="JSON of measured points to overlay")
    args = parser.parse_args(argv)

    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    costs = Costs(tf=args.tf, tb=args.tb)
    ns = np.unique(np.geomspace(10, args.n_max, 60).astype(int))
    store_all = np.array([predict_store_all(int(n), costs).total_s for n in ns])
    fig, ax = plt.subplots(figsize=(7, 4.5))
    revolve = [predict_revolve(int(n), args.slots, costs).total_s for n in ns]
    ax.plot(ns, revolve / store_all, "C3-", label=f"Revolve, s = {args.slots}")
    for k, interval in enumerate(args.intervals):
        ok = ns >= interval
        times = [predict_async_multistage(int(n), interval, args.slots, costs).total_s
                 for n in ns[ok]]
        ax.plot(ns[ok], times / store_all[ok], f"C{k}-", label=f"asynchronous, I = {interval}")
    if args.measured:
        for point in json.loads(args.measured.read_text()):
            reference = predict_store_all(point["n"], costs).total_s
            marker = "C3^" if point["strategy"] == "revolve" else "ko"
            ax.plot(point["n"], point["time_s"] / point.get("store_all_s", reference), marker)
    ax.set_xscale("log")
    ax.set_xlabel("time steps n")
    ax.set_ylabel("predicted time / time without memory limit")
    ax.set_title(f"Fig. 3: the model, tb = {args.tb / args.tf:g} tf, transfers hidden")
    ax.grid(True, alpha=0.3)
    ax.legend()
    fig.tight_layout()
    args.out.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(args.out, dpi=120)
    print(f"figure: {args.out}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
