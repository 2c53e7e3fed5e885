"""run_dir=: a run killed by a real SIGKILL anywhere in either sweep and resumed by a later
process gives store-all's gradient and the forward's outputs bit for bit; a reverse sweep
resumes without the forward; a run directory of another run, or a damaged one, is refused or
recomputed exactly (docs/resume.md).

``ASYNCCKPT_KILLS`` sets the random kill points of the long test (default 6; the long
profile runs 200).
"""
from __future__ import annotations

import json
import os
import random
import shutil
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from asyncckpt import AsyncCheckpointer, CheckpointError
from asyncckpt.errors import CorruptionError, TransferError, UsageError
from asyncckpt.storage.durable import STATES_FILE, DurableFileStorage
from asyncckpt.storage.rundir import MANIFEST, REMOVING, read_manifest
from asyncckpt.testing import StorageTests
from resume_job import Adjoint, Traces, operators, run
from workloads import RecurrentCell, store_all_reference

ROOT = Path(__file__).resolve().parents[2]
JOB = ROOT / "tests" / "resume_job.py"
KILLS = int(os.environ.get("ASYNCCKPT_KILLS", "6"))
N, INTERVAL = 40, 6


def job(run_dir: Path, *args: object, timeout: float = 60) -> subprocess.CompletedProcess:
    """resume_job.py in a process of its own, on this checkout's asyncckpt."""
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    return subprocess.run([sys.executable, str(JOB), str(run_dir), *map(str, args)],
                          capture_output=True, text=True, timeout=timeout, env=env)


@pytest.fixture(scope="module")
def reference() -> dict:
    """Store-all's gradients and the outputs of an uninterrupted forward sweep, as hex."""
    model = RecurrentCell(N)
    gradients = store_all_reference(model)
    model.reset()
    outputs = [model.h.copy()]
    for t in range(N):
        model.step(t)
        outputs.append(model.h.copy())
    return {"gradients": [g.tobytes().hex() for g in gradients],
            "outputs": np.stack(outputs).tobytes().hex()}


def killed(run_dir: Path, *kill: object) -> None:
    """Run the job until it kills itself (SIGKILL) where ``kill`` says."""
    done = job(run_dir, N, INTERVAL, *kill)
    assert done.returncode == -9, (done.returncode, done.stderr[-2000:])


def resumed(run_dir: Path) -> dict:
    """Run the job to its end on ``run_dir``; what it printed."""
    done = job(run_dir, N, INTERVAL)
    assert done.returncode == 0, done.stderr[-2000:]
    return json.loads(done.stdout)


def check_exact(result: dict, reference: dict) -> None:
    assert result["gradients"] == reference["gradients"]
    assert result["outputs"] == reference["outputs"]


def test_a_forward_sweep_killed_resumes_from_its_last_commit(tmp_path, reference):
    run_dir = tmp_path / "run"
    # with two staging buffers the store of u_30 waited for the write of u_18 at the latest:
    # its commit was under way at the kill
    killed(run_dir, "fwd", 33, 0, 18)
    manifest = read_manifest(run_dir)
    assert manifest["sweep"] == "forward" and manifest["step"] in (18, 24, 30)
    assert (run_dir.stat().st_mode & 0o777) == 0o700
    assert manifest["writer"].startswith("asyncckpt ")
    result = resumed(run_dir)
    assert result["resumed"]["sweep"] == "forward"
    assert result["resumed"]["step"] == manifest["step"]
    assert result["forward_steps"] == N - manifest["step"]  # none before the commit again
    check_exact(result, reference)
    assert not run_dir.exists()  # a finished run's is removed


def test_a_reverse_sweep_killed_resumes_without_the_forward(tmp_path, reference):
    run_dir = tmp_path / "run"
    killed(run_dir, "rev", 20, 0, 24)
    assert read_manifest(run_dir)["sweep"] == "reverse"
    result = resumed(run_dir)
    assert result["resumed"] == {"sweep": "reverse", "step": 24, "interval": INTERVAL,
                                 "states": 4}
    assert result["reverse_steps"] == 24  # steps 39..24 were reversed before the kill
    assert result["forward_steps"] < 24  # recomputation inside intervals only
    check_exact(result, reference)


def test_kills_at_random_points_of_either_sweep(tmp_path, reference):
    """SIGKILL from a timer thread, landing anywhere: in a write, a commit, a restore. Each
    kill is followed by a resumption (which may itself be killed)."""
    rng = random.Random(61)
    seen = set()
    for point in range(KILLS):
        run_dir = tmp_path / f"run{point}"
        for attempt in range(rng.randint(1, 2)):  # killed once or twice
            kind = ["fwd", "rev"][point % 2] if attempt == 0 else rng.choice(["fwd", "rev"])
            at = rng.randrange(N)
            # the first kill at an operator's step, once the commit sure to be on its way is
            # in place (with two staging buffers the store of u_s waited for the write of
            # u_{s-12}; in the reverse, the forward's end), a second one a moment later,
            # wherever the run is then
            last = (at - 1) // INTERVAL * INTERVAL - 2 * INTERVAL
            delay = 0.0 if attempt == 0 else rng.uniform(0, 0.01)
            committed = kind == "rev" or last >= 0
            settle = [last if kind == "fwd" else N] if committed and not delay else []
            done = job(run_dir, N, INTERVAL, kind, at, delay, *settle)
            assert done.returncode in (0, -9), done.stderr[-2000:]
            if attempt == 0 and settle:
                seen.add(read_manifest(run_dir)["sweep"])
        check_exact(resumed(run_dir), reference)
    if KILLS >= 6:  # the points drawn resume both sweeps
        assert {"forward", "reverse"} <= seen, seen


