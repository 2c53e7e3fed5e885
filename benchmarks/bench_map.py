"""Where multistage pays: pyrevolve / asyncckpt on Devito's acoustic gradient against the memory
share, for several shapes and lengths, both protocols, at equal memory; a table and a figure.

Each point is one run of ``bench_devito.py --memory SHARE --intervals ...`` in a process of its
own (Devito's operators and the process pool start cold for every point, as for a user's
program), so every ratio is measured side by side in one process: pyrevolve with as many slots
as whole states fit in the share, asyncckpt with the share as ``memory_budget`` (Level-1 slots,
staging and prefetch buffers and DRAM Level-2 together) and Level-2 beyond it on ``--disk``.
For each point and protocol the table gives pyrevolve / asyncckpt "auto" (above 1: asyncckpt is
faster), "auto" over the best fixed interval (interval 0, Revolve in the budget's slots alone,
included; the runs after each method's first), the plan "auto" ran last and its measured /
predicted seconds. Ratios are medians over rounds of the two methods' times in the same round
(every method runs once per round): whole rounds run up to 25% faster or slower than others on
a shared machine, which a ratio of medians takes for a difference between methods; the best
fixed interval is the one "auto" is slowest beside. The figure plots the first ratio against
the share, one panel per workload: a user reads where multistage pays and where Revolve in
memory is the right choice.

Usage: python benchmarks/bench_map.py [--workloads 81x81x81:772,97x57x77:1083,301x301:3000]
       [--shares 0.5%,1%,2%,5%,10%,25%] [--intervals 0,2,4,8,16] [--repeats 3] [--disk DIR]
       [--out results/map]
Needs the ``devito`` extra (``pip install -e '.[devito]'``); a full map takes hours on two
cores: pass fewer workloads or shares for a quick look.
"""
from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _results import NO_RECORD, add_flag, record  # noqa: E402

HERE = Path(__file__).resolve().parent
PROTOCOLS = ("asyncckpt-taping", "asyncckpt-taping-free")


def run_point(shape: str, nt: int, share: str, args: argparse.Namespace) -> dict[str, Any]:
    """One point of the map: bench_devito's JSON line for ``shape``, ``nt`` and ``share``."""
    command = [sys.executable, str(HERE / "bench_devito.py"), "--shape", shape, "--nt", str(nt),
               "--memory", share, "--intervals", args.intervals, "--repeats",
               str(args.repeats)]
    if args.disk is not None:
        command += ["--disk", str(args.disk)]
    # the map records its points; its bench_devito children do not record theirs
    done = subprocess.run(command, capture_output=True, text=True, check=False,
                          env={**os.environ, NO_RECORD: "1"})
    if done.returncode != 0:
        raise SystemExit(f"{' '.join(command)} failed:\n{done.stderr[-3000:]}")
    return json.loads(done.stdout.strip().splitlines()[-1])


def summary(line: dict[str, Any]) -> dict[str, Any]:
    """What the map keeps of one point: per protocol the ratios and the plan "auto" ran."""
    point: dict[str, Any] = {"shape": line["shape"], "nt": line["nt"],
                             "share": line["memory"]["share_of_all_states"],
                             "state_mib": line["state_mib"],
                             "pyrevolve_slots": line["memory"]["pyrevolve_slots"],
                             "bitwise": all(line["bitwise_equal"].values())}
    for protocol in PROTOCOLS:
        best = line.get(f"{protocol}_auto_over_best_fixed", {})
        # each fixed interval against "auto" in the same rounds; the best is the one "auto"
        # is slowest beside
        pairs = {int(k): v for k, v in best.get("paired", {}).items()}
        worst = max(pairs, key=pairs.__getitem__) if pairs else None
        interval, slots, ratio, _, _ = line[f"{protocol}_plans"][-1]
        point[protocol] = {
            "pyrevolve_over_auto": line[f"pyrevolve-slots_over_{protocol}_paired"],
            "pyrevolve_over_auto_of_medians": line[f"pyrevolve-slots_over_{protocol}"],
            "auto_over_best_fixed": None if worst is None else pairs[worst],
            "best_interval": worst,
            "auto_over_best_fixed_of_medians": best.get("ratio"),
            "auto_plan": [interval, slots],
            "measured_over_predicted": ratio}
    return point


