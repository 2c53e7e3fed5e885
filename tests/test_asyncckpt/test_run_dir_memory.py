"""A run directory's snapshots within the budget: ``outputs=`` and ``adjoint=`` are written from
the program's own arrays (no copy of them held), and a ``run_dir`` on a RAM-backed filesystem
counts against the budget as a DRAM tier does. Each run is a fresh process whose peak resident
memory (and the run directory's bytes on tmpfs) is measured from a reset once the program's own
arrays, the outputs and the adjoint among them, are resident."""
from __future__ import annotations

import json
import os
import tempfile
from pathlib import Path

import pytest

from budgeted import run_in_process

MiB = 2**20


def report_of(n: int, env: dict | None = None, **options) -> dict:
    """The report of :func:`budgeted.run_in_process` of ``n`` states of 1 MiB (a child's
    error under "error")."""
    done = run_in_process(n, MiB, env, **options)
    if done.returncode != 0:
        return {"error": done.stderr.strip().splitlines()[-1]}
    return json.loads(done.stdout.strip().splitlines()[-1])


def within(report: dict, bound: int, held: str = "peak") -> None:
    """Assert the run grew by at most ``bound`` + 1% + 4 MiB: its resident memory (``held``
    "peak"), or that and its RAM-backed files together ("held_peak")."""
    assert "error" not in report, report
    growth = report[held] - report["base"]
    assert growth <= bound * 1.01 + 4 * MiB, (growth / MiB, report)


@pytest.mark.parametrize("outputs, interval", [(64 * MiB, 10), (64 * MiB, "auto"),
                                               (16 * MiB, 10), (24 * MiB, "auto")])
def test_outputs_snapshots_stay_within_the_budget(outputs: int, interval: int | str,
                                                  tmp_path: Path) -> None:
    """1 MiB states, memory_budget 16 MiB: outputs of 64 MiB grew the peak by 204 MiB (337
    with "auto"), of 16 MiB by 76, of 24 MiB by 137: a copy of the outputs per state stored
    and per commit waiting, outside the budget."""
    report = report_of(200, memory_budget="16MiB", interval=interval,
                       run_dir=str(tmp_path / "run"), outputs_nbytes=outputs)
    within(report, 16 * MiB)


def test_adjoint_snapshots_stay_within_the_budget(tmp_path: Path) -> None:
    """An adjoint of 8 MiB under 40 MiB with "auto" grew the peak by 58.8 MiB: a copy per
    reverse interval and per commit waiting."""
    report = report_of(200, memory_budget="40MiB", interval="auto",
                       run_dir=str(tmp_path / "run"), adjoint_nbytes=8 * MiB)
    within(report, 40 * MiB)


@pytest.fixture
def shm_dir():
    """A directory on tmpfs (/dev/shm), removed afterwards."""
    if not os.path.isdir("/dev/shm"):
        pytest.skip("no /dev/shm")
    with tempfile.TemporaryDirectory(dir="/dev/shm") as path:
        yield Path(path)


@pytest.mark.parametrize("env, options", [
    ({"ASYNCCKPT_MEMORY_BUDGET": "16MiB"}, {"l1_slots": 4}),
    ({}, {"memory_budget": "16MiB"}),
])
def test_a_run_dir_on_tmpfs_counts_against_the_budget(env: dict, options: dict,
                                                      shm_dir: Path) -> None:
    """A run_dir on tmpfs, 1 MiB states, interval 40, under a 16 MiB default bound (4 slots)
    or memory_budget (slots the budget's to split): the states in it and its snapshots count
    as a DRAM tier's would, the heap and the directory together within the bound. Without
    it, slots and the engine's buffers took the whole budget (10 slots: no room left for the
    five states), and under the default bound the directory was not counted at all (21 MiB of
    tmpfs beside 8.5 MiB of heap at interval 10)."""
    report = report_of(200, env, interval=40, run_dir=str(shm_dir / "run"), **options)
    within(report, 16 * MiB, held="held_peak")
    assert report["tmpfs_peak"] > 0, report  # the sampler saw the directory


def test_auto_with_a_run_dir_on_tmpfs_holds_no_more_than_its_plan(shm_dir: Path) -> None:
    """"auto" with fixed slots and a run_dir on tmpfs under the default bound: its probe of
    fresh memory made 32 MiB of buffers for a plan of 4 slots and left them in the pool, 33.6
    MiB of heap beside 7 MiB of tmpfs; it makes no more than the plan holds."""
    report = report_of(200, {"ASYNCCKPT_MEMORY_BUDGET": "16MiB"}, l1_slots=4, interval="auto",
                       run_dir=str(shm_dir / "run"))
    within(report, 16 * MiB, held="held_peak")


def test_a_run_dir_on_tmpfs_whose_states_do_not_fit_is_refused(shm_dir: Path) -> None:
    """Interval 10 keeps 20 states in the directory: beside 4 slots and the engine's buffers
    they do not fit a 16 MiB bound; refused, naming the least interval that fits."""
    report = report_of(200, {"ASYNCCKPT_MEMORY_BUDGET": "16MiB"}, l1_slots=4, interval=10,
                       run_dir=str(shm_dir / "run"))
    assert "MemoryBudgetError" in report.get("error", ""), report
    assert "least that fits" in report["error"], report
