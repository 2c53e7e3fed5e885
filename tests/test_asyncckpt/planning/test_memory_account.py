"""One memory account: what a checkpointer maps is what its budget (or the default bound)
charges, whatever the state size, interval, tiers, slots or staging buffers asked for.
Each run is a fresh process whose peak resident memory is measured from a reset."""
from __future__ import annotations

import functools
import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path

import pytest

from budgeted import run_in_process
from conftest import ROOT

MiB = 2**20


def accounted_run(n: int, nbytes: int, env: dict | None = None, **options) -> dict:
    """The report of :func:`budgeted.run_in_process` of ``n`` states of ``nbytes`` bytes (a
    child's error is returned under "error")."""
    done = run_in_process(n, nbytes, env, **options)
    if done.returncode != 0:
        return {"error": done.stderr.strip().splitlines()[-1]}
    return json.loads(done.stdout.strip().splitlines()[-1])


def growth_within(report: dict, bound: int) -> None:
    """Assert the run's peak grew by at most ``bound`` + 1% + 4 MiB (the interpreter's own)."""
    assert "error" not in report, report
    growth = report["peak"] - report["base"]
    assert growth <= bound * 1.01 + 4 * MiB, (growth / MiB, report)


@pytest.mark.parametrize("interval", [1, "auto", 0])
def test_states_just_above_huge_pages_stay_within_the_budget(interval: int | str,
                                                             disk_dir: Path) -> None:
    """States of 2 MiB + 4 KiB under 48 MiB: buffers of a huge page or more are advised to
    use huge pages, and a whole 2 MiB page backing each 4 KiB tail grew the peak by 85 to
    92 MiB where the account counted 48."""
    budget = 48 * MiB
    report = accounted_run(60, 2 * MiB + 4096, interval=interval, memory_budget=budget,
                           storage=["dram", str(disk_dir)])
    growth_within(report, budget)


@pytest.mark.parametrize("options", [
    {"l1_slots": 4, "interval": 1},
    {"l1_slots": 1, "staging_buffers": 4, "interval": 1},
    {"l1_slots": 8, "interval": 0},
])
def test_slots_and_buffers_beyond_the_default_bound_are_refused(options: dict) -> None:
    """storage=None, no memory_budget, the default bound 32 MiB, states of 8 MiB: the slots and
    staging buffers asked for do not fit the bound's four buffers (``l1_slots=4`` grew the
    peak by 65 MiB, ``staging_buffers=4`` by 57): refused, naming the numbers."""
    report = accounted_run(40, 8 * MiB, {"ASYNCCKPT_MEMORY_BUDGET": "32MiB"}, **options)
    assert "MemoryBudgetError" in report.get("error", ""), report
    assert "ASYNCCKPT_MEMORY_BUDGET" in report["error"], report


def test_many_staging_buffers_of_small_states_are_refused_under_the_default_bound() -> None:
    """4 KiB states, a 16 MiB default bound and 20000 staging buffers grew the peak by
    162 MiB: the engine's buffers alone pass the bound."""
    report = accounted_run(40, 4096, {"ASYNCCKPT_MEMORY_BUDGET": "16MiB"}, l1_slots=2,
                           interval=1, staging_buffers=20000)
    assert "MemoryBudgetError" in report.get("error", ""), report
    assert "staging_buffers=20000" in report["error"], report


@pytest.mark.parametrize("interval", [1, "auto"])
@pytest.mark.parametrize("tiers", ["dram", "dram+disk"])
def test_dram_named_without_a_budget_is_bounded_by_the_default(interval: int | str, tiers: str,
                                                                disk_dir: Path) -> None:
    """``storage="dram"`` (alone, or first of tiers) with no memory_budget is the default
    bound's as None is: 200 states of 2 MiB under a 24 MiB bound grew the peak by 409 MiB, and
    ``["dram", disk]`` never spilled. The states beyond go to the temporary directory, or
    the next tier."""
    bound = 24 * MiB
    storage = "dram" if tiers == "dram" else ["dram", str(disk_dir)]
    report = accounted_run(200, 2 * MiB, {"ASYNCCKPT_MEMORY_BUDGET": str(bound),
                                          "TMPDIR": str(disk_dir)},
                           l1_slots=2, interval=interval, storage=storage)
    growth_within(report, bound)
    assert report["tiers"] == ["HostMemoryStorage", "FileStorage"], report
    assert report["writes"][1] > 0, report  # it did spill