def table(points: list[dict[str, Any]]) -> str:
    """The map as a Markdown table, one row per point and protocol."""
    rows = ["| workload | share | protocol | pyrevolve / auto | auto / best fixed (best I) | "
            "auto ran (I, slots) | measured / predicted |",
            "|---|---|---|---|---|---|---|"]
    for point in points:
        for protocol in PROTOCOLS:
            p = point[protocol]
            best = ("-" if p["auto_over_best_fixed"] is None
                    else f"{p['auto_over_best_fixed']:.3f} ({p['best_interval']})")
            rows.append(
                f"| {point['shape']}, nt {point['nt']} | {point['share']:.1%} | "
                f"{protocol.removeprefix('asyncckpt-')} | {p['pyrevolve_over_auto']:.3f} | {best} "
                f"| {p['auto_plan'][0]}, {p['auto_plan'][1]} | "
                f"{p['measured_over_predicted']:.2f} |")
    return "\n".join(rows)


def plot(points: list[dict[str, Any]], path: Path) -> None:
    """pyrevolve / asyncckpt "auto" against the share, a panel per workload."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    import matplotlib.ticker

    workloads = list(dict.fromkeys((p["shape"], p["nt"]) for p in points))
    fig, axes = plt.subplots(1, len(workloads), figsize=(4.2 * len(workloads), 3.8),
                             squeeze=False, sharey=True)
    for ax, (shape, nt) in zip(axes[0], workloads):
        mine = sorted((p for p in points if (p["shape"], p["nt"]) == (shape, nt)),
                      key=lambda p: p["share"])
        for protocol, marker in zip(PROTOCOLS, "os"):
            ax.plot([p["share"] * 100 for p in mine],
                    [p[protocol]["pyrevolve_over_auto"] for p in mine], marker=marker,
                    label=protocol.removeprefix("asyncckpt-"))
        ax.axhline(1.0, color="grey", linestyle="--", linewidth=1)
        ax.set_xscale("log")
        # the shares measured as the ticks, in plain numbers (a log axis labels 3x10^0)
        shares = [p["share"] * 100 for p in mine]
        ax.set_xticks(shares, [f"{share:g}" for share in shares])
        ax.xaxis.set_minor_formatter(matplotlib.ticker.NullFormatter())
        ax.set_xlabel("memory for checkpoints, % of all states")
        ax.set_title(f"{shape}, nt {nt} ({mine[0]['state_mib']} MiB states)", fontsize=9)
    axes[0][0].set_ylabel("pyrevolve / asyncckpt \"auto\" (above 1: faster)")
    axes[0][0].legend(fontsize=8)
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=120)
    plt.close(fig)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--workloads", default="81x81x81:772,97x57x77:1083,301x301:3000",
                        help="comma-separated SHAPE:NT")
    parser.add_argument("--shares", default="0.5%,1%,2%,5%,10%,25%")
    parser.add_argument("--intervals", default="0,2,4,8,16")
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--disk", type=Path, default=None)
    parser.add_argument("--out", type=Path, default=Path("results/map"))
    add_flag(parser)
    args = parser.parse_args()
    workloads = [(w.split(":")[0], int(w.split(":")[1])) for w in args.workloads.split(",")]
    shares = [s.strip() for s in args.shares.split(",") if s.strip()]
    args.out.mkdir(parents=True, exist_ok=True)
    points, lines = [], []
    for shape, nt in workloads:
        for share in shares:
            lines.append(run_point(shape, nt, share, args))
            points.append(summary(lines[-1]))
            print(json.dumps(points[-1]), flush=True)
            record("bench_map", {**points[-1], "intervals": args.intervals},
                   ["shape", "nt", "share", "intervals"], args=args)
    (args.out / "map.json").write_text(json.dumps(points, indent=1))
    # every point's whole bench_devito line: its plans, costs and where each run's time went
    (args.out / "lines.json").write_text(json.dumps(lines, indent=1))
    (args.out / "map.md").write_text(table(points) + "\n")
    plot(points, args.out / "map.png")
    print(table(points))
    print(json.dumps({"table": str(args.out / "map.md"), "figure": str(args.out / "map.png")}))


if __name__ == "__main__":
    main()
