"""run_dir= under attack, with a workload of its own (tests/attack_job.py: a float64 field beside
an int64 counter in one ArrayCheckpoint, outputs of other sizes and dtypes): kills where no one
listed them, plans a run directory cannot follow, two processes on one directory. Every
gradient and output is compared bitwise with a store-all reference computed here."""
from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest
from hypothesis import event, given, note
from hypothesis import strategies as st
from profiles import profile

from asyncckpt import ArrayCheckpoint, AsyncCheckpointer, CheckpointError
from asyncckpt.errors import UsageError
from asyncckpt.storage.rundir import read_manifest
from attack_job import Arrays, Mixed, operators, reference, run
from conftest import ROOT

N, INTERVAL = 40, 6
JOB = ROOT / "tests" / "attack_job.py"


def job(run_dir: Path, *options: str, kill: str = "", step_s: float = 0.0,
        timeout: float = 60, seed: float | str = 1.0, adjoint: bool = True,
        outputs: bool = True, lose: int | None = None, n: int = N,
        interval: int | str = INTERVAL) -> subprocess.CompletedProcess:
    """attack_job.py in a process of its own, killed where ``kill`` says, seeding the adjoint
    with ``seed`` (a number, or "state": from the final state), with or without ``adjoint=``
    and ``outputs=``, every write of u_``lose`` failing."""
    env = {**os.environ, "PYTHONPATH": str(ROOT), "ATTACK_KILL": kill,
           "ATTACK_STEP_S": str(step_s), "ATTACK_SEED": str(seed),
           "ATTACK_ADJOINT": str(int(adjoint)), "ATTACK_OUTPUTS": str(int(outputs))}
    if lose is not None:
        env["ATTACK_LOSE"] = str(lose)
    return subprocess.run([sys.executable, str(JOB), str(run_dir), str(n), str(interval),
                           *options], capture_output=True, text=True, timeout=timeout, env=env)


def finished(run_dir: Path, *options: str, **how: object) -> dict:
    done = job(run_dir, *options, **how)
    assert done.returncode == 0, done.stderr[-2000:]
    return json.loads(done.stdout)


def exact(result: dict, seed: float | str = 1.0, n: int = N, outputs: bool = True) -> bool:
    """Whether what the program saw is the uninterrupted store-all run's, bit for bit: the
    gradient, the adjoint, the live state after apply_forward() and after apply_reverse(),
    and the outputs."""
    want = reference(n, seed)
    return (result["grad"] == want["grad"] and result["lam"] == want["lam"]
            and result["live"] == want["live"] and result["left"] == want["left"]
            and (not outputs or result["outputs"] == want["outputs"]))


def test_the_workload_has_a_gradient_and_a_counter_that_matters():
    """The comparisons below can fail: the gradient is not zero, and the int64 counter
    reaches the field (a state restored without it would give other bits)."""
    grad = np.frombuffer(bytes.fromhex(reference(N)["grad"]))
    assert np.count_nonzero(grad) == grad.size
    model = Mixed(N)
    for t in range(N):
        model.step(t)
    cut = Mixed(N)
    for t in range(N):
        cut.step(t)
        if t == N // 2:
            cut.k[0] += 1
    assert not np.array_equal(model.x, cut.x)


def test_a_kill_once_the_forward_sweep_returned_keeps_the_whole_forward(tmp_path):
    """apply_forward() returned: its last commit is on the device, so a job killed between the
    sweeps (by the queue, again and again at that point) never runs the forward sweep again."""
    run_dir = tmp_path / "run"
    for _ in range(2):
        assert job(run_dir, kill="between").returncode == -9
        manifest = read_manifest(run_dir)
        assert (manifest["sweep"], manifest["step"]) == ("reverse", N)
    result = finished(run_dir)
    assert result["resumed"]["sweep"] == "reverse" and result["resumed"]["step"] == N
    assert exact(result)
    assert not run_dir.exists()


@pytest.mark.parametrize("kill", ["replace-before:3", "replace-after:3", "unlink:1",
                                  "unlink:3", "rev:0"])
def test_kills_inside_commits_and_removal_resume_exactly(tmp_path, kill):
    """A kill before or after a manifest's rename, at a removal of close (or of the commit
    thread's old snapshots), at the reverse's last step; then a second kill mid-forward."""
    run_dir = tmp_path / "run"
    first = job(run_dir, kill=kill, step_s=0.002)
    assert first.returncode in (-9, 0), first.stderr[-2000:]
    second = job(run_dir, kill="fwd:25")
    assert second.returncode in (-9, 0), second.stderr[-2000:]
    assert exact(finished(run_dir))
    assert not run_dir.exists()