def held_within(report: dict, bound: int) -> None:
    """Assert the run's peak resident growth, and its resident memory and RAM-backed files
    together at any moment sampled, grew by at most ``bound`` + 1% + 4 MiB."""
    growth_within(report, bound)
    held = report["held_peak"] - report["base"]
    assert held <= bound * 1.01 + 4 * MiB, (held / MiB, report["tmpfs_peak"] / MiB, report)


def _host_memory_you_build(case: str, ram: Path, disk: Path) -> dict:
    """``storage=`` (or the code that builds it in the child) for each kind of host memory a
    user gives: a backend of their own, alone or as a tier, or a directory on tmpfs."""
    return {
        "HostMemoryStorage": {"storage_code": "HostMemoryStorage()"},
        "tiers you build": {"storage_code": f"TieredStorage([HostMemoryStorage(), "
                                            f"FileStorage({str(disk)!r})])"},
        "tmpfs": {"storage": str(ram)},
        "tmpfs+disk": {"storage": [str(ram), str(disk)]},
    }[case]


CASES = ["HostMemoryStorage", "tiers you build", "tmpfs", "tmpfs+disk"]


@pytest.mark.parametrize("interval", [1, "auto"])
@pytest.mark.parametrize("case", CASES)
def test_host_memory_you_build_is_bounded_by_the_default(case: str, interval: int | str,
                                                         shm_dir: Path, disk_dir: Path) -> None:
    """A ``HostMemoryStorage`` built by the user (alone or as a tier) and a directory on tmpfs,
    given without memory_budget, are the default bound's as ``"dram"`` is: 200 states of
    2 MiB under a 24 MiB bound keep resident growth and tmpfs together within it, the rest
    going to the next tier or the temporary directory, with the adjoint of a run on disk
    (before, they held every state: about 400 MiB)."""
    bound = 24 * MiB
    env = {"ASYNCCKPT_MEMORY_BUDGET": str(bound), "TMPDIR": str(disk_dir)}
    report = accounted_run(200, 2 * MiB, env, l1_slots=2, interval=interval,
                           **_host_memory_you_build(case, shm_dir, disk_dir))
    held_within(report, bound)
    assert report["adjoint"] == adjoint_on_disk(interval), report


@functools.cache
def adjoint_on_disk(interval: int | str) -> float:
    """The adjoint of the runs above with Level-2 on the disk alone."""
    report = accounted_run(200, 2 * MiB, l1_slots=2, interval=interval,
                           storage=tempfile.gettempdir())
    assert "error" not in report, report
    return report["adjoint"]


@pytest.mark.parametrize("case", CASES)
def test_host_memory_you_build_counts_inside_a_budget(case: str, shm_dir: Path,
                                                      disk_dir: Path) -> None:
    """With memory_budget given, the same Level-2 counts inside it: where it has a disk
    tier the states beyond go there; alone, an interval whose states do not fit is refused
    naming the budget, and "auto" plans within it."""
    budget = 24 * MiB
    storage = _host_memory_you_build(case, shm_dir, disk_dir)
    spills = case in ("tiers you build", "tmpfs+disk")
    report = accounted_run(200, 2 * MiB, {"TMPDIR": str(disk_dir)}, l1_slots=2, interval=1,
                           memory_budget=budget, **storage)
    if spills:
        held_within(report, budget)
    else:
        assert "MemoryBudgetError" in report.get("error", ""), report
        assert f"memory_budget={budget}" in report["error"], report
    held_within(accounted_run(200, 2 * MiB, {"TMPDIR": str(disk_dir)}, interval="auto",
                              memory_budget=budget, **storage), budget)


