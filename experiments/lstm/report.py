"""Tables, goal checks and figures from the LSTM results."""
from __future__ import annotations

from collections import defaultdict
from pathlib import Path
from typing import Any

__all__ = ["table", "figures", "gradients_line"]

MiB = 2**20
ASYNC = ("async-dram", "async-tmpfs", "async-disk", "async-taping-free", "async-budget")
#: the methods whose Level-2 lives inside the process
IN_PROCESS_LEVEL2 = ("async-dram", "async-taping-free")
#: the PyTorch methods: bit for bit equal among themselves, not to numpy's (torch rounds
#: differently)
TORCH = ("torch-backprop", "torch-checkpoint", "torch-scan")
#: the JAX methods: checkpoint_scan's gradients against jax.grad of lax.scan's, within the
#: relative difference each run reports (the closed-over parameters' sums associate
#: differently, segment by segment)
JAX = ("jax-scan", "jax-checkpoint-scan")


def _family(method: str) -> str:
    return "torch" if method in TORCH else "jax" if method in JAX else "numpy"


def _by_method(results: list[dict[str, Any]]) -> dict[str, dict[int, dict[str, Any]]]:
    out: dict[str, dict[int, dict[str, Any]]] = defaultdict(dict)
    for r in results:
        out[r["method"]][r["n"]] = r
    return out


def working_memory(result: dict[str, Any]) -> float:
    """Peak RSS, less the Level-2 bytes where Level-2 is in the process (DRAM)."""
    rss = result["peak_rss_bytes"]
    return rss - result.get("level2_bytes", 0) if result["method"] in IN_PROCESS_LEVEL2 else rss


#: methods by family, for tables and figure panels with a few lines each
GROUPS = {
    "numpy baselines": ("backprop", "store-all", "revolve", "revolve-budget"),
    "asyncckpt": ASYNC,
    "PyTorch": TORCH,
    "JAX": JAX,
}
#: pyrevolve against asyncckpt: the same Level-1 slots (asyncckpt's staging and prefetch
#: buffers beside them), then the same bytes (the budget, asyncckpt's buffers and DRAM Level-2
#: inside it)
PYREVOLVE_PAIRS = (("revolve", "async-disk"), ("revolve-budget", "async-budget"))


def _rows(header: list[str], rows: list[list[str]], text_columns: int = 1) -> list[str]:
    """``rows`` under ``header``, the first column and the last ``text_columns - 1`` left
    aligned, the numbers right aligned."""
    widths = [max(len(r[i]) for r in [header, *rows]) for i in range(len(header))]
    trailing = text_columns - 1
    align = ([str.ljust] + [str.rjust] * (len(header) - 1 - trailing)
             + [str.ljust] * trailing)
    return ["  " + "  ".join(f(c, w) for f, c, w in zip(align, r, widths)).rstrip()
            for r in [header, *rows]]


def gradients_line(results: list[dict[str, Any]]) -> str:
    """Whether every method's gradients equal its family's reference bit for bit at each n (and
    on a line of its own, how close jax-checkpoint-scan's are to jax-scan's)."""
    hashes: dict[tuple[str, int], set[str]] = defaultdict(set)
    for r in results:
        if _family(r["method"]) != "jax":
            hashes[(_family(r["method"]), r["n"])].add(r["gradient_xxh3"])
    verdict = {}
    for (family, _), found in hashes.items():
        verdict[family] = verdict.get(family, True) and len(found) == 1
    names = {"numpy": "numpy = backprop", "torch": "torch = torch-backprop"}
    line = "gradients bit for bit at every n: " + "; ".join(
        f"{names[f]}: {'yes' if ok else 'NO'}" for f, ok in sorted(verdict.items()))
    errors = [r["grad_rel_to_jax_scan"] for r in results if "grad_rel_to_jax_scan" in r]
    if errors:
        line += (f"\ngradients at every n: jax-checkpoint-scan = jax-scan within "
                 f"{max(errors):.1e} of the largest entry")
    return line