@pytest.mark.parametrize("options", [["l1_slots=40"], ['memory_budget="8KiB"']])
def test_a_plan_without_level2_is_refused_with_a_run_dir(tmp_path, options):
    """Every state in Level-1 (l1_slots >= n, or a budget with no room for Level-2 beside
    them): nothing could be committed, and a fresh run left its directory behind. A resumed
    run follows the plan its states were stored with (its Level-1 slots); one whose budget
    cannot hold that plan said it resumed, ran from u_0 and left the old manifest for the
    next job to redo: it is refused, and the run resumes exactly under a budget that holds
    its plan."""
    run_dir = tmp_path / "run"
    with pytest.raises(UsageError, match="Level-1"):
        _run(run_dir, options)
    assert not run_dir.exists()
    assert job(run_dir, kill="fwd:30", step_s=0.005).returncode == -9
    assert read_manifest(run_dir)["states"]
    again = job(run_dir, *options)
    if options[0].startswith("memory_budget"):
        assert again.returncode == 1 and "began with interval 6" in again.stderr, \
            again.stderr[-2000:]
        again = job(run_dir, 'memory_budget="64KiB"', "l1_slots=null")
    assert again.returncode == 0, again.stderr[-2000:]
    result = json.loads(again.stdout)
    assert result["resumed"]["sweep"] == "forward" and exact(result)
    assert not run_dir.exists()


def _run(run_dir: Path, options: list[str]) -> dict:
    parsed = {name: json.loads(value) for name, value in (o.split("=", 1) for o in options)}
    if "memory_budget" in parsed:
        parsed["l1_slots"] = None
    return run(str(run_dir), N, INTERVAL, **parsed)


def test_two_processes_on_one_run_dir(tmp_path):
    """A second process on a run directory in use is refused, naming it; the first's run is
    exact."""
    run_dir = tmp_path / "run"
    env = {**os.environ, "PYTHONPATH": str(ROOT), "ATTACK_STEP_S": "0.01"}
    first = subprocess.Popen([sys.executable, str(JOB), str(run_dir), str(N), str(INTERVAL)],
                             stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env)
    try:
        deadline = time.monotonic() + 30
        while not (run_dir / "manifest.json").exists() and time.monotonic() < deadline:
            time.sleep(0.01)
        model = Mixed(N)
        fwd, rev = operators(model, "")
        with pytest.raises(UsageError, match="in use"):
            AsyncCheckpointer(model.checkpoint, fwd, rev, N, l1_slots=2, interval=INTERVAL,
                              run_dir=run_dir, outputs=Arrays([model.trace, model.counts]),
                              adjoint=Arrays([model.lam, model.grad]))
    finally:
        out, err = first.communicate(timeout=60)
    assert first.returncode == 0, err[-2000:]
    assert exact(json.loads(out))
    assert not run_dir.exists()


def test_arrays_of_other_dtypes_are_another_run(tmp_path):
    """An ArrayCheckpoint's dtype is uint8 whatever its arrays: a state, outputs or adjoint of
    the same shapes and bytes but other dtypes (an int64 field beside a float64 counter) was
    resumed with its bits reinterpreted."""
    run_dir = tmp_path / "run"
    assert job(run_dir, kill="fwd:30", step_s=0.005).returncode == -9
    model = Mixed(N)
    fwd, rev = operators(model, "")
    outputs, adjoint = Arrays([model.trace, model.counts]), Arrays([model.lam, model.grad])
    for state, outs in [([model.x.view(np.int64), model.k.view(np.float64)], outputs),
                        ([model.x, model.k], Arrays([model.trace.view(np.int32),
                                                     model.counts]))]:
        with pytest.raises(UsageError, match="dtypes"):
            AsyncCheckpointer(ArrayCheckpoint(state), fwd, rev, N, l1_slots=2,
                              interval=INTERVAL, run_dir=run_dir, outputs=outs,
                              adjoint=adjoint)
    assert exact(finished(run_dir))


