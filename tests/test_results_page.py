"""Results as data: benchmarks append JSON lines, and docs/results.md is what they render."""
from __future__ import annotations

import argparse
import importlib.util
import json
import socket
import sys
from pathlib import Path
from types import ModuleType

import pytest

from conftest import ROOT


def load(path: Path) -> ModuleType:
    spec = importlib.util.spec_from_file_location(path.stem, path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[path.stem] = module
    spec.loader.exec_module(module)
    return module


page = load(ROOT / "scripts" / "results_page.py")
results = load(ROOT / "benchmarks" / "_results.py")
MACHINE = {"cpu": "AMD EPYC", "cores": 2, "memory_gib": 24}


def line(date: str, commit: str, config: dict, figures: dict, machine: dict = MACHINE) -> str:
    return json.dumps({"date": date, "commit": commit, "machine": machine, "config": config,
                       "figures": figures})


@pytest.fixture
def synthetic(tmp_path: Path) -> Path:
    """Two configurations; the first's newest row is not the file's last (dates decide)."""
    small, large = {"shape": "8x8", "share": "2%"}, {"shape": "9x9", "share": "2%"}
    (tmp_path / "bench_demo.jsonl").write_text("\n".join([
        line("2026-11-24", "aaaaaaa", small, {"ratio": 1.11}),
        line("2026-11-26", "ccccccc", small, {"ratio": 1.33}),
        line("2026-11-25", "bbbbbbb", small, {"ratio": 1.22}),
        line("2026-11-25", "bbbbbbb", large, {"ratio": 2.22, "runs_s": [1.5, 1.6]}),
        line("2026-11-25", "bbbbbbb", small, {"ratio": 1.21},
             {"cpu": "Other", "cores": 16, "memory_gib": 128}),
    ]) + "\n")
    return tmp_path


def test_latest_is_the_newest_row_per_configuration_and_machine(synthetic):
    rows = page.load(synthetic / "bench_demo.jsonl")
    chosen = page.latest(rows)
    assert [(r["config"]["shape"], r["figures"]["ratio"]) for r in chosen] == [
        ("8x8", 1.33), ("9x9", 2.22), ("8x8", 1.21)]
    assert [r["figures"]["ratio"] for r in page.history(rows)] == [1.22, 1.11]


def test_the_page_shows_the_latest_then_keeps_the_history(synthetic):
    text = page.render(synthetic)
    latest, history = text.split("**Latest**")[1].split("**History**")
    assert "| 2026-11-26 | ccccccc | AMD EPYC, 2 cores, 24 GiB | 8x8 | 2% | 1.33 |" in latest
    assert "1.22" not in latest and "1.11" not in latest
    assert "| 9x9 | 2% | 2.22 | 1.5, 1.6 |" in latest
    assert "| 2026-11-24 | aaaaaaa | AMD EPYC, 2 cores, 24 GiB | 8x8 | 2% | 1.11 |\n" in history
    assert "the 2 earlier rows" in history and "1.33" not in history
    assert history.index("1.22") < history.index("1.11")


def test_a_bad_line_is_named(tmp_path):
    (tmp_path / "bench_bad.jsonl").write_text('{"date": "2026-11-26"}\n')
    with pytest.raises(ValueError, match=r"bench_bad.jsonl:1: expected keys"):
        page.render(tmp_path)


def test_record_appends_a_line_with_date_commit_and_machine(tmp_path, monkeypatch):
    monkeypatch.delenv(results.NO_RECORD, raising=False)
    row = {"n": 1000, "seconds": 1.5, "runs": {"a": 1.0}}
    path = results.record("bench_demo", row, ["n"], directory=tmp_path)
    results.record("bench_demo", {**row, "n": 2000}, ["n"], directory=tmp_path)
    first, second = [json.loads(t) for t in path.read_text().splitlines()]
    assert first["config"] == {"n": 1000} and second["config"] == {"n": 2000}
    assert first["figures"] == {"seconds": 1.5, "runs": {"a": 1.0}}
    assert len(first["date"]) == 10 and first["commit"].split("+")[0].isalnum()
    assert set(first["machine"]) == {"cpu", "cores", "memory_gib"}
    assert socket.gethostname() not in json.dumps(first)
    with pytest.raises(ValueError, match=r"config keys \['shape'\] are not in the row"):
        results.record("bench_demo", row, ["shape"], directory=tmp_path)


def test_no_record_by_flag_or_environment(tmp_path, monkeypatch):
    parser = argparse.ArgumentParser()
    results.add_flag(parser)
    monkeypatch.delenv(results.NO_RECORD, raising=False)
    assert results.record("b", {}, args=parser.parse_args(["--no-record"]),
                          directory=tmp_path) is None
    monkeypatch.setenv(results.NO_RECORD, "1")
    assert results.record("b", {}, args=parser.parse_args([]), directory=tmp_path) is None
    assert not list(tmp_path.iterdir())


def test_the_committed_page_is_what_the_committed_data_renders():
    assert (ROOT / "docs" / "results.md").read_text() == page.render(), (
        "run: python scripts/results_page.py")


def test_every_benchmark_that_prints_json_records_it():
    for script in sorted((ROOT / "benchmarks").glob("bench_*.py")):
        text = script.read_text()
        if "json.dumps" in text:
            assert "record(" in text and "add_flag(" in text, script.name