@pytest.mark.parametrize("interval", [1, "auto"])
@pytest.mark.parametrize("budget_mib", [24, 48])
@pytest.mark.parametrize("codec", ["lz4", "zstd"])
def test_a_codec_stays_within_the_budget(codec: str, budget_mib: int, interval: int | str,
                                         disk_dir: Path) -> None:
    """States of 2 MiB that do not compress well (a logistic map), blosc2 imported before the
    base (its import is code, not held state), ``["dram", disk]``: the account charged one
    buffer per I/O thread for the codec, which also allocates a destination of the state's
    size and returns a copy, kept by its thread's C heap; lz4 and zstd grew the peak by 28.9
    and 53.4 MiB under 24 and 48 at interval 1, and "auto" by up to 42 MiB under 24 over
    three runs whose plans differed (the process pool kept state buffers the codec's were
    not counted beside)."""
    pytest.importorskip("blosc2")
    budget = budget_mib * MiB
    done = run_in_process(60, 2 * MiB, workload="logistic", imported=("blosc2",),
                          runs=1 if interval == 1 else 3, interval=interval,
                          memory_budget=budget, storage=["dram", str(disk_dir)],
                          compression=codec)
    assert done.returncode == 0, done.stderr
    growth_within(json.loads(done.stdout.strip().splitlines()[-1]), budget)


_PROBED = """
import json, sys, tempfile
import blosc2
import numpy as np
from asyncckpt import ArrayCheckpoint, AsyncCheckpointer

def resident_kib(part):  # resident pages of the files mapped from paths containing part
    total, inside = 0, False
    for line in open("/proc/self/smaps"):
        fields = line.split()
        if "-" in fields[0] and not fields[0].endswith(":"):
            inside = len(fields) > 5 and part in fields[5]
        elif inside and fields[0] == "Rss:":
            total += int(fields[1])
    return total

class Operator:
    def apply(self, *, t_start, t_end):
        pass
parts = ("/numpy/random/", "/blosc2/")
before = [resident_kib(part) for part in parts]
AsyncCheckpointer(ArrayCheckpoint([np.zeros(2**16)]), Operator(), Operator(), 30,
                  interval="auto", memory_budget=2**23, storage=["dram", tempfile.mkdtemp()],
                  compression=sys.argv[1]).close()
print(json.dumps(dict(zip(("random", "codec"),
                          (resident_kib(part) - was for part, was in zip(parts, before))))))
"""


@pytest.mark.parametrize("codec", ["lz4", "zstd"])
def test_the_codec_probe_runs_no_code_the_caller_has_not(codec: str) -> None:
    """"auto" prices a codec at construction on a state of random values; drawn with
    ``numpy.random``, they faulted in its extension modules' code, 1.6 MiB that no budget
    counts, in a process that had drawn no random numbers before (512 KiB states, zstd,
    ``["dram", disk]``, 8 MiB: 12.4 MiB grown where 12.1 are allowed). The state is drawn from
    ``os.urandom`` now: none of that code becomes resident, while the codec's does (it ran)."""
    pytest.importorskip("blosc2")
    done = subprocess.run([sys.executable, "-c", _PROBED, codec], capture_output=True,
                          text=True, cwd=ROOT, timeout=120)
    assert done.returncode == 0, done.stderr
    faulted = json.loads(done.stdout.strip().splitlines()[-1])
    assert faulted["codec"] > 0 and faulted["random"] == 0, faulted


