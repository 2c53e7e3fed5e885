"""Real mpiexec runs of 2 to 64 ranks on this machine (tests/mpi_job.py): one plan on every rank,
exact adjoints per rank, a constant count of collectives per run, and a failure on one rank
raised on all of them, none left hanging."""
from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from conftest import ROOT, TESTS

pytest.importorskip("mpi4py")
BIN = Path(sys.executable).parent
MPIEXEC = shutil.which("mpiexec", path=f"{BIN}{os.pathsep}{os.environ.get('PATH', '')}")
if MPIEXEC is None:
    pytest.skip("no mpiexec (pip install '.[mpi]' brings Open MPI)", allow_module_level=True)

JOB = TESTS / "mpi_job.py"


def mpirun(ranks: int, scenario: str, root: Path, *, job: Path = JOB,
           args: list[str] | None = None, env: dict[str, str] | None = None) -> list[dict]:
    """Each rank's JSON line, by rank; a hang fails the test after 300 s."""
    # the checkout's asyncckpt, not the one installed (the job's sys.path[0] is tests/)
    path = os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")]))
    env = {**os.environ, "PATH": f"{BIN}{os.pathsep}{os.environ.get('PATH', '')}",
           "PYTHONPATH": path, "OMPI_ALLOW_RUN_AS_ROOT": "1",
           "OMPI_ALLOW_RUN_AS_ROOT_CONFIRM": "1", **(env or {})}
    command = [str(job)] + (args if args is not None else [scenario, str(root)])
    # 4 ranks on 2 cores: more ranks than cores, as a laptop or a CI runner has
    done = subprocess.run([MPIEXEC, "--oversubscribe", "-n", str(ranks), sys.executable,
                           *command], capture_output=True, text=True, timeout=300, env=env)
    lines = [json.loads(line) for line in done.stdout.splitlines() if line.startswith("{")]
    assert len(lines) == ranks, (done.returncode, done.stdout[-2000:], done.stderr[-2000:])
    return sorted(lines, key=lambda line: line["rank"])


@pytest.mark.parametrize("ranks", [2, 4])
def test_every_rank_runs_one_plan_and_its_own_exact_adjoint(tmp_path, ranks: int) -> None:
    results = mpirun(ranks, "plans", tmp_path)
    for name in ("auto", "adaptive", "fixed", "unknown-n"):
        for run in range(2):
            seen = [r[name][run] for r in results]
            assert all(s["exact"] for s in seen), (name, run)
            plan = {(s["n"], s["interval"], s["slots"], tuple(s["starts"]), s["tf"])
                    for s in seen}
            assert len(plan) == 1, (name, run, plan)  # one plan, the slowest rank's costs
    assert results[0]["unknown-n"][0]["n"] == 60  # ended by the last rank's stop alone
    # the slowest rank's step (0.2 ms of sleep on rank 0, against some 5 us elsewhere) sets
    # every rank's tf (the fit may count part of the sleep as the call's cost)
    assert results[-1]["auto"][1]["tf"] >= 1e-4
    # per-rank Level-2 directories under the one path given (removed again when closed)
    assert not list(tmp_path.glob("rank*/*"))


@pytest.mark.parametrize("ranks", [2, 4])
@pytest.mark.parametrize("scenario, failing, error", [
    ("write-fails", -1, "TransferError"),
    ("operator-fails", 1, "RuntimeError"),
])
def test_a_failure_on_one_rank_raises_on_every_rank(tmp_path, ranks: int, scenario: str,
                                                     failing: int, error: str) -> None:
    results = mpirun(ranks, scenario, tmp_path)
    failing %= ranks
    assert results[failing]["raised"] == error
    for result in results:
        if result["rank"] != failing:
            assert result["raised"] == "RankFailedError"
            assert f"rank {failing} of {ranks} failed ({error}" in result["message"]
    if scenario == "operator-fails":  # a second run of the same checkpointers fails alike
        assert [r["again"] for r in results] == [r["raised"] for r in results]


# 64 ranks on two cores start 64 interpreters: 67 to 110 s here, past the default 120 s under load
@pytest.mark.timeout(400)
@pytest.mark.parametrize("ranks", [
    2, 4, 8, pytest.param(16, marks=pytest.mark.slow), pytest.param(64, marks=pytest.mark.slow)])
def test_collectives_per_run_are_a_constant_and_none_is_pickled(tmp_path, ranks: int) -> None:
    """A fixed interval makes the same number of collectives at n = 100 and n = 10000: the
    run's own agreement points and the ends of its sweeps, each a reduction of numbers; the
    communicator sees no other call (no gather, no pickled object)."""
    results = mpirun(ranks, "counts", tmp_path)
    for result in results:
        for name in ("fixed-100", "fixed-10000", "adaptive", "auto"):
            assert all(run["exact"] for run in result[name]["runs"]), (result["rank"], name)
            assert set(result[name]["calls"]) == {"Iallreduce", "Free"}, result[name]["calls"]
        fixed = [run["collectives"] for name in ("fixed-100", "fixed-10000")
                 for run in result[name]["runs"]]
        # 8 agreement points in each sweep, and each sweep's end
        assert fixed == [18, 18, 18, 18], fixed
        assert result["fixed-10000"]["runs"][0]["writes"] == 2000
        # "auto" agrees on its costs and its plan once a run, then runs free
        assert all(run["collectives"] <= 24 for run in result["auto"]["runs"])
    assert len({json.dumps(r["adaptive"]["runs"]) for r in results}) == 1  # one online plan


