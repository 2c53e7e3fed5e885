"""asyncckpt's codecs on three kinds of state: speed, ratio, and whether they let the caller's
thread run while they work on another (the GIL).

States (float32, ``--mib`` each): a wavefront (a pulse spread over a tenth of a quiet grid, as
early in a seismic run), a smooth field filling the grid (later in the run), and random floats
(dense activations). For each codec: compress and decompress seconds (medians of ``--repeats``),
the ratio, and "caller's share": how much Python work the caller's thread gets done while
the codec runs on another thread, over what it gets done while that thread sleeps. A codec that
releases the GIL scores near 1 on a machine with a core to spare; one that holds it scores near 0.
A plain copy of the state is the baseline.

Usage: python benchmarks/bench_codecs.py [--mib 10] [--repeats 5]
"""
from __future__ import annotations

import argparse
import json
import sys
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np

from asyncckpt.compression import make_codec

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _common import median_time  # noqa: E402
from _results import add_flag, record  # noqa: E402

CODECS: dict[str, Any] = {"lz4": "lz4", "zstd": "zstd",
                          "zfp-1e-6": {"codec": "zfp", "tolerance": 1e-6}}


def states(nbytes: int) -> dict[str, np.ndarray]:
    """The three kinds of state, float32, ``nbytes`` each."""
    n = nbytes // 4
    rng = np.random.default_rng(0)
    x = np.linspace(0.0, 40.0 * np.pi, n, dtype=np.float32)
    front = np.zeros(n, np.float32)
    start, width = n // 2 - n // 20, n // 10
    front[start:start + width] = np.sin(x[:width]) * np.hanning(width).astype(np.float32)
    smooth = (np.sin(x) * np.cos(0.37 * x) + 0.01 * rng.standard_normal(n)).astype(np.float32)
    dense = rng.standard_normal(n).astype(np.float32)
    return {"wavefront": front, "smooth": smooth, "random": dense}


def caller_share(work: Callable[[], Any], repeats: int) -> float:
    """Python loop iterations per second on this thread while ``work`` runs ``repeats`` times
    on another, over the same while the other thread sleeps as long."""

    def rate(job: Callable[[], Any]) -> tuple[float, float]:
        done = threading.Event()

        def run() -> None:
            for _ in range(repeats):
                job()
            done.set()

        worker = threading.Thread(target=run)
        count, start = 0, time.perf_counter()
        worker.start()
        while not done.is_set():
            count += 1
        elapsed = time.perf_counter() - start
        worker.join()
        return count / elapsed, elapsed

    busy, elapsed = rate(work)
    idle, _ = rate(lambda: time.sleep(elapsed / repeats))
    return busy / idle


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--mib", type=float, default=10.0)
    parser.add_argument("--repeats", type=int, default=5)
    add_flag(parser)
    args = parser.parse_args()
    nbytes = int(args.mib * 2**20) // 4 * 4
    rows = []
    for kind, state in states(nbytes).items():
        raw = state.view(np.uint8)
        out = np.empty_like(raw)
        rows.append({"state": kind, "codec": "copy", "ratio": 1.0,
                     "compress_ms": 1e3 * median_time(lambda: np.copyto(out, raw), args.repeats),
                     "decompress_ms": 0.0,
                     "caller_share": caller_share(lambda: np.copyto(out, raw), args.repeats)})
        for name, spec in CODECS.items():
            codec = make_codec(spec, np.float32)
            assert codec is not None
            packed = np.frombuffer(codec.encode(raw), np.uint8)
            codec.decode(packed, out)
            error = float(np.max(np.abs(out.view(np.float32) - state)))
            rows.append({
                "state": kind, "codec": name, "ratio": raw.nbytes / packed.nbytes,
                "compress_ms": 1e3 * median_time(lambda: codec.encode(raw), args.repeats),
                "decompress_ms": 1e3 * median_time(lambda: codec.decode(packed, out),
                                                args.repeats),
                "caller_share": caller_share(lambda: codec.encode(raw), args.repeats),
                "caller_share_decompress": caller_share(lambda: codec.decode(packed, out),
                                                        args.repeats),
                "max_error": error})
    print(f"{'state':<10} {'codec':<9} {'ratio':>7} {'comp ms':>8} {'decomp ms':>9} "
          f"{'caller share (c/d)':>19}")
    for row in rows:
        share = f"{row['caller_share']:.2f}"
        if "caller_share_decompress" in row:
            share += f" / {row['caller_share_decompress']:.2f}"
        print(f"{row['state']:<10} {row['codec']:<9} {row['ratio']:7.2f} "
              f"{row['compress_ms']:8.2f} {row['decompress_ms']:9.2f} {share:>19}")
    print(json.dumps({"mib": args.mib, "repeats": args.repeats, "rows": rows}))
    for row in rows:
        record("bench_codecs", {"mib": args.mib, **row}, ["mib", "state", "codec"], args=args)


if __name__ == "__main__":
    main()
