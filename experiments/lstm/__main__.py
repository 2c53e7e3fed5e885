"""The LSTM experiment of the paper (Section 5): peak memory, time and recompute factor of one
forward+backward pass against sequence length, for standard backpropagation, Revolve (pyrevolve)
and asyncckpt with Level-2 in DRAM, on tmpfs and on disk; and the same LSTM in PyTorch by plain
autograd, torch's per-step checkpoint and asyncckpt's ``checkpoint_scan``.

Every (method, length) runs in a fresh process. Writes results.json, results.csv,
fig4_memory.png and fig5_time.png to --out, and prints a table.

    python -m experiments.lstm --quick          # the README's main job, about 3 minutes
    python -m experiments.lstm --lengths 100 1000 10000 --repeats 5
"""
from __future__ import annotations

import argparse
import csv
import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

import numpy as np
from tqdm import tqdm

from .methods import (JAX, METHODS, ON_DEVICE, TORCH, jax_available, parse_interval,
                      torch_available)
from .report import figures, table

#: the README's main job: about 3 minutes of runs here, the torch methods included (n = 3200
#: would double it; Revolve's recompute factor at 10 slots already grows from 1.76 to 4.15 over
#: this range)
QUICK = {"lengths": [50, 100, 200, 400, 800, 1600], "repeats": 2}
FULL = {"lengths": [100, 200, 400, 800, 1600, 3200, 6400, 12800], "repeats": 5}


def run_worker(method: str, n: int, args: argparse.Namespace, level2_dir: str) -> dict[str, Any]:
    """Run one measurement in a fresh Python process and return its JSON result."""
    command = [sys.executable, "-m", "experiments.lstm.worker", "--method", method, "--n", str(n),
               "--hidden", str(args.hidden), "--batch", str(args.batch), "--slots",
               str(args.slots), "--interval", str(args.interval), "--repeats", str(args.repeats),
               "--kernels", args.kernels, "--level2-dir", level2_dir, "--device", args.device]
    root = Path(__file__).resolve().parents[2]
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(root), env.get("PYTHONPATH")]))
    done = subprocess.run(command, capture_output=True, text=True, env=env, cwd=root)
    if done.returncode != 0:
        raise RuntimeError(f"{method} at n = {n} failed (exit {done.returncode}):\n{done.stderr}")
    return json.loads(done.stdout.strip().splitlines()[-1])


def jax_gradient_errors(results: list[dict[str, Any]], saved: Path) -> None:
    """Give each jax-checkpoint-scan result its gradient's largest difference from jax-scan's
    at the same n, over jax-scan's largest entry (``grad_rel_to_jax_scan``), from the
    gradients the workers saved in ``saved``."""
    for result in results:
        if result["method"] != "jax-checkpoint-scan":
            continue
        ours, reference = (saved / f"gradient-{m}-{result['n']}.npy"
                           for m in ("jax-checkpoint-scan", "jax-scan"))
        if ours.exists() and reference.exists():
            a, b = np.load(ours), np.load(reference)
            result["grad_rel_to_jax_scan"] = float(np.max(np.abs(a - b)) / np.max(np.abs(b)))


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m experiments.lstm",
                                     description=__doc__.split("\n\n")[0],
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--quick", action="store_true",
                        help=f"lengths {QUICK['lengths']}, {QUICK['repeats']} repetitions")
    parser.add_argument("--out", type=Path, default=Path("results/lstm"),
                        help="directory for results and figures (default results/lstm)")
    parser.add_argument("--lengths", type=int, nargs="+", help="sequence lengths")
    parser.add_argument("--methods", nargs="+", choices=list(METHODS),
                        help="methods to run (default: all; on a device, those that run there)")
    parser.add_argument("--hidden", type=int, default=128, help="hidden size H (default 128)")
    parser.add_argument("--batch", type=int, default=16, help="batch size (default 16)")
    parser.add_argument("--slots", type=int, default=10,
                        help="Level-1 slots for Revolve and asyncckpt (default 10)")
    parser.add_argument("--interval", type=parse_interval, default=1,
                        help="asyncckpt interval, 'auto' or 'adaptive' (default 1: the LSTM state "
                             "is small)")
    parser.add_argument("--repeats", type=int, help="passes per process; the minimum is reported")
    parser.add_argument("--kernels", choices=["numba", "numpy"], default="numba")
    parser.add_argument("--device", choices=["cpu", "cuda", "standin"], default="cpu",
                        help="where the model runs: the host, the CUDA device through CuPy "
                             "(Level-1 in device memory, Level-2 pinned), or asyncckpt's CPU "
                             "stand-in for a device (default cpu)")
    parser.add_argument("--disk-dir", type=Path, default=None,
                        help="directory on disk for async-disk (default: a temporary one under "
                             "--out)")
    args = parser.parse_args(argv)
    if args.methods is None:
        args.methods = list(METHODS) if args.device == "cpu" else list(ON_DEVICE)
        if not torch_available():
            print("PyTorch is not installed (pip install asyncckpt[torch]): the torch methods "
                  "are left out", file=sys.stderr)
            args.methods = [m for m in args.methods if m not in TORCH]
        if not jax_available():
            print("JAX is not installed (pip install asyncckpt[jax]): the JAX methods are "
                  "left out", file=sys.stderr)
            args.methods = [m for m in args.methods if m not in JAX]
    elif args.device != "cpu" and set(args.methods) - set(ON_DEVICE):
        parser.error(f"on --device {args.device} the methods are {', '.join(ON_DEVICE)}")
    preset = QUICK if args.quick else FULL
    args.lengths = sorted(set(args.lengths or preset["lengths"]))
    args.repeats = args.repeats or preset["repeats"]
    if min(args.lengths) < 1 or args.repeats < 1 or args.hidden < 1 or args.batch < 1:
        parser.error("lengths, --repeats, --hidden and --batch must be positive")
    args.out.mkdir(parents=True, exist_ok=True)
    disk_root = args.disk_dir or args.out
    results: list[dict[str, Any]] = []
    jobs = [(m, n) for n in args.lengths for m in args.methods]
    with tempfile.TemporaryDirectory(prefix="level2-", dir=disk_root) as level2_dir:
        for method, n in tqdm(jobs, desc="LSTM runs", unit="run"):
            results.append(run_worker(method, n, args, level2_dir))
        jax_gradient_errors(results, Path(level2_dir))
    (args.out / "results.json").write_text(json.dumps(results, indent=1))
    with open(args.out / "results.csv", "w", newline="") as handle:
        keys = sorted({k for r in results for k in r if k != "times_s"})
        writer = csv.DictWriter(handle, fieldnames=keys, extrasaction="ignore")
        writer.writeheader()
        writer.writerows(results)
    paths = figures(results, args.out)
    print(table(results))
    print()
    print(f"every run, every column: {args.out / 'results.csv'}")
    print(f"the same as JSON: {args.out / 'results.json'}")
    for path in paths:
        print(f"figure: {path}")
    print("docs/lstm_experiment.md says how to read them")
    return 0


if __name__ == "__main__":
    sys.exit(main())