def test_another_runs_directory_is_refused_naming_what_differs(tmp_path):
    run_dir = tmp_path / "run"
    killed(run_dir, "fwd", 20, 0, 0)
    model = RecurrentCell(N - 1)
    fwd, rev = operators(model, Traces(model))
    with pytest.raises(UsageError, match=r"n_timesteps 40 there, 39 here"):
        AsyncCheckpointer(model, fwd, rev, N - 1, l1_slots=2, run_dir=run_dir,
                          outputs=Traces(model), adjoint=Adjoint(model))
    model = RecurrentCell(N, dtype=np.float32)
    fwd, rev = operators(model, Traces(model))
    with pytest.raises(UsageError, match=r"dtype 'float64' there, 'float32' here"):
        AsyncCheckpointer(model, fwd, rev, N, l1_slots=2, run_dir=run_dir,
                          outputs=Traces(model), adjoint=Adjoint(model))
    model = RecurrentCell(N, hidden=6)
    fwd, rev = operators(model, Traces(model))
    with pytest.raises(UsageError, match=r"shapes"):
        AsyncCheckpointer(model, fwd, rev, N, l1_slots=2, run_dir=run_dir,
                          outputs=Traces(model), adjoint=Adjoint(model))
    unrelated = tmp_path / "mine"
    unrelated.mkdir()
    (unrelated / "notes.txt").write_text("keep me")
    with pytest.raises(UsageError, match="notes.txt"):
        run(str(unrelated), N, INTERVAL)
    assert (unrelated / "notes.txt").read_text() == "keep me"


def test_a_damaged_manifest_is_refused(tmp_path):
    run_dir = tmp_path / "run"
    killed(run_dir, "fwd", 33, 0, 18)
    path = run_dir / MANIFEST
    text = path.read_text()
    assert '"sweep": "forward"' in text
    path.write_text(text.replace('"sweep": "forward"', '"sweep": "reverse"'))
    with pytest.raises(CorruptionError, match="checksum"):
        run(str(run_dir), N, INTERVAL)


def flip(path: Path, offset: int) -> None:
    with open(path, "r+b") as file:
        file.seek(offset)
        byte = file.read(1)
        file.seek(offset)
        file.write(bytes([byte[0] ^ 0xFF]))


def test_a_damaged_state_is_refused_or_recomputed_exactly(tmp_path, reference):
    """The state a forward sweep resumes from is checked before it is restored; an earlier one
    when the reverse sweep reads it: refused, or under on_level2_error="recompute" rebuilt
    from an earlier one."""
    run_dir = tmp_path / "run"
    killed(run_dir, "fwd", 33, 0, 18)
    manifest = read_manifest(run_dir)
    record = {key: slot for key, slot, _, _ in manifest["states"]}
    flip(run_dir / STATES_FILE, record[manifest["step"]] * 4096 + 7)
    with pytest.raises(CorruptionError, match=f"u_{manifest['step']}"):
        run(str(run_dir), N, INTERVAL)
    kept = tmp_path / "kept"
    shutil.copytree(run_dir, kept)
    result = run(str(kept), N, INTERVAL, on_level2_error="recompute")
    assert result["forward_steps"] == N  # from u_0 again
    check_exact(result, reference)
    flip(run_dir / STATES_FILE, record[manifest["step"]] * 4096 + 7)  # mended
    flip(run_dir / STATES_FILE, record[6] * 4096 + 7)
    with pytest.raises(TransferError, match="u_6"):
        run(str(run_dir), N, INTERVAL)
    result = run(str(run_dir), N, INTERVAL, on_level2_error="recompute")
    check_exact(result, reference)


def test_missing_files_are_refused(tmp_path):
    run_dir = tmp_path / "run"
    killed(run_dir, "fwd", 33, 0, 18)
    outputs = read_manifest(run_dir)["outputs"]["file"]
    (run_dir / outputs).unlink()
    with pytest.raises(CheckpointError, match=outputs):
        run(str(run_dir), N, INTERVAL)
    (run_dir / STATES_FILE).unlink()
    with pytest.raises(CheckpointError, match=STATES_FILE):
        run(str(run_dir), N, INTERVAL)


def test_a_finished_run_is_kept_where_asked_and_resumes_at_its_end(tmp_path, reference):
    run_dir = tmp_path / "run"
    check_exact(run(str(run_dir), N, "auto", keep_run_dir=True), reference)
    assert read_manifest(run_dir)["sweep"] == "done"
    again = run(str(run_dir), N, INTERVAL, keep_run_dir=True)
    assert again["resumed"]["sweep"] == "reverse" and again["resumed"]["step"] == 0
    assert again["forward_steps"] == again["reverse_steps"] == 0
    check_exact(again, reference)


