"""The run directory is the run's own: where it is, what is written in it and removed from it,
who holds it, and how long a stalled device holds the caller (docs/resume.md, "The run
directory").

Each test is one way a directory was not the run's own: a relative path that followed the
program's ``os.chdir``, commits that deleted a user's ``*.bin``, symbolic links written through,
a lock a forked child kept, and a stalled commit that held the caller 60 s past
``transfer_timeout``.
"""
from __future__ import annotations

import os
import threading
import time
from pathlib import Path

import pytest

from asyncckpt import AsyncCheckpointer, CheckpointError
from asyncckpt._execution import committer
from asyncckpt._execution.bounded import ABANDON_S
from asyncckpt.errors import InvalidValueError, UsageError
from asyncckpt.storage.durable import STATES_FILE
from asyncckpt.storage.rundir import MANIFEST, REMOVING, read_manifest
from resume_job import Adjoint, Traces, operators, run
from workloads import RecurrentCell, store_all_reference

pytestmark = pytest.mark.timeout(90)

N, INTERVAL = 40, 6


@pytest.fixture(scope="module")
def reference() -> list[str]:
    """Store-all's gradients, as hex."""
    return [g.tobytes().hex() for g in store_all_reference(RecurrentCell(N))]


def checkpointer(model: RecurrentCell, run_dir: object, **options: object) -> AsyncCheckpointer:
    traces = Traces(model)
    traces.data[0] = model.h
    fwd, rev = operators(model, traces)
    return AsyncCheckpointer(model, fwd, rev, N, l1_slots=2, interval=INTERVAL,
                             run_dir=run_dir, outputs=traces, adjoint=Adjoint(model),
                             **options)


def gradients(model: RecurrentCell) -> list[str]:
    return [g.tobytes().hex() for g in model.gradients()]


def test_a_relative_run_dir_stays_where_it_was_given(tmp_path, monkeypatch, reference):
    """A relative run_dir followed the program's os.chdir: the commits landed in run/ under
    the new directory, a user's file there was deleted, and the first run/ was left behind.
    It is made absolute when the checkpointer is made."""
    first, second = tmp_path / "first", tmp_path / "second"
    first.mkdir()
    (second / "run").mkdir(parents=True)
    (second / "run" / "notes.bin").write_text("the user's")
    monkeypatch.chdir(first)
    model = RecurrentCell(N)
    with checkpointer(model, "run") as ckp:
        monkeypatch.chdir(second)
        ckp.apply_forward()
        assert read_manifest(first / "run")["sweep"] == "reverse"
        assert not (second / "run" / MANIFEST).exists()
        model.reset_adjoint()
        ckp.apply_reverse()
    assert gradients(model) == reference
    assert not (first / "run").exists()
    assert [p.name for p in (second / "run").iterdir()] == ["notes.bin"]
    assert (second / "run" / "notes.bin").read_text() == "the user's"


@pytest.mark.parametrize("given", ["$JOB_NAME/run", "scratch/${JOB_NAME}/run", "~/run",
                                   "~someone/run"])
def test_an_unexpanded_variable_or_home_is_refused(tmp_path, monkeypatch, given):
    """Python expands no ``$VAR`` nor ``~`` in a path: docs/resume.md's example made every job
    share one literal ``$JOB_NAME`` directory. Such a run_dir is refused, naming it, and
    nothing is made."""
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("JOB_NAME", "job-1")
    for value in (given, Path(given)):
        with pytest.raises(InvalidValueError, match="expand") as info:
            checkpointer(RecurrentCell(N), value)
        assert repr(str(given)) in str(info.value)
    assert list(tmp_path.iterdir()) == []