@pytest.mark.parametrize("ranks, seeds", [(2, range(0, 4)), (4, range(4, 10)), (8, range(10, 13))])
def test_a_failure_at_a_random_step_of_either_sweep_raises_on_every_rank(
        tmp_path, ranks: int, seeds: range) -> None:
    """One rank, drawn at random, fails at a random step: a Level-2 write or read (that rank
    goes on making its operator calls) or its forward or reverse operator (it stops and joins
    the others' reductions). Every rank raises: the failing one its own error, the others
    RankFailedError naming it, by the agreement point after next: 8 points a sweep over its 12
    intervals of 5 steps, the end of the forward sweep being one, so a failure in the forward
    sweep is raised within 2 intervals of the reverse sweep."""
    expected = {"write": "TransferError", "read": "TransferError",
                "forward": "RuntimeError", "reverse": "RuntimeError"}
    for seed in seeds:
        results = mpirun(ranks, "", tmp_path / str(seed),
                         args=["random-failure", str(tmp_path / str(seed)), str(seed)])
        failing, kind = results[0]["failing"], results[0]["kind"]
        assert results[failing]["raised"] == expected[kind], (seed, results[failing])
        for result in results:
            if result["rank"] != failing:
                assert result["raised"] == "RankFailedError", (seed, result)
                assert f"rank {failing} of {ranks} failed ({expected[kind]}" in result["message"]
            if kind in ("write", "forward"):
                assert result["reverse_steps"] <= 10, (seed, result)
        assert not list((tmp_path / str(seed)).glob("rank*/*"))  # no Level-2 file left


def test_compat_plans_over_comm_world_in_a_running_mpi_job(tmp_path) -> None:
    results = mpirun(2, "compat", tmp_path)
    assert all(r["collective"] and r["exact"] for r in results)
    assert len({r["interval"] for r in results}) == 1


@pytest.mark.timeout(600)
@pytest.mark.parametrize("ranks, budget", [(2, None), (2, "512KiB"), (4, "512KiB")])
def test_devito_mpi_gradient_equals_its_full_history_on_every_rank(tmp_path, ranks: int,
                                                                   budget) -> None:
    """Devito's acoustic gradient under DEVITO_MPI=1 on 2 and 4 ranks, unmodified but for the
    Revolver, on its default path: every rank's part equals Devito's own full-history MPI
    gradient bit for bit, twice. The default budget holds every state in Level-1; 512 KiB
    sends the first gradient's through Level-2."""
    pytest.importorskip("devito")
    pytest.importorskip("examples.seismic.acoustic")
    if shutil.which("mpicc", path=f"{BIN}{os.pathsep}{os.environ.get('PATH', '')}") is None:
        pytest.skip("no mpicc to compile Devito's MPI operators")
    extra = {"DEVITO_MPI": "1"}
    if budget is not None:
        extra["ASYNCCKPT_MEMORY_BUDGET"] = budget
    results = mpirun(ranks, "", tmp_path, job=JOB.with_name("devito_mpi_job.py"),
                     args=["600"], env=extra)
    for result in results:
        assert result["exact"] == [True, True], result
        assert all(collective for collective, _, _ in result["plans"])
        assert result["plans"] == results[0]["plans"]
    if budget is not None:
        # the first gradient goes through Level-2; the next may keep to Level-1 once a run
        # has priced the copies beside the I/O thread
        assert results[0]["plans"][0][1] > 0


def test_recompute_is_refused_under_mpi_on_every_rank_with_the_reason(tmp_path) -> None:
    """A rank rebuilding a lost state alone used to deadlock peers whose operators exchange
    halos with it."""
    results = mpirun(2, "recompute-refused", tmp_path)
    assert [r["error"] for r in results] == ["UsageError", "UsageError"]
    assert all("under MPI (2 ranks)" in r["message"] for r in results)


def test_a_delete_stalled_on_one_rank_is_a_checkpoint_error_on_every_rank(tmp_path) -> None:
    """The last rank's deletes stall for good (transfer_timeout 1 s), in the reverse sweep and
    again in the next run's deletes of what the first left: each run ends on every rank in a
    CheckpointError within the deadline + 5 s (the stalled rank's, RankFailedError naming it
    elsewhere), and none waits for the stalled rank for good. The next run took 15 s."""
    results = mpirun(2, "delete-stalls", tmp_path)
    for result in results:
        for run in result["runs"]:
            assert run["checkpoint_error"] and run["seconds"] < 1.0 + 5.0, (result["rank"], run)
            assert run["raised"] == ("Stalled" if result["rank"] == 1 else "RankFailedError")
        assert result["close_s"] < 2.5


@pytest.mark.parametrize("ranks", [2, 3])
def test_ranks_that_would_run_different_lengths_or_intervals_are_refused_on_every_rank(
        tmp_path, ranks: int) -> None:
    """n = 60 on all ranks but the last, which has 61 (or each rank its own fixed interval):
    the last rank finished while the others waited in a collective for good. Every rank now
    refuses at construction, with the values each rank holds."""
    results = mpirun(ranks, "runs-differ", tmp_path)
    for result in results:
        for name in ("fixed", "auto", "level1", "interval", "beyond-2^53"):
            seen = result[name]
            assert seen["raised"] == "RankFailedError", (result["rank"], name, seen)
            assert "the ranks disagree on n_timesteps" in seen["message"], seen["message"]
        assert "'n_timesteps': 61" in result["fixed"]["message"], result["fixed"]["message"]
        assert "'interval': 6" in result["interval"]["message"], result["interval"]["message"]