def test_options_that_cannot_resume_are_refused(tmp_path):
    model = RecurrentCell(N)
    fwd, rev = operators(model, Traces(model))
    for options, match in [({"interval": "adaptive"}, "adaptive"),
                           ({"verify": False}, "verify"),
                           ({"storage": str(tmp_path)}, "storage="),
                           ({"run_dir": None, "outputs": Traces(model)}, "run_dir"),
                           ({"run_dir": 3}, "run_dir must be")]:
        options = {"run_dir": tmp_path / "run", **options}
        with pytest.raises(CheckpointError, match=match):
            AsyncCheckpointer(model, fwd, rev, N, l1_slots=2, **options)


class TestDurableFileStorage(StorageTests):
    """The Level-2 of a run directory keeps the Storage contract."""

    def make_storage(self, tmp_path: Path) -> DurableFileStorage:
        return DurableFileStorage(tmp_path / "run")


def test_durable_storage_hands_its_states_to_a_later_backend(tmp_path):
    first = DurableFileStorage(tmp_path)
    states = {key: np.full(5000, key, np.uint8) for key in (0, 6, 12)}
    for key, state in states.items():
        first.put(key, state)
    first.delete(6)
    records = first.records()
    first.close()
    assert (tmp_path / STATES_FILE).exists()
    later = DurableFileStorage(tmp_path)
    later.restore(5000, records)
    for key in (0, 12):
        out = np.zeros(5000, np.uint8)
        later.get(key, out)
        assert (out == key).all()
    assert 6 not in later
    later.put(18, states[6])  # into the record 6 left, not over a restored one
    out = np.zeros(5000, np.uint8)
    later.get(12, out)
    assert (out == 12).all()
    later.close()
    with open(tmp_path / STATES_FILE, "r+b") as file:
        file.truncate(4096)
    cut = DurableFileStorage(tmp_path)
    with pytest.raises(CorruptionError, match="cut short"):
        cut.restore(5000, records)
    cut.close()


def test_a_run_killed_while_its_directory_was_removed_starts_afresh(tmp_path, reference):
    """close() puts the manifest aside first: what a kill then leaves is no run, and the
    record of its files, which a fresh run removes before it starts (a kill that removed a
    snapshot first left a manifest naming it)."""
    run_dir = tmp_path / "run"
    killed(run_dir, "rev", 20, 0, 24)
    (run_dir / MANIFEST).rename(run_dir / REMOVING)
    result = run(str(run_dir), N, INTERVAL)
    assert result["resumed"] is None
    check_exact(result, reference)
    assert not run_dir.exists()


def test_compat_revolver_takes_a_run_dir(tmp_path, reference):
    """pyrevolve's Revolver with n_checkpoints keeps Revolve in its slots alone, unless given
    a run directory: that is Level-2, as storage= would be."""
    from asyncckpt.compat import Revolver
    from workloads import forward_reverse
    model = RecurrentCell(N)
    fwd, rev = operators(model, Traces(model))
    with Revolver(model, fwd, rev, 2, N, run_dir=tmp_path / "run") as revolver:
        assert revolver.checkpointer.resumed is None
        gradients = forward_reverse(model, revolver)
        assert revolver.checkpointer.interval > 0
        assert (tmp_path / "run").exists()
    assert [g.tobytes().hex() for g in gradients] == reference["gradients"]
    assert not (tmp_path / "run").exists()


def test_auto_stores_on_level2_with_a_run_dir_where_level1_alone_prices_faster(tmp_path):
    """A run directory commits what a run stores on Level-2: "auto" keeps to plans that store
    some, even where Revolve in Level-1 alone is priced faster (as it is without one)."""
    from asyncckpt._memory.buffers import padded
    from asyncckpt.checkpoint import check_descriptor
    from workloads import Forward, Leapfrog, Reverse, forward_reverse, store_all_reference

    n = 40
    model = Leapfrog(n)
    reference = store_all_reference(model)
    budget = 12 * padded(check_descriptor(model))
    for run_dir in (None, tmp_path / "run"):
        with AsyncCheckpointer(model, Forward(model), Reverse(model), n, memory_budget=budget,
                               run_dir=run_dir) as ckp:
            tiers = ckp.costs.tier_costs
            ckp.costs = ckp.costs.replace(  # Level-2 priced ruinous
                tf=1e-3, tb=2e-3, tcall=0.0, tf_busy=1e-3, tb_busy=2e-3, tcall_busy=0.0,
                tx=0.0, tw=10.0, tr=10.0,
                tier_costs=None if tiers is None else ((10.0, 10.0),) * len(tiers))
            got = forward_reverse(model, ckp)
            assert (ckp.stats.interval > 0) == (run_dir is not None), ckp.stats.interval
            assert all(a.tobytes() == b.tobytes() for a, b in zip(got, reference))