def test_the_run_removes_only_the_files_its_manifests_named(tmp_path, reference):
    """A commit deleted every ``*.bin`` of the directory its manifest did not name, a user's
    among them. Only the files a manifest named (and the run's own temporaries) are removed;
    the directory, not empty then, stays."""
    run_dir = tmp_path / "run"
    model = RecurrentCell(N)
    with checkpointer(model, run_dir) as ckp:
        for name in ("results.bin", "outputs.1.bin", "adjoint.99.bin"):
            (run_dir / name).write_text("the user's")
        ckp.apply_forward()
        model.reset_adjoint()
        ckp.apply_reverse()
    assert gradients(model) == reference
    assert sorted(p.name for p in run_dir.iterdir()) == ["adjoint.99.bin", "outputs.1.bin",
                                                         "results.bin"]
    assert all(p.read_text() == "the user's" for p in run_dir.iterdir())


@pytest.mark.parametrize("name", [STATES_FILE, f".{MANIFEST}.tmp"])
def test_a_symbolic_link_in_the_directory_is_never_written_through(tmp_path, name, reference):
    """A symbolic link named states.bin or .manifest.json.tmp was written through: a file
    outside the directory was overwritten. states.bin is opened without following a link (a
    link there is refused, naming it); the manifest's temporary is the run's own, made anew."""
    outside = tmp_path / "precious"
    outside.write_bytes(b"keep me" * 1000)
    run_dir = tmp_path / "run"
    run_dir.mkdir(mode=0o700)
    (run_dir / name).symlink_to(outside)
    model = RecurrentCell(N)
    if name == STATES_FILE:
        with pytest.raises(CheckpointError, match="symbolic link") as info:
            checkpointer(model, run_dir)
        assert str(run_dir / name) in str(info.value)
    else:
        with checkpointer(model, run_dir) as ckp:
            ckp.apply_forward()
            model.reset_adjoint()
            ckp.apply_reverse()
        assert gradients(model) == reference
        assert not run_dir.exists()
    assert outside.read_bytes() == b"keep me" * 1000


def test_a_snapshot_named_by_a_link_is_refused(tmp_path):
    """A resumed run reads the files its manifest names without following a link."""
    run_dir = tmp_path / "run"
    model = RecurrentCell(N)
    with checkpointer(model, run_dir) as ckp:
        ckp.apply_forward()  # the forward sweep's end is committed: the reverse resumes
    outputs = read_manifest(run_dir)["outputs"]["file"]
    (run_dir / outputs).rename(tmp_path / "moved")
    (run_dir / outputs).symlink_to(tmp_path / "moved")
    with pytest.raises(CheckpointError, match="symbolic link"):
        run(str(run_dir), N, INTERVAL)


def test_a_forked_child_does_not_hold_the_directory(tmp_path, reference):
    """The directory's lock was inherited by a forked child (a pool worker): a resubmitted
    job was refused "in use" until the child exited. A child closes its copy at the fork."""
    run_dir = tmp_path / "run"
    model = RecurrentCell(N)
    ckp = checkpointer(model, run_dir)
    read, write = os.pipe()
    pid = os.fork()
    if pid == 0:  # the child: wait for the parent, hold whatever the fork gave it
        os.close(write)
        os.read(read, 1)
        os._exit(0)
    os.close(read)
    try:
        ckp.apply_forward()
        ckp.close()  # killed between the sweeps, as far as the directory knows
        resubmitted = run(str(run_dir), N, INTERVAL)  # while the child lives
        assert resubmitted["resumed"]["sweep"] == "reverse"
        assert resubmitted["gradients"] == reference
    finally:
        os.close(write)
        os.waitpid(pid, 0)
    assert not run_dir.exists()


class StalledCommits:
    """The run directory's device stalls: every manifest put in place from the
    ``block_from``-th on waits until :attr:`release` is set (the test's end)."""

    def __init__(self, block_from: int) -> None:
        self.block_from, self.calls = block_from, 0
        self.release, self.entered = threading.Event(), threading.Event()
        self.write = committer.write_manifest

    def __call__(self, *args: object) -> None:
        self.calls += 1
        if self.calls >= self.block_from:
            self.entered.set()
            self.release.wait()
        self.write(*args)


