"""The command line: python -m asyncckpt simulate / tune / bench-storage / nodes."""
from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from asyncckpt.cli import main


def test_simulate_prints_validated_counts(capsys) -> None:
    assert main(["simulate", "--n", "1000", "--l1-slots", "10", "--interval", "10"]) == 0
    out = capsys.readouterr().out
    assert "revolve" in out and "4636" in out  # Revolve(1000, 10): F = 4636 by the closed form
    assert "2890" in out  # AsyncMultistage(1000, 10, 10): two-level 2900 less the last interval


def test_tune_on_dram_and_disk(capsys, disk_dir: Path) -> None:
    for storage in ("dram", str(disk_dir)):
        assert main(["tune", "--storage", storage, "--mib", "1", "--tf", "0.002", "--tb", "0.004",
                     "--n", "500", "--repeats", "2"]) == 0
        out = capsys.readouterr().out
        assert "recommended interval:" in out and "GB/s" in out
    assert list(disk_dir.iterdir()) == []


def test_bench_storage(capsys, shm_dir: Path) -> None:
    assert main(["bench-storage", str(shm_dir), "--state-mib", "1", "--total-gib", "0.01"]) == 0
    out = capsys.readouterr().out
    assert "sustained write" in out and "read in reverse order" in out
    assert list(shm_dir.iterdir()) == []


def test_bound_sets_runs_against_the_machine(capsys, disk_dir: Path) -> None:
    assert main(["bound", "--storage", str(disk_dir), "--mib", "1", "--tf", "0.002", "--tb",
                 "0.005", "--n", "400", "--memory-mib", "12", "--repeats", "2",
                 "--run", "ours=2.5", "--run", "peer=4.0"]) == 0
    out = capsys.readouterr().out
    floor = float(out.split("floor ")[1].split(" s")[0])
    bound = float(out.split("bound ")[1].split(" s")[0])
    assert floor == pytest.approx(400 * (0.002 + 0.005)) and bound >= floor
    assert "memory 12 states" in out and "over bound" in out
    ours = next(line for line in out.splitlines() if line.strip().startswith("ours"))
    assert float(ours.split()[2]) == pytest.approx(2.5 / bound, abs=1e-3)
    assert list(disk_dir.iterdir()) == []


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["simulate", "--n", "0"], "expected a positive integer, got 0"),
        (["simulate", "--n", "10", "--interval", "11"], "interval 11 exceeds n = 10"),
        (["tune", "--tf", "0", "--tb", "1"], "Costs.tf must be > 0"),
        (["tune", "--tf", "x", "--tb", "1"], "expected a time in seconds, got 'x'"),
        (["bench-storage", "/proc/no-such-dir"], "cannot be created"),
        (["simulate", "--tb", "-1"], "expected a time >= 0 seconds"),
        (["bound", "--storage", "dram", "--tf", "1", "--tb", "2", "--n", "9", "--memory-mib",
          "1", "--run", "2.5"], "expected NAME=SECONDS, got '2.5'"),
    ],
)
def test_bad_values_exit_with_a_message(argv: list[str], message: str) -> None:
    done = subprocess.run([sys.executable, "-m", "asyncckpt", *argv], capture_output=True,
                          text=True)
    assert done.returncode == 2
    assert message in done.stderr


def test_help_for_each_command() -> None:
    for command in ("simulate", "tune", "bench-storage", "nodes", "bound"):
        done = subprocess.run([sys.executable, "-m", "asyncckpt", command, "--help"],
                              capture_output=True, text=True)
        assert done.returncode == 0 and "usage:" in done.stdout
