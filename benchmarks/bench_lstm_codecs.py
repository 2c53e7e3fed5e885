"""Compression on the LSTM experiment's model: asyncckpt with Level-2 on the disk, states
uncompressed and through each codec, interleaved in one process, one JSON line.

The taping-free checkpoint of ``experiments.lstm`` (a step's activations, dense float64) is the
state. Every method runs the same checkpointer settings but ``compression``; for each: the
median time over the uncompressed one's, each run's plan (interval, Level-2 writes, the
compression ratio of what they stored: "auto" may keep a run in Level-1 alone), and the
gradient's largest error over the runs against standard backpropagation's (relative L2, and the
largest absolute difference over the largest magnitude): 0 for a lossless codec, the price of a
lossy one.

Usage: python benchmarks/bench_lstm_codecs.py [--n 1600] [--hidden 128] [--batch 16]
       [--budget 4MiB] [--disk DIR] [--repeats 3] [--codecs 'lz4;zstd;zfp:tolerance=1e-6']
"""
from __future__ import annotations

import argparse
import json
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
sys.path.insert(0, str(Path(__file__).resolve().parent))
from _common import gradient_error  # noqa: E402
from _results import add_flag, record  # noqa: E402

from asyncckpt import AsyncCheckpointer  # noqa: E402
from asyncckpt.compression import parse_compression  # noqa: E402
from experiments.lstm.corpus import load_corpus  # noqa: E402
from experiments.lstm.methods import run_method  # noqa: E402
from experiments.lstm.model import (LSTM, StepCheckpoint, StepForwardOperator,  # noqa: E402
                                    StepReverseOperator)

DEFAULT_CODECS = "lz4;zstd;zfp:tolerance=1e-6;zfp:tolerance=1e-3;auto"


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--n", type=int, default=1600, help="sequence length (default 1600)")
    parser.add_argument("--hidden", type=int, default=128)
    parser.add_argument("--batch", type=int, default=16)
    parser.add_argument("--budget", default="4MiB",
                        help="memory_budget; Level-2 beyond it on --disk (default 4MiB)")
    parser.add_argument("--disk", type=Path, default=Path(tempfile.gettempdir()))
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--codecs", default=DEFAULT_CODECS,
                        help=f"';'-separated compression= values (default {DEFAULT_CODECS!r})")
    add_flag(parser)
    args = parser.parse_args()

    model = LSTM(load_corpus(), args.n, hidden=args.hidden, batch=args.batch)
    run_method("backprop", model)
    reference = model.gradient_vector()
    codecs = [c.strip() for c in args.codecs.split(";") if c.strip()]
    methods = {"uncompressed": None}
    methods.update({c: parse_compression("--codecs", c) for c in codecs})
    times: dict[str, list[float]] = {m: [] for m in methods}
    out: dict[str, Any] = {"n": args.n, "hidden": args.hidden, "batch": args.batch,
                           "budget": args.budget, "repeats": args.repeats, "methods": {}}
    with tempfile.TemporaryDirectory(prefix="bench-lstm-codecs-", dir=args.disk) as disk:
        checkpointers: dict[str, AsyncCheckpointer] = {}
        try:
            model.reset()
            model.step(0)  # u_0 of the taping-free checkpoint
            out["state_kib"] = StepCheckpoint(model).nbytes / 1024
            for name, compression in methods.items():
                checkpointers[name] = AsyncCheckpointer(
                    StepCheckpoint(model), StepForwardOperator(model), StepReverseOperator(model),
                    args.n, taping=False, memory_budget=args.budget, storage=["dram", disk],
                    compression=compression)
            for attempt in range(args.repeats + 1):  # the first run of each calibrates
                for name, ckp in checkpointers.items():
                    model.reset()
                    start = time.perf_counter()
                    model.step(0)
                    ckp.apply_forward()
                    ckp.apply_reverse()
                    seconds = time.perf_counter() - start
                    if attempt:
                        times[name].append(seconds)
                    stats = ckp.stats
                    report = out["methods"].setdefault(name, {"relative_l2": 0.0,
                                                              "max_abs_over_max": 0.0})
                    for key, value in gradient_error(model.gradient_vector(), reference).items():
                        report[key] = max(report[key], value)
                    # each run's plan: interval (0: Level-1 alone), Level-2 writes, the
                    # ratio of what they stored
                    report.setdefault("plans", []).append(
                        [stats.interval, stats.l2_writes, round(stats.compression_ratio, 3)])
        finally:
            for ckp in checkpointers.values():
                ckp.close()
    base = statistics.median(times["uncompressed"])
    for name, report in out["methods"].items():
        median = statistics.median(times[name])
        report["seconds"] = round(median, 4)
        report["over_uncompressed"] = round(median / base, 3)
        report["relative_l2"] = float(f"{report['relative_l2']:.3g}")
        report["max_abs_over_max"] = float(f"{report['max_abs_over_max']:.3g}")
    print(json.dumps(out))
    record("bench_lstm_codecs", out, ["n", "hidden", "batch", "budget"], args=args)
    return 0


if __name__ == "__main__":
    sys.exit(main())