@pytest.mark.parametrize("storage", [None, "disk"])
def test_keep_forward_reverses_again_after_a_reverse_that_raised(storage, tmp_path):
    """A reverse sweep that raised (an adjoint operator's check of a bad seed), the first or a
    later one, leaves the kept forward sweep: the next apply_reverse() reverses it again, with
    no forward sweep, bit for bit; a new apply_forward() then starts a new run."""
    model = Mixed(N)
    fwd, rev = operators(model, "")
    failing: list[int] = []

    class Raising:
        def apply(self, *, t_start: int, t_end: int) -> None:
            if t_start in failing:
                failing.clear()
                raise FloatingPointError("NaN in the adjoint")
            rev.apply(t_start=t_start, t_end=t_end)

    def reverse(seed: float) -> str:
        model.lam[...], model.grad[...] = seed, 0.0
        ckp.apply_reverse()
        return model.grad.tobytes().hex()

    with AsyncCheckpointer(model.checkpoint, fwd, Raising(), N, l1_slots=2, interval=INTERVAL,
                           keep_forward=True,
                           storage=None if storage is None else str(tmp_path)) as ckp:
        ckp.apply_forward()
        for fail_at, seed in [(20, 1.0), (3, -2.0), (37, 0.5)]:
            failing.append(fail_at)
            with pytest.raises(FloatingPointError):
                reverse(seed)
            assert reverse(seed) == reference(N, seed)["grad"]
            assert ckp.stats.l2_writes == 0 and ckp.stats.forward_s == 0.0
        fresh = Mixed(N)
        model.x[...], model.k[...] = fresh.x, fresh.k
        ckp.apply_forward()
        assert reverse(1.0) == reference(N, 1.0)["grad"]
    assert storage is None or not list(tmp_path.iterdir())


#: the first step of the sweep started on a daemon thread sets ``started``
_FIRST_STEP = """
import sys, threading, time
sys.path.insert(0, "tests")
import attack_job
started = threading.Event()
advance = attack_job.Mixed.step
def step(model, t):
    started.set()
    advance(model, t)
attack_job.Mixed.step = step
"""

_DAEMON = _FIRST_STEP + """
from asyncckpt import AsyncCheckpointer
model = attack_job.Mixed(40)
fwd, rev = attack_job.operators(model, "")  # each step takes ATTACK_STEP_S
ckp = AsyncCheckpointer(model.checkpoint, fwd, rev, 40, l1_slots=2, interval=6,
                        storage=sys.argv[1])
threading.Thread(target=ckp.apply_forward, daemon=True).start()
assert started.wait(30)
time.sleep(0.3)  # the interpreter exits mid-sweep
"""


