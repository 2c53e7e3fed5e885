"""Render docs/results.md from the benchmarks' JSON lines in benchmarks/results/.

Per benchmark, per kind of configuration (the set of keys naming it): the latest row of every
configuration and machine, then every row, newest first. ``--check`` exits 1 where the page
differs from what the data renders.

    python scripts/results_page.py [--check]
"""
from __future__ import annotations

import argparse
import ast
import json
import sys
from collections.abc import Iterable
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
RESULTS = ROOT / "benchmarks" / "results"
PAGE = ROOT / "docs" / "results.md"
MAX_COLUMNS = 8  # figures beyond this many keys share one cell, "key: value; ..."

HEADER = """\
# Results as data

Every row below is a line of `benchmarks/results/<bench>.jsonl`: the date (UTC), the commit
(`+dirty` where tracked files differed from it), the machine and the figures a benchmark
printed. A benchmark appends its rows as it prints them (`--no-record`, or
`ASYNCCKPT_NO_RECORD=1`, for trial runs); `python scripts/results_page.py` renders this page,
and a test keeps the two equal. Per benchmark: the latest row of every configuration on every
machine, then the earlier rows, newest first. [Benchmarks](benchmarks.md) says how each was
run and what the figures mean; the rows to 2026-11-26 come from its tables, and a commit of
`-` is one its section did not name.
"""


def load(path: Path) -> list[dict[str, Any]]:
    """The rows of one JSON-lines file, in file order; a clear error names a bad line."""
    rows = []
    for number, text in enumerate(path.read_text().splitlines(), 1):
        if not text.strip():
            continue
        try:
            row = json.loads(text)
        except json.JSONDecodeError as exc:
            raise ValueError(f"{path}:{number}: not a JSON line ({exc})") from None
        missing = {"date", "commit", "machine", "config", "figures"} - set(row)
        if missing:
            raise ValueError(f"{path}:{number}: expected keys {sorted(missing)} too")
        rows.append(row)
    return rows


def flat(mapping: dict[str, Any], prefix: str = "") -> dict[str, Any]:
    """Nested mappings as dotted keys: ``{"a": {"b": 1}}`` is ``{"a.b": 1}``."""
    out: dict[str, Any] = {}
    for key, value in mapping.items():
        if isinstance(value, dict) and value:
            out.update(flat(value, f"{prefix}{key}."))
        else:
            out[f"{prefix}{key}"] = value
    return out


def cell(value: Any) -> str:
    """A value as a Markdown table cell."""
    if value is None:
        text = "-"
    elif isinstance(value, bool):
        text = "yes" if value else "no"
    elif isinstance(value, list):
        text = ", ".join(cell(v) for v in value)
    elif isinstance(value, dict):
        text = json.dumps(value)
    else:
        text = str(value)
    return text.replace("|", "\\|").replace("\n", " ")


def machine_name(machine: dict[str, Any]) -> str:
    return f"{machine.get('cpu')}, {machine.get('cores')} cores, {machine.get('memory_gib')} GiB"


def identity(row: dict[str, Any]) -> str:
    """A configuration on a machine: rows of equal identity replace each other."""
    return json.dumps([row["config"], row["machine"]], sort_keys=True)


def latest(rows: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """The newest row (by date, then by place in the file) of every configuration and machine,
    in the order their configurations first appear."""
    chosen: dict[str, tuple[tuple[str, int], dict[str, Any]]] = {}
    for index, row in enumerate(rows):
        key, rank = identity(row), (row["date"], index)
        if key not in chosen or rank > chosen[key][0]:
            chosen[key] = (rank, row)
    return [row for _, row in chosen.values()]


def history(rows: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """The rows :func:`latest` did not choose, newest date and commit first; a commit's rows
    keep their order."""
    chosen = {id(row) for row in latest(rows)}
    first: dict[tuple[str, str | None], int] = {}
    for index, row in enumerate(rows):
        first.setdefault((row["date"], row["commit"]), index)
    order = sorted(range(len(rows)), key=lambda i: (
        rows[i]["date"], first[(rows[i]["date"], rows[i]["commit"])], -i), reverse=True)
    return [rows[i] for i in order if id(rows[i]) not in chosen]


def table(rows: list[dict[str, Any]], with_when: bool) -> list[str]:
    """A Markdown table of ``rows``: (date, commit,) machine, configuration, figures."""
    config = list(dict.fromkeys(k for row in rows for k in row["config"]))
    figures = [flat(row["figures"]) for row in rows]
    # the fullest row's order first: a row that lacks a figure does not push it to the end
    names = list(dict.fromkeys(k for f in sorted(figures, key=len, reverse=True) for k in f))
    wide = len(names) > MAX_COLUMNS
    head = (["date", "commit"] if with_when else []) + ["machine"] + config + (
        ["figures"] if wide else names)
    lines = ["| " + " | ".join(cell(h) for h in head) + " |", "|" + "---|" * len(head)]
    for row, figs in zip(rows, figures):
        cells = ([row["date"], row["commit"]] if with_when else []) + [
            machine_name(row["machine"])] + [row["config"].get(k, "") for k in config]
        if wide:
            cells.append("; ".join(f"{k}: {cell(v)}" for k, v in figs.items()))
        else:
            cells += [figs.get(k, "") for k in names]  # "": not measured
        lines.append("| " + " | ".join(cell(c) for c in cells) + " |")
    return lines


def kinds(rows: list[dict[str, Any]]) -> dict[tuple[str, ...], list[dict[str, Any]]]:
    """Rows grouped by the keys naming their configuration, in order of first appearance."""
    groups: dict[tuple[str, ...], list[dict[str, Any]]] = {}
    for row in rows:
        groups.setdefault(tuple(row["config"]), []).append(row)
    return groups


def summary(bench: str) -> str:
    """The first line of the benchmark's docstring, where ``benchmarks/<bench>.py`` has one."""
    script = ROOT / "benchmarks" / f"{bench}.py"
    if not script.exists():
        return ""
    doc = ast.get_docstring(ast.parse(script.read_text())) or ""
    return doc.split("\n\n")[0].replace("\n", " ").strip()


def section(bench: str, rows: list[dict[str, Any]]) -> list[str]:
    """One benchmark's part of the page."""
    lines = [f"## {bench}", ""]
    about = summary(bench)
    if about:
        lines += [f"`benchmarks/{bench}.py`: {about}", ""]
    for keys, group in kinds(rows).items():
        named = ", ".join(keys) if keys else "one configuration"
        lines += [f"**Latest**, per configuration ({named}) and machine:", ""]
        lines += table(latest(group), with_when=True) + [""]
        older = history(group)
        if older:
            lines += [f"**History**: the {len(older)} earlier rows, newest first:", ""]
            lines += table(older, with_when=True) + [""]
    return lines


def render(directory: Path = RESULTS) -> str:
    """The whole page, from every ``*.jsonl`` under ``directory``, benchmarks by name."""
    lines = [HEADER]
    for path in sorted(directory.glob("*.jsonl")):
        rows = load(path)
        if rows:
            lines += section(path.stem, rows)
    return "\n".join(lines).rstrip("\n") + "\n"


def main(argv: Iterable[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--check", action="store_true",
                        help="exit 1 where docs/results.md differs from the data's page")
    args = parser.parse_args(None if argv is None else list(argv))
    page = render()
    if args.check:
        if not PAGE.exists() or PAGE.read_text() != page:
            print(f"{PAGE} differs from the data: run scripts/results_page.py", file=sys.stderr)
            return 1
        return 0
    PAGE.write_text(page)
    return 0


if __name__ == "__main__":
    sys.exit(main())