def table(results: list[dict[str, Any]]) -> str:
    """The report: three short tables, one per question (how much time, how much memory,
    against pyrevolve at equal memory), each under 100 columns; the full table is the CSV."""
    by = _by_method(results)
    lengths = sorted({r["n"] for r in results})
    lo, hi = lengths[0], lengths[-1]
    first = results[0]
    lines = [f"LSTM, one forward+backward pass: hidden {first['hidden']}, batch "
             f"{first['batch']}, {first['slots']} Level-1 slots, n = {lo} to {hi}",
             gradients_line(results), "",
             f"How much time? At n = {hi}, over standard backpropagation (lower is better)"]
    reference = {"numpy": by.get("backprop", {}).get(hi),
                 "torch": by.get("torch-backprop", {}).get(hi),
                 "jax": by.get("jax-scan", {}).get(hi)}
    rows = []
    for group, methods in GROUPS.items():
        for m in methods:
            r = by.get(m, {}).get(hi)
            if r is None:
                continue
            base = reference[_family(m)]
            over = f"{r['time_s'] / base['time_s']:.2f}" if base else "-"
            rows.append([m, f"{r['time_s']:.3f}", over, f"{r['recompute_factor']:.2f}", group])
    lines += _rows(["method", "seconds", "/ backprop", "recompute", "family"], rows,
                   text_columns=2)
    lines += ["", "How much memory? Peak resident MiB at each n (flat in n is the promise; "
                  "DRAM Level-2", "inside the process subtracted where it is unbounded)"]
    rows = []
    for methods in GROUPS.values():
        for m in methods:
            runs = by.get(m)
            if not runs or lo not in runs or hi not in runs:
                continue
            rows.append([m] + [f"{working_memory(runs[n]) / MiB:.0f}" if n in runs else "-"
                               for n in lengths]
                        + [f"{working_memory(runs[hi]) / working_memory(runs[lo]):.2f}"])
    lines += _rows(["method", *map(str, lengths), f"{hi} / {lo}"], rows)
    on_device = [m for m in by if by[m].get(hi, {}).get("device", "cpu") != "cpu"
                 and by[m].get(lo, {}).get("device_peak_bytes")]
    if on_device:
        lines += ["", "Device memory at its peak, MiB (asyncckpt flat in n; backprop keeps "
                      "every step there)"]
        lines += _rows(["method", *map(str, lengths)],
                       [[m] + [f"{by[m][n]['device_peak_bytes'] / MiB:.1f}" if n in by[m]
                               else "-" for n in lengths] for m in on_device])
    pairs = [(a, b) for a, b in PYREVOLVE_PAIRS if a in by and b in by]
    if pairs:
        lines += ["", "Against pyrevolve: pyrevolve seconds / asyncckpt seconds (higher is "
                      "better)"]
        rows = [[f"{a} / {b}"] + [f"{by[a][n]['time_s'] / by[b][n]['time_s']:.2f}"
                                  if n in by[a] and n in by[b] else "-" for n in lengths]
                for a, b in pairs]
        lines += _rows(["pyrevolve / asyncckpt", *map(str, lengths)], rows)
        lines.append("  (revolve / async-disk: the same Level-1 slots, asyncckpt also holding "
                     "its staging and")
        lines.append("  prefetch buffers and Level-2 on disk; revolve-budget / async-budget: "
                     "equal memory, the")
        lines.append("  same memory_budget bytes for both, asyncckpt's Level-2 beyond them on "
                     "disk)")
    return "\n".join(lines)


def figures(results: list[dict[str, Any]], out: Path) -> list[Path]:
    """Write Figure 4 (peak memory against n) and Figure 5 (time against n) as PNG files, each
    a row of panels, one per family of methods (:data:`GROUPS`), with backprop as the dashed
    reference in every panel; return their paths."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    by = _by_method(results)
    groups = {name: [m for m in methods if m in by] for name, methods in GROUPS.items()}
    groups = {name: methods for name, methods in groups.items() if methods}
    reference = {"numpy": by.get("backprop"), "torch": by.get("torch-backprop"),
                 "jax": by.get("jax-scan")}
    labels = {"numpy": "backprop", "torch": "torch-backprop", "jax": "jax-scan"}
    markers = "osD^vxP*h"

    def panels(value: Any, ylabel: str, title: str, path: Path, log_y: bool) -> Path:
        fig, axes = plt.subplots(1, len(groups), figsize=(4.2 * len(groups), 4.2), sharey=True,
                                 squeeze=False)
        for ax, (name, methods) in zip(axes[0], groups.items()):
            family = _family(methods[0])
            base = reference[family]
            if base and methods[0] != labels[family]:
                ns = sorted(base)
                ax.plot(ns, [value(base[n]) for n in ns], "k--", lw=1, label=labels[family])
            if name == "asyncckpt" and "revolve" in by:  # what the paper measures it against
                ns = sorted(by["revolve"])
                ax.plot(ns, [value(by["revolve"][n]) for n in ns], ":", color="0.4", lw=1.5,
                        label="revolve (pyrevolve)")
            for k, m in enumerate(methods):
                ns = sorted(by[m])
                ax.plot(ns, [value(by[m][n]) for n in ns], marker=markers[k % len(markers)],
                        label=m)
            ax.set_title(name)
            ax.set_xscale("log")
            if log_y:
                ax.set_yscale("log")
            ax.set_xlabel("sequence length n")
            ax.grid(True, alpha=0.3)
            ax.legend(fontsize=8)
        axes[0][0].set_ylabel(ylabel)
        fig.suptitle(title)
        fig.tight_layout()
        fig.savefig(path, dpi=110)
        plt.close(fig)
        return path

    memory = panels(lambda r: working_memory(r) / MiB,
                    "peak resident memory (MiB; DRAM Level-2 subtracted)",
                    "Fig. 4: peak memory of one forward+backward pass (lower and flatter is better)",
                    out / "fig4_memory.png", log_y=False)
    time = panels(lambda r: r["time_s"], "seconds (min of repetitions)",
                  "Fig. 5: time of one forward+backward pass (lower is better)",
                  out / "fig5_time.png", log_y=True)
    return [memory, time]
