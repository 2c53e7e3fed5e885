"""Tables, goal checks and figures from the LSTM results."""
from __future__ import annotations

from collections import defaultdict
from pathlib import Path
from typing import Any

__all__ = ["table", "goals", "figures"]

MiB = 2**20
ASYNC = ("async-dram", "async-tmpfs", "async-disk", "async-taping-free", "async-budget")
#: the methods whose Level-2 lives inside the process
IN_PROCESS_LEVEL2 = ("async-dram", "async-taping-free")
#: the PyTorch methods: bit for bit equal among themselves, not to numpy's (torch rounds
#: differently)
TORCH = ("torch-backprop", "torch-checkpoint", "torch-scan")


def _family(method: str) -> str:
    return "torch" if method in TORCH else "numpy"


def _by_method(results: list[dict[str, Any]]) -> dict[str, dict[int, dict[str, Any]]]:
    out: dict[str, dict[int, dict[str, Any]]] = defaultdict(dict)
    for r in results:
        out[r["method"]][r["n"]] = r
    return out


def working_memory(result: dict[str, Any]) -> float:
    """Peak RSS, less the Level-2 bytes where Level-2 is in the process (DRAM)."""
    rss = result["peak_rss_bytes"]
    return rss - result.get("level2_bytes", 0) if result["method"] in IN_PROCESS_LEVEL2 else rss


def table(results: list[dict[str, Any]]) -> str:
    """One row per length: per method time (s), peak RSS (MiB) and recompute factor; and whether
    every method's gradients equal backprop's bit for bit (the torch methods: torch-backprop's)."""
    methods = list(dict.fromkeys(r["method"] for r in results))
    by = _by_method(results)
    lengths = sorted({r["n"] for r in results})
    header = ["n"] + [f"{m} s / MiB / rf" for m in methods] + ["grads equal"]
    rows = []
    for n in lengths:
        row = [str(n)]
        hashes: dict[str, set[str]] = defaultdict(set)
        for m in methods:
            r = by[m].get(n)
            if r is None:
                row.append("-")
                continue
            hashes[_family(m)].add(r["gradient_xxh3"])
            row.append(f"{r['time_s']:.3f} / {r['peak_rss_bytes'] / MiB:.0f} / "
                       f"{r['recompute_factor']:.2f}")
        distinct = {family: len(h) for family, h in hashes.items()}
        row.append("yes" if set(distinct.values()) == {1} else "NO (" + ", ".join(
            f"{family}: {count} distinct" for family, count in distinct.items()) + ")")
        rows.append(row)
    widths = [max(len(x[i]) for x in rows + [header]) for i in range(len(header))]
    lines = ["  ".join(h.rjust(w) for h, w in zip(header, widths)),
             "  ".join("-" * w for w in widths)]
    lines += ["  ".join(c.rjust(w) for c, w in zip(row, widths)) for row in rows]
    return "\n".join(lines)