@pytest.fixture
def stalled_commits(monkeypatch):
    made: list[StalledCommits] = []

    def make(block_from: int) -> StalledCommits:
        made.append(StalledCommits(block_from))
        monkeypatch.setattr(committer, "write_manifest", made[-1])
        return made[-1]

    yield make
    for stall in made:  # the stalled commits return, and their thread ends
        stall.release.set()


@pytest.mark.parametrize("block_from", [1, 3])
def test_a_stalled_commit_is_an_error_within_transfer_timeout(tmp_path, stalled_commits,
                                                              block_from, reference):
    """A commit that never returned held the caller 60 s with transfer_timeout=1, and close()
    60 s more. The sweep's wait for its commits is bounded by transfer_timeout, close() by
    its 2 s; the directory stays locked until the stalled commit ends, then resumes."""
    timeout = 1.0
    stall = stalled_commits(block_from)  # 1: the run's first commit; 3: one of its forward's
    run_dir = tmp_path / "run"
    model = RecurrentCell(N)
    ckp = checkpointer(model, run_dir, transfer_timeout=timeout)
    start = time.monotonic()
    with pytest.raises(CheckpointError, match="stalled") as info:
        ckp.apply_forward()
    assert time.monotonic() - start < timeout + 5.0
    assert isinstance(info.value.__cause__, TimeoutError)
    assert stall.entered.is_set()
    start = time.monotonic()
    ckp.close()
    assert time.monotonic() - start < ABANDON_S + 0.5
    # the stalled commit may still put its manifest in place: nobody else may take the run
    with pytest.raises(UsageError, match="in use"):
        checkpointer(RecurrentCell(N), run_dir)
    stall.release.set()
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline:
        try:
            result = run(str(run_dir), N, INTERVAL)
            break
        except UsageError:  # the commit's thread lets go once its write returned
            time.sleep(0.05)
    assert result["gradients"] == reference
    assert not run_dir.exists()


def test_a_removal_cut_short_is_finished_by_the_next_run(tmp_path, reference):
    """close() of a finished run first puts its manifest aside (REMOVING), then removes the
    files it names: a process killed in between leaves a record of them, which the next run
    in the directory removes before it starts afresh."""
    run_dir = tmp_path / "run"
    model = RecurrentCell(N)
    with checkpointer(model, run_dir, keep_run_dir=True) as ckp:
        ckp.apply_forward()
        model.reset_adjoint()
        ckp.apply_reverse()
    named = {value["file"] for value in read_manifest(run_dir).values()
             if isinstance(value, dict) and "file" in value}
    assert named and all((run_dir / name).exists() for name in named)
    (run_dir / MANIFEST).rename(run_dir / REMOVING)  # the kill came right after this
    result = run(str(run_dir), N, INTERVAL)
    assert result["resumed"] is None
    assert result["gradients"] == reference
    assert not run_dir.exists()


def test_a_commit_cut_short_leaves_nothing_behind(tmp_path, reference):
    """A process killed while it wrote a commit's snapshots leaves them unnamed, and one
    killed after a manifest was put in place but before the files it replaced were removed
    leaves those: the next process's first commit removes both (the run's own), and the run's
    end leaves no file behind."""
    run_dir = tmp_path / "run"
    model = RecurrentCell(N)
    with checkpointer(model, run_dir) as ckp:
        ckp.apply_forward()
    manifest = read_manifest(run_dir)
    following = manifest["commit"] + 1
    left = [f"{what}.{following}.bin" for what in manifest["snapshots"]]  # the killed commit's
    assert manifest["replaced"]  # the outputs of the last forward commit
    for name in left + manifest["replaced"]:
        (run_dir / name).write_bytes(b"\0" * 64)
    result = run(str(run_dir), N, INTERVAL)
    assert result["resumed"]["sweep"] == "reverse"
    assert result["gradients"] == reference
    assert not run_dir.exists()
