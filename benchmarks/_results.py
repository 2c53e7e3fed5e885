"""Benchmark results as data: each row a JSON line in ``benchmarks/results/<bench>.jsonl``.

A line holds the date (UTC), the commit (short hash, ``+dirty`` where tracked files differ from
it), the machine (CPU model, cores, memory; no hostname), the row's configuration and its
figures. ``scripts/results_page.py`` renders docs/results.md from these files. A benchmark adds
``--no-record`` with :func:`add_flag` and calls :func:`record` where it prints a row; the flag,
or ``ASYNCCKPT_NO_RECORD=1`` in the environment (children inherit it), keeps trial runs out.
"""
from __future__ import annotations

import argparse
import datetime
import json
import os
import platform
import subprocess
from collections.abc import Iterable, Mapping
from functools import cache
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
RESULTS = ROOT / "benchmarks" / "results"
NO_RECORD = "ASYNCCKPT_NO_RECORD"


def add_flag(parser: argparse.ArgumentParser) -> None:
    """Give a benchmark's parser ``--no-record``."""
    parser.add_argument("--no-record", action="store_true",
                        help="print the rows without appending them to benchmarks/results/ "
                             f"(so does {NO_RECORD}=1)")


def record(bench: str, row: Mapping[str, Any], config: Iterable[str] = (), *,
           args: argparse.Namespace | None = None, directory: Path | None = None) -> Path | None:
    """Append ``row`` to ``<directory>/<bench>.jsonl``, with its date, commit and machine.

    Parameters
    ----------
    bench
        The file's name, e.g. ``"bench_devito"``.
    row
        What the benchmark printed: a JSON-serialisable mapping.
    config
        The keys of ``row`` that name its configuration (the page keeps the latest row per
        configuration and machine); the other keys are its figures.
    args
        The benchmark's parsed arguments: ``args.no_record`` skips the record.
    directory
        Where the file goes (default: ``benchmarks/results``).

    Returns
    -------
    Path or None
        The file appended to, or None where recording is off.
    """
    if os.environ.get(NO_RECORD, "") not in ("", "0") or getattr(args, "no_record", False):
        return None
    keys = list(config)
    missing = [k for k in keys if k not in row]
    if missing:
        raise ValueError(f"config keys {missing} are not in the row (its keys: {sorted(row)})")
    line = {"date": datetime.datetime.now(datetime.timezone.utc).date().isoformat(),
            "commit": commit(), "machine": machine(),
            "config": {k: row[k] for k in keys},
            "figures": {k: v for k, v in row.items() if k not in keys}}
    path = (directory or RESULTS) / f"{bench}.jsonl"
    path.parent.mkdir(parents=True, exist_ok=True)
    with path.open("a") as out:
        out.write(json.dumps(line) + "\n")
    return path


@cache
def commit() -> str | None:
    """The short hash of HEAD, ``+dirty`` where tracked files other than the results differ."""
    def git(*argv: str) -> str:
        return subprocess.run(["git", *argv], cwd=ROOT, capture_output=True, text=True,
                              check=True).stdout.strip()
    try:
        head = git("rev-parse", "--short", "HEAD")
        changed = git("status", "--porcelain", "--untracked-files=no", "--", ".",
                      ":(exclude)benchmarks/results")
    except (OSError, subprocess.CalledProcessError):
        return None
    return head + ("+dirty" if changed else "")


@cache
def machine() -> dict[str, Any]:
    """The CPU model, its logical cores and the memory in GiB: what the figures ran on."""
    cpu = platform.processor() or platform.machine()
    try:
        for text in Path("/proc/cpuinfo").read_text().splitlines():
            if text.startswith("model name"):
                cpu = text.split(":", 1)[1].strip()
                break
    except OSError:
        pass
    memory = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    return {"cpu": cpu, "cores": os.cpu_count(), "memory_gib": round(memory / 2**30)}