@pytest.mark.parametrize("tiered", [False, True])
def test_a_plan_without_level2_holds_no_file_in_ram(tiered: bool, shm_dir: Path,
                                                    disk_dir: Path) -> None:
    """A tmpfs file an earlier plan reserved (kept from a closed checkpointer, or reserved by a
    run of this one) is given back by a plan that runs Revolve in Level-1 alone, which gives
    every byte of the budget to slots: it held 20 MiB beside 40 MiB of slots under a 40 MiB
    budget. A tier given no share of a plan's states gives its room back too."""
    from workloads import Forward, RecurrentCell, Reverse, forward_reverse, store_all_reference

    from asyncckpt import AsyncCheckpointer
    from asyncckpt.storage import FileStorage, TieredStorage, release_files
    from asyncckpt.storage.kept import kept_ram_bytes

    release_files()
    cell = RecurrentCell(40, batch=256, hidden=512)  # states of 2 MiB
    reference = store_all_reference(cell)

    def ram_file(storage) -> int:
        return (storage.tiers[0] if tiered else storage).nbytes_held

    # your own tiers, given to one checkpointer after another; or a directory, whose file the
    # first one keeps at close for the next
    storage = (TieredStorage([FileStorage(shm_dir), FileStorage(disk_dir)])
               if tiered else str(shm_dir))
    try:
        for interval, held in ((4, 10 * (2 * MiB)), (0, 0)):
            with AsyncCheckpointer(cell, Forward(cell), Reverse(cell), 40, interval=interval,
                                   memory_budget=40 * MiB, storage=storage) as ckp:
                gradients = forward_reverse(cell, ckp)
                assert all((a == b).all() for a, b in zip(gradients, reference))
                assert ram_file(ckp.storage) == held, (interval, ram_file(ckp.storage) / MiB)
            if not tiered:
                assert kept_ram_bytes() == held
    finally:
        if tiered:
            storage.close()
        release_files()


def slots_bytes(l1_slots: int, nbytes: int) -> int:
    """What ``l1_slots`` alone lets stay resident: the slots and the engine's staging and
    prefetch buffers, each padded to whole pages (docs/budgets.md)."""
    from asyncckpt._memory.buffers import padded
    from asyncckpt._planning.transfer_buffers import engine_buffers

    return (l1_slots + engine_buffers()) * padded(nbytes)


@pytest.mark.parametrize(("n", "nbytes", "l1_slots", "interval"), [
    (400, MiB, 8, "auto"), (400, MiB, 8, 10), (1500, 587202, 6, "auto")])
def test_slots_alone_bound_what_stays_resident(n: int, nbytes: int, l1_slots: int,
                                               interval: int | str, disk_dir: Path) -> None:
    """``l1_slots`` without memory_budget, ``storage=None``: the slots and the engine's buffers
    are what stays resident, Level-2 goes to the temporary directory. ``l1_slots=8`` of 1 MiB
    grew the peak by 405 MiB with "auto" and 52.6 with interval 10 (states in DRAM up to the
    quarter-of-memory default bound), 1500 states of 0.56 MiB under ``l1_slots=6`` by 852 MiB;
    "auto" on a disk also kept its 32 MiB cost probe resident beside a 12 MiB plan."""
    report = accounted_run(n, nbytes, {"TMPDIR": str(disk_dir)}, l1_slots=l1_slots,
                           interval=interval)
    growth_within(report, slots_bytes(l1_slots, nbytes))
    assert report["writes"][0] == 0 and report["writes"][1] > 0, report


def test_auto_on_a_disk_holds_no_more_than_its_slots(disk_dir: Path) -> None:
    """``l1_slots=8`` of 1 MiB, Level-2 a directory, "auto": the probe that prices faulting
    buffers in made 32 MiB of them and the pool kept them (33.5 MiB grown where the plan
    holds 12); it makes no more than the plan's buffers now."""
    report = accounted_run(400, MiB, l1_slots=8, interval="auto", storage=str(disk_dir))
    growth_within(report, slots_bytes(8, MiB))


@pytest.mark.parametrize("interval", [1, 4, "auto"])
def test_a_tmpfs_tier_beside_the_heap_counts_once(interval: int | str, shm_dir: Path,
                                                  disk_dir: Path) -> None:
    """``storage=[tmpfs, disk]`` under 32 MiB: what the tmpfs tier holds and what the heap
    holds stay within the budget together at every moment sampled (resident and tmpfs
    summed), for states of 0.56 and 2 MiB."""
    budget = 32 * MiB
    for nbytes in (587202, 2 * MiB):
        report = accounted_run(200, nbytes, interval=interval, memory_budget=budget,
                               storage=[str(shm_dir / "tier"), str(disk_dir)])
        held_within(report, budget)
        assert report["tmpfs_peak"] > 0 and report["writes"][1] > 0, report