def goals(results: list[dict[str, Any]]) -> str:
    """The issue's goals, computed from the results (ratios, no thresholds hidden)."""
    by = _by_method(results)
    lengths = sorted({r["n"] for r in results})
    lo, hi = lengths[0], lengths[-1]
    lines = [f"memory, peak RSS at n = {hi} / at n = {lo} ({hi // lo}x range; goal <= 1.05 "
             "for asyncckpt; async-dram and async-taping-free less their DRAM Level-2 bytes, "
             "async-budget with everything it holds):"]
    for m in by:
        if lo in by[m] and hi in by[m]:
            ratio = working_memory(by[m][hi]) / working_memory(by[m][lo])
            lines.append(f"  {m:12s} {ratio:6.3f}")

    def time_ratios(title: str, baseline: str, baseline_on_top: bool = False,
                    methods: tuple[str, ...] = ASYNC) -> None:
        pairs = [(m, by[m][hi]["time_s"], by[baseline][hi]["time_s"]) for m in methods
                 if hi in by.get(m, {}) and hi in by.get(baseline, {})]
        if pairs:
            lines.append(f"time at n = {hi}, {title}:")
            lines.extend(f"  {m:12s} {(b / a if baseline_on_top else a / b):6.3f}"
                         for m, a, b in pairs)

    on_device = [m for m in by if by[m].get(hi, {}).get("device", "cpu") != "cpu"]
    if on_device:
        lines.append(f"device memory at its peak, n = {hi} / n = {lo} (asyncckpt: flat in n; "
                     "backprop keeps every step's activations there):")
        for m in on_device:
            if lo in by[m] and by[m][lo].get("device_peak_bytes"):
                ratio = by[m][hi]["device_peak_bytes"] / by[m][lo]["device_peak_bytes"]
                lines.append(f"  {m:12s} {ratio:6.3f}  ({by[m][hi]['device_peak_bytes'] / MiB:.1f}"
                             " MiB)")
    time_ratios("asyncckpt / store-all under the same protocol (goal <= 1.05)", "store-all",
                methods=ASYNC[:3])
    time_ratios("asyncckpt / standard backpropagation (with taping, each reverse step re-runs "
                "its forward step; taping-free, goal <= 1.10)", "backprop")
    time_ratios("Revolve (pyrevolve) / asyncckpt (goal >= 1.5)", "revolve", baseline_on_top=True)
    time_ratios("PyTorch, checkpointed / plain autograd (both run every step twice; "
                "torch-scan within a budget, torch-checkpoint keeping every carry)",
                "torch-backprop", methods=TORCH[1:])
    return "\n".join(lines)


def figures(results: list[dict[str, Any]], out: Path) -> list[Path]:
    """Write Figure 4 (peak memory vs length) and Figure 5 (time and recompute factor vs
    length) as PNG files; return their paths."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    by = _by_method(results)
    style = {"backprop": "k-o", "store-all": "C7--s", "revolve": "C3-^", "async-dram": "C0-D",
             "async-tmpfs": "C2-v", "async-disk": "C1-x", "async-taping-free": "C4-P",
             "async-budget": "C5-*", "torch-backprop": "C8-o", "torch-checkpoint": "C9--s",
             "torch-scan": "C6-h"}

    fig, ax = plt.subplots(figsize=(7, 4.5))
    for m, runs in by.items():
        ns = sorted(runs)
        ax.plot(ns, [runs[n]["peak_rss_bytes"] / MiB for n in ns], style.get(m, "-o"), label=m)
        if m in IN_PROCESS_LEVEL2:
            ax.plot(ns, [working_memory(runs[n]) / MiB for n in ns], style[m][:2] + ":",
                    label=f"{m} less Level-2")
    ax.set_xscale("log")
    ax.set_xlabel("sequence length n (time steps)")
    ax.set_ylabel("peak resident memory (MiB)")
    ax.set_title("Fig. 4: peak memory of one forward+backward pass")
    ax.grid(True, alpha=0.3)
    ax.legend(fontsize=8)
    fig.tight_layout()
    memory_path = out / "fig4_memory.png"
    fig.savefig(memory_path, dpi=120)
    plt.close(fig)

    fig, (left, right) = plt.subplots(1, 2, figsize=(11, 4.5))
    for m, runs in by.items():
        ns = sorted(runs)
        left.plot(ns, [runs[n]["time_s"] for n in ns], style.get(m, "-o"), label=m)
        right.plot(ns, [runs[n]["recompute_factor"] for n in ns], style.get(m, "-o"), label=m)
    for ax, ylabel in ((left, "time, min of repetitions (s)"), (right, "recompute factor")):
        ax.set_xscale("log")
        ax.set_xlabel("sequence length n (time steps)")
        ax.set_ylabel(ylabel)
        ax.grid(True, alpha=0.3)
    left.set_yscale("log")
    left.set_title("Fig. 5a: time of one forward+backward pass")
    right.set_title("Fig. 5b: recompute factor (forward steps - n) / n")
    right.legend(fontsize=8)
    fig.tight_layout()
    time_path = out / "fig5_time.png"
    fig.savefig(time_path, dpi=120)
    plt.close(fig)
    return [memory_path, time_path]
