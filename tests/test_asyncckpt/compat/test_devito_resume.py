"""A real client's long run survives a kill: Devito's acoustic gradient, through compat's
Revolver with a run directory, SIGKILLed mid-forward and mid-reverse, resumed in a new process:
bitwise equal to Devito's full-history gradient (tests/devito_resume_job.py)."""
from __future__ import annotations

import json
import math
import signal
import subprocess
import sys

import numpy as np
import pytest

from conftest import ROOT

from schedules.revolve import optimal_forward_steps

pytest.importorskip("devito")
pytest.importorskip("examples.seismic.acoustic")

JOB = str(ROOT / "tests" / "devito_resume_job.py")
INTERVAL = 20  # the job's fixed interval


def job(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, JOB, *args], cwd=ROOT, capture_output=True,
                          text=True, timeout=400)


@pytest.mark.timeout(900)
@pytest.mark.parametrize("sweep, step", [("fwd", 250), ("rev", 150)])
def test_a_devito_gradient_killed_resumes_bitwise(tmp_path, sweep: str, step: int) -> None:
    run_dir = tmp_path / "run"
    killed = job(str(run_dir), str(tmp_path), sweep, str(step))
    assert killed.returncode == -signal.SIGKILL, killed.stderr[-2000:]
    assert (run_dir / "manifest.json").exists()
    done = job(str(run_dir), str(tmp_path))
    assert done.returncode == 0, done.stderr[-2000:]
    report = json.loads(done.stdout.strip().splitlines()[-1])
    resumed = report["resumed"]
    assert resumed is not None and resumed["step"] > 0
    assert resumed["sweep"] == {"fwd": "forward", "rev": "reverse"}[sweep]
    if sweep == "rev":
        # the forward sweep is not run again: only the intervals of the steps left to reverse
        # are recomputed, in the job's 4 slots and its start's (the last reverse commit that
        # landed before the kill may be far from it when the commits lag behind the sweep)
        left = math.ceil(resumed["step"] / INTERVAL)
        assert report["forward_steps"] <= left * optimal_forward_steps(INTERVAL, 5)
    grad, full = np.load(tmp_path / "grad.npy"), np.load(tmp_path / "full.npy")
    assert grad.tobytes() == full.tobytes()
    assert not run_dir.exists()  # a finished run's directory is removed