def _codec_run(compression: str, disk_dir: Path) -> dict:
    """4.5 MiB states under 32 MiB, Level-2 a directory, ``compression``: its stats, or its
    error (a child of its own: the codec's buffers are the process's)."""
    code = f"""
import json, logging, numpy as np
from asyncckpt import ArrayCheckpoint, AsyncCheckpointer
logging.basicConfig(level=logging.INFO, format="%(name)s: %(message)s")
state = np.zeros(int(4.5 * 2**20) // 8); adjoint = np.zeros_like(state)
class Forward:
    def apply(self, *, t_start, t_end):
        for _ in range(t_start, t_end):
            np.sin(state, out=state); np.add(state, 1.0, out=state)
class Reverse:
    def apply(self, *, t_start, t_end):
        adjoint[:] += np.cos(state)
try:
    with AsyncCheckpointer(ArrayCheckpoint([state]), Forward(), Reverse(), 120,
                           memory_budget="32MiB", storage={str(disk_dir)!r},
                           compression={compression!r}) as ckp:
        ckp.apply_forward(); ckp.apply_reverse()
    print(json.dumps(ckp.stats.as_dict()))
except ValueError as exc:
    print(json.dumps({{"error": type(exc).__name__ + ": " + str(exc)}}))
"""
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                          cwd=ROOT, timeout=300)
    assert done.returncode == 0, done.stderr
    return {**json.loads(done.stdout.strip().splitlines()[-1]), "log": done.stderr}


def test_a_codec_that_does_not_fit_beside_level2_is_declined_or_refused(disk_dir: Path
                                                                        ) -> None:
    """4.5 MiB states, 32 MiB, Level-2 a directory: the codec's four buffers leave no room for
    Level-2 beside the engine's, and the run fell back to Revolve in Level-1 (interval 0,
    no state encoded, 3.2 times as long) saying nothing. "auto" declines the codec, says so in
    ``stats`` and keeps Level-2; "lz4" asked for by name is refused naming the bytes."""
    pytest.importorskip("blosc2")
    auto = _codec_run("auto", disk_dir)
    assert auto["interval"] > 0 and auto["encoded_states"] == 0, auto
    assert "no room" in auto["compression_declined"], auto
    assert "42467328 bytes, more than memory_budget=33554432" in auto["compression_declined"]
    assert "compression='auto' declined: " in auto["log"], auto["log"]
    refused = _codec_run("lz4", disk_dir)
    assert refused.get("error", "").startswith("InvalidValueError: compression="), refused
    assert "42467328 bytes, more than memory_budget=33554432 bytes" in refused["error"]


def documented_beyond_budget(value: str) -> str:
    """The last column of docs/budgets.md's ``storage=`` table, for the row of ``value``."""
    for line in (ROOT / "docs" / "budgets.md").read_text().splitlines():
        if line.startswith(f"| {value} |"):
            return line.rstrip(" |").rsplit("|", 1)[1].strip()
    raise AssertionError(f"docs/budgets.md's storage= table has no row for {value}")


@pytest.mark.parametrize(("storage", "row"), [
    (None, "`None`"), ("dram", '`"dram"`'), ("numa:0", '`"numa:N"`')])
def test_the_storage_names_do_what_the_table_says(storage: str | None, row: str,
                                                  disk_dir: Path) -> None:
    """200 states of 2 MiB under 24 MiB, interval 1: ``None`` spilled to the temporary
    directory and ``"dram"`` and ``"numa:0"`` refused, where the table gave the three one row.
    Each does what its row says; "auto" plans within the budget with each."""
    budget, env = 24 * MiB, {"TMPDIR": str(disk_dir)}
    beyond = documented_beyond_budget(row)
    report = accounted_run(200, 2 * MiB, env, l1_slots=2, interval=1, memory_budget=budget,
                           storage=storage)
    if beyond == "refused":
        assert "MemoryBudgetError" in report.get("error", ""), report
        assert f"memory_budget={budget}" in report["error"], report
    else:
        assert beyond == "go to the temporary directory", beyond
        growth_within(report, budget)
        assert report["tiers"][1] == "FileStorage" and report["writes"][1] > 0, report
    growth_within(accounted_run(200, 2 * MiB, env, interval="auto", memory_budget=budget,
                                storage=storage), budget)