def test_a_sweep_on_a_daemon_thread_at_exit_leaves_no_directory(tmp_path):
    """At exit a checkpointer whose sweep still runs on a daemon thread refuses close() (a run
    under way): the directories its Level-2 made are removed all the same (its file has no
    name there), nothing the sweep uses being closed under it. The empty directory used to be
    left behind."""
    level2 = tmp_path / "level2"
    env = {**os.environ, "PYTHONPATH": str(ROOT), "ATTACK_STEP_S": "0.05"}
    done = subprocess.run([sys.executable, "-c", _DAEMON, str(level2)], cwd=ROOT, env=env,
                          capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr[-2000:]
    assert not level2.exists()


_DAEMON_RUN_DIR = _FIRST_STEP + """
threading.Thread(target=attack_job.run, args=(sys.argv[1], 40, 6), kwargs={"l1_slots": 2},
                 daemon=True).start()
assert started.wait(30)
time.sleep(0.3)  # the interpreter exits mid-sweep (each step takes ATTACK_STEP_S)
"""


def test_a_run_dir_sweeping_on_a_daemon_thread_at_exit_is_resumed_exactly(tmp_path):
    """The run directory a sweep on a daemon thread leaves at exit is left as a killed
    process leaves it: the next process resumes or restarts it, bitwise."""
    run_dir = tmp_path / "run"
    env = {**os.environ, "PYTHONPATH": str(ROOT), "ATTACK_STEP_S": "0.05"}
    done = subprocess.run([sys.executable, "-c", _DAEMON_RUN_DIR, str(run_dir)], cwd=ROOT,
                          env=env, capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr[-2000:]
    assert run_dir.is_dir()
    assert exact(finished(run_dir))


def test_a_file_system_without_locks_runs_unguarded(tmp_path, monkeypatch, caplog):
    """flock fails with ENOSYS on Lustre mounted noflock (a batch queue's shared scratch):
    the run goes on, with a warning, rather than being refused."""
    import errno
    import fcntl

    def no_flock(fd: int, operation: int) -> None:
        raise OSError(errno.ENOSYS, "Function not implemented")
    monkeypatch.setattr(fcntl, "flock", no_flock)
    result = run(str(tmp_path / "run"), N, INTERVAL, l1_slots=2)
    assert exact(result) and "cannot be locked" in caplog.text


def test_a_read_only_run_dir_is_a_checkpoint_error(tmp_path):
    """A run directory on a read-only mount (a scratch remounted read-only): a CheckpointError
    naming it, never an OSError from deep inside."""
    source, mounted = tmp_path / "source", tmp_path / "mounted"
    (source / "run").mkdir(parents=True)
    mounted.mkdir()
    if subprocess.run(["mount", "--bind", "-o", "ro", str(source), str(mounted)],
                      capture_output=True).returncode:
        pytest.skip("no read-only bind mount here (it needs root)")
    try:
        for run_dir in (mounted / "run", mounted / "new"):
            with pytest.raises(CheckpointError, match="run_dir|FileStorage path"):
                run(str(run_dir), N, INTERVAL, l1_slots=2)
    finally:
        subprocess.run(["umount", str(mounted)], check=True)


def test_a_second_checkpointer_on_an_unclosed_run_dir_is_refused(tmp_path):
    """An optimisation loop that makes a checkpointer per iteration on one run_dir, the last
    one not closed yet: the second resumed the first's finished run, ran no step and handed
    back the first iteration's gradient for another model. It is refused, naming close()."""
    kept = []
    for scale in (1.0, 1.5):
        model = Mixed(N)
        model.a *= scale
        fwd, rev = operators(model, "")
        if kept:
            with pytest.raises(UsageError, match=r"in use .* close\(\) the other first"):
                AsyncCheckpointer(model.checkpoint, fwd, rev, N, l1_slots=2, interval=INTERVAL,
                                  run_dir=tmp_path / "run", adjoint=Arrays([model.lam,
                                                                            model.grad]))
            break
        ckp = AsyncCheckpointer(model.checkpoint, fwd, rev, N, l1_slots=2, interval=INTERVAL,
                                run_dir=tmp_path / "run", adjoint=Arrays([model.lam, model.grad]))
        kept.append(ckp)
        ckp.apply_forward()
        model.lam[...] = 1.0
        ckp.apply_reverse()
    kept[0].close()
    assert not (tmp_path / "run").exists()


# A resumed run is the uninterrupted run: after each call of the documented script, what the
# program sees is the uninterrupted run's, or the call raises a CheckpointError.

@pytest.mark.parametrize("kill, adjoint", [("rev:20", False), ("rev:37", True),
                                           ("between", True), ("between", False)])
def test_a_resumed_forward_sweep_leaves_u_n_live(tmp_path, kill, adjoint):
    """A run killed in the reverse sweep (or between the sweeps) resumes with apply_forward()
    running no step: it left the live arrays at u_0, and a script seeding the adjoint from
    the final state (lam = x_n) got a wrong gradient with no error, without adjoint= and with
    it before the reverse sweep's first commit. The resumed apply_forward() restores u_n."""
    run_dir = tmp_path / "run"
    assert job(run_dir, kill=kill, seed="state", adjoint=adjoint).returncode == -9
    assert read_manifest(run_dir)["sweep"] == "reverse"
    result = finished(run_dir, seed="state", adjoint=adjoint)
    assert result["resumed"]["sweep"] == "reverse"
    assert result["live"] == reference(N, "state")["live"]
    assert exact(result, "state")
    assert not run_dir.exists()


@pytest.mark.parametrize("adjoint", [False, True])
@pytest.mark.parametrize("how", ["killed", "kept"])
def test_a_finished_run_reopened_gives_its_gradient(tmp_path, how, adjoint):
    """A run killed after apply_reverse() returned but before close(), or kept
    (keep_run_dir=True) and run again: without adjoint= it said reverse step 0, ran no step
    and handed back the seed as the gradient, exit status 0. Its reverse sweep runs again
    from its committed states (without adjoint=), or its committed adjoint is restored."""
    run_dir = tmp_path / "run"
    options = ["keep_run_dir=true"] if how == "kept" else []
    first = job(run_dir, *options, kill="done" if how == "killed" else "", adjoint=adjoint)
    assert first.returncode == (-9 if how == "killed" else 0), first.stderr[-2000:]
    assert read_manifest(run_dir)["sweep"] == "done"
    for _ in range(2 if how == "kept" else 1):
        result = finished(run_dir, *options, adjoint=adjoint)
        assert result["resumed"]["sweep"] == "reverse"
        assert exact(result)
    assert run_dir.exists() == (how == "kept")


@pytest.mark.parametrize("damage", ["flip", "delete"])
def test_a_damaged_outputs_snapshot_restarts_from_u_0(tmp_path, damage):
    """Under on_level2_error="recompute" a damaged (or deleted) outputs.K.bin logged "the run
    starts again from u_0" after the committed state had been copied into the live arrays:
    the restart began at u_K. Nothing is delivered before both are checked, and the restart
    begins at the committed u_0."""
    run_dir = tmp_path / "run"
    assert job(run_dir, kill="fwd:30", step_s=0.005).returncode == -9
    manifest = read_manifest(run_dir)
    assert manifest["sweep"] == "forward" and manifest["step"] > 0
    snapshot = run_dir / manifest["outputs"]["file"]
    if damage == "flip":
        data = bytearray(snapshot.read_bytes())
        data[5] ^= 0xFF
        snapshot.write_bytes(bytes(data))
    else:
        snapshot.unlink()
    refused = job(run_dir)
    assert refused.returncode == 1, refused.stderr[-2000:]
    assert ("CorruptionError" if damage == "flip" else "StorageError") in refused.stderr
    assert manifest["outputs"]["file"] in refused.stderr
    result = finished(run_dir, 'on_level2_error="recompute"')
    assert result["resumed"]["step"] == manifest["step"]
    assert exact(result)


@pytest.mark.parametrize("then", ["kept", "rev:20", "between"])
def test_outputs_are_whole_after_a_lost_write(tmp_path, then):
    """Under "recompute" a state whose writes all fail is lost: the manifest stayed at the
    state before it, with the outputs of then, and the reverse sweep's and the run's end
    commits named those outputs: a kept or resumed run handed back outputs that were zero
    after that step. The end of the forward sweep commits the outputs of the whole sweep with
    the states written."""
    run_dir = tmp_path / "run"
    options = ['on_level2_error="recompute"']
    if then == "kept":
        options.append("keep_run_dir=true")
    first = job(run_dir, *options, kill="" if then == "kept" else then, lose=12)
    assert first.returncode == (0 if then == "kept" else -9), first.stderr[-2000:]
    if then == "kept":
        assert exact(json.loads(first.stdout))
    result = finished(run_dir, *options)
    assert result["resumed"]["sweep"] == "reverse"
    assert exact(result)


@pytest.mark.parametrize("kill", ["rev:20", "done"])
def test_another_jobs_adjoint_is_refused(tmp_path, kill):
    """A job reusing a run directory with another seed got the first job's gradient (its
    committed adjoint restored over the new seed). The seed's checksum is committed when the
    reverse sweep starts: a resumed reverse of another seed is refused, naming both."""
    run_dir = tmp_path / "run"
    options = ["keep_run_dir=true"] if kill == "done" else []
    assert job(run_dir, *options, kill=kill, step_s=0.001).returncode == -9
    other = job(run_dir, *options, seed=2.0)
    assert other.returncode == 1, other.stderr[-2000:]
    assert "CheckpointError" in other.stderr or "UsageError" in other.stderr
    assert "seed" in other.stderr and other.stderr.count("xxh3:") >= 2, other.stderr[-2000:]
    assert exact(finished(run_dir, *options))  # the first job's seed resumes, exactly


# The resume profile: the documented script run by real processes killed by real SIGKILLs at
# drawn points of either sweep (inside commits and removals too, or after apply_reverse()
# returned), each file of the run directory damaged, finished and kept runs reopened, other
# seeds; every job's result the uninterrupted store-all run's bit for bit, or a
# CheckpointError, and one only after damage or another seed.

RESUME_EXAMPLES = int(os.environ.get("ASYNCCKPT_RESUME_ATTACKS", "6"))


KILLS_DRAWN = ("fwd", "rev", "between", "done", "replace-before", "replace-after", "unlink",
               "timer", "")
DAMAGES = ("flip", "delete", "truncate")


def checkpoint_error(stderr: str) -> str | None:
    """The name of the CheckpointError (or subclass) a job died of, else None."""
    import asyncckpt.errors as errors
    last = stderr.strip().splitlines()[-1] if stderr.strip() else ""
    name = last.partition(":")[0].rpartition(".")[2]
    kind = getattr(errors, name, None)
    return name if isinstance(kind, type) and issubclass(kind, CheckpointError) else None


def damage(run_dir: Path, file: str, how: str, offset: int) -> None:
    """Damage ``file`` of ``run_dir``: a byte flipped at ``offset`` (modulo its size),
    deleted, or cut to half its size."""
    path = run_dir / file
    if how == "delete":
        path.unlink()
    elif how == "truncate":
        os.truncate(path, path.stat().st_size // 2)
    elif path.stat().st_size:
        data = bytearray(path.read_bytes())
        data[offset % len(data)] ^= 0xFF
        path.write_bytes(bytes(data))


@st.composite
def kills(draw: st.DrawFn, n: int) -> str:
    kind = draw(st.sampled_from(KILLS_DRAWN))
    if kind == "fwd":
        return f"fwd:{draw(st.integers(1, n))}"
    if kind == "rev":
        return f"rev:{draw(st.integers(0, n - 1))}"
    if kind.startswith("replace"):
        return f"{kind}:{draw(st.integers(1, 8))}"
    if kind == "unlink":
        return f"unlink:{draw(st.integers(1, 4))}"
    if kind == "timer":
        return f"timer:{draw(st.floats(0.0, 0.4, allow_subnormal=False)):.3f}"
    return kind


@pytest.mark.timeout(60 + 20 * RESUME_EXAMPLES)
@profile(RESUME_EXAMPLES, "ASYNCCKPT_RESUME_ATTACKS")
@given(data=st.data())
def test_resume_attacks(tmp_path_factory, data):
    """Jobs of one run (the documented script): killed at drawn points, the directory
    damaged between two of them, reopened once finished where kept, and seeded otherwise;
    each job's result exact for its seed, or a CheckpointError after damage or another
    seed."""
    draw = data.draw
    n = draw(st.integers(4, 30), label="n")
    interval = draw(st.integers(1, n), label="interval")
    how = {"seed": draw(st.sampled_from([1.0, "state", -0.5]), label="seed"),
           "adjoint": draw(st.booleans(), label="adjoint"),
           "outputs": draw(st.booleans(), label="outputs")}
    options = [f'on_level2_error="{draw(st.sampled_from(["raise", "recompute"]))}"']
    if draw(st.booleans(), label="keep_run_dir"):
        options.append("keep_run_dir=true")
    run_dir = tmp_path_factory.mktemp("attack") / "run"
    damaged = False
    seeds = set()  # the seeds of the jobs so far: one of them may be the run's committed one
    # every draw made before the first job: what the jobs do (kills land where timing says)
    # never changes what is drawn, so hypothesis replays an example as it drew it
    plans = [{"damage": draw(st.booleans(), label="damage"),
              "file": draw(st.integers(0, 99), label="file"),
              "kind": draw(st.sampled_from(DAMAGES), label="damage kind"),
              "offset": draw(st.integers(0, 2**20), label="offset"),
              "seed": how["seed"] if draw(st.booleans(), label="same seed") else 2.5,
              "kill": draw(kills(n), label="kill")}
             for _ in range(draw(st.integers(1, 4), label="jobs"))]
    for index, plan in enumerate(plans):
        files = sorted(p.name for p in run_dir.iterdir()) if run_dir.exists() else []
        if plan["damage"] and files:
            file = files[plan["file"] % len(files)]
            note(f"damage: {plan['kind']} {file} at {plan['offset']}")
            damage(run_dir, file, plan["kind"], plan["offset"])
            damaged = True
        seed, kill = plan["seed"], plan["kill"]
        seeds.add(seed)
        note(f"job {index}: kill {kill}, seed {seed}, damaged {damaged}")
        done = job(run_dir, *options, kill=kill, step_s=0.001, n=n, interval=interval,
                   **{**how, "seed": seed})
        event(f"job: exit {done.returncode}")
        if done.returncode == -9:
            continue
        if done.returncode == 0:
            result = json.loads(done.stdout)
            assert exact(result, seed, n, how["outputs"]), (kill, seed, result["resumed"])
            continue
        error = checkpoint_error(done.stderr)
        assert error is not None, done.stderr[-3000:]
        assert damaged or len(seeds) > 1, done.stderr[-3000:]
        event(f"refused: {error}")
        if damaged:
            return  # refused: the run directory is not the run's any more
    if run_dir.exists() and not damaged:  # a finished run kept, or a killed one: it resumes
        done = job(run_dir, *options, n=n, interval=interval, **how)
        seeds.add(how["seed"])
        if done.returncode:  # refused only where another seed began the reverse sweep
            assert len(seeds) > 1 and checkpoint_error(done.stderr), done.stderr[-3000:]
        else:
            assert exact(json.loads(done.stdout), how["seed"], n, how["outputs"])
