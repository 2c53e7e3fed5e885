"""Run by tests/test_asyncckpt/test_resume.py in a process of its own: one forward and reverse
sweep of the recurrent cell with a run directory, killed by a real SIGKILL where told, else
printing one JSON line: what it resumed from, the gradients and the outputs, as hex bytes.

Usage: resume_job.py RUN_DIR N INTERVAL [fwd|rev STEP [DELAY_S [SETTLE]]]: SIGKILL when the
forward operator reaches step STEP (or the reverse one reverses it), DELAY_S seconds later (a
thread's timer: the kill lands wherever the run is then), or once the manifest has committed
step SETTLE of that sweep.
"""
from __future__ import annotations

import json
import os
import signal
import sys
import threading
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))
from asyncckpt import AsyncCheckpointer, CheckpointError  # noqa: E402
from asyncckpt.storage.rundir import read_manifest  # noqa: E402
from workloads import Forward, RecurrentCell, Reverse  # noqa: E402


class Traces:
    """The forward's outputs: h at every step (a receiver's trace), written as it goes."""

    def __init__(self, model: RecurrentCell) -> None:
        self.model = model
        self.data = np.zeros((model.n + 1,) + model.h.shape, model.h.dtype)
        self.size, self.dtype = self.data.size, self.data.dtype

    def get_data(self, t: int) -> list[np.ndarray]:
        return [self.data]

    get_data_location = get_data


class Adjoint:
    """The reverse sweep's state: the gradient accumulator and the adjoint arrays (the model
    rebinds the latter at each step: the descriptor answers with the current ones)."""

    def __init__(self, model: RecurrentCell) -> None:
        self.model = model
        self.size = model.gW.size + model.lam_h.size + model.lam_c.size
        self.dtype = model.gW.dtype

    def get_data(self, t: int) -> list[np.ndarray]:
        return [self.model.gW, self.model.lam_h, self.model.lam_c]

    get_data_location = get_data


def settled(run_dir: str, kind: str, step: int) -> bool:
    """Whether the manifest in ``run_dir`` has committed ``step`` of the sweep ``kind``."""
    try:
        manifest = read_manifest(Path(run_dir))
    except CheckpointError:  # replaced under our feet: read again
        return False
    if manifest is None:
        return False
    if kind == "fwd":
        return manifest["sweep"] != "forward" or bool(manifest["states"]
                                                      and manifest["step"] >= step)
    return manifest["sweep"] == "reverse" and manifest["step"] <= step


def operators(model: RecurrentCell, traces: Traces, kind: str = "", at: int = -1,
              delay: float = 0.0, settle: tuple[str, int] | None = None
              ) -> tuple[Forward, Reverse]:
    """The model's operators, the forward one writing ``traces`` step by step; each sends this
    process SIGKILL once step ``at`` is reached (``kind``: "fwd" or "rev"), ``delay`` seconds
    later, or once the run directory ``settle[0]`` has committed step ``settle[1]`` (the
    commits run on a thread of their own)."""
    def kill() -> None:
        if settle is not None:
            deadline = time.monotonic() + 30
            while not settled(settle[0], kind, settle[1]) and time.monotonic() < deadline:
                time.sleep(0.001)
        if delay:
            threading.Timer(delay, os.kill, (os.getpid(), signal.SIGKILL)).start()
        else:
            os.kill(os.getpid(), signal.SIGKILL)

    class TracingForward(Forward):
        def apply(self, *, t_start: int, t_end: int) -> None:
            self.model.trace.calls.append(("fwd", t_start, t_end))
            for t in range(t_start, t_end):
                self.model.step(t)
                traces.data[t + 1] = self.model.h
                if kind == "fwd" and t + 1 == at:
                    kill()

    class KillingReverse(Reverse):
        def apply(self, *, t_start: int, t_end: int) -> None:
            super().apply(t_start=t_start, t_end=t_end)
            if kind == "rev" and t_start == at:
                kill()
    return TracingForward(model), KillingReverse(model)


def run(run_dir: str, n: int, interval: int | str, kind: str = "", at: int = -1,
        delay: float = 0.0, settle: int | None = None, **options: object) -> dict:
    """One run from a fresh model (resumed where ``run_dir`` holds one): what it resumed from,
    its steps, gradients and outputs."""
    model = RecurrentCell(n)
    traces = Traces(model)
    traces.data[0] = model.h
    fwd, rev = operators(model, traces, kind, at, delay,
                         None if settle is None else (run_dir, settle))
    with AsyncCheckpointer(model, fwd, rev, n, l1_slots=2, interval=interval, run_dir=run_dir,
                           outputs=traces, adjoint=Adjoint(model), **options) as ckp:
        resumed = ckp.resumed
        ckp.apply_forward()
        forward_steps = ckp.stats.forward_steps
        model.reset_adjoint()
        ckp.apply_reverse()
        reverse_steps = ckp.stats.reverse_steps
    return {"resumed": resumed, "forward_steps": forward_steps, "reverse_steps": reverse_steps,
            "gradients": [g.tobytes().hex() for g in model.gradients()],
            "outputs": traces.data.tobytes().hex()}


def main() -> None:
    run_dir, n = sys.argv[1], int(sys.argv[2])
    interval = sys.argv[3] if sys.argv[3] == "auto" else int(sys.argv[3])
    kind, at = (sys.argv[4], int(sys.argv[5])) if len(sys.argv) > 5 else ("", -1)
    delay = float(sys.argv[6]) if len(sys.argv) > 6 else 0.0
    settle = int(sys.argv[7]) if len(sys.argv) > 7 else None
    print(json.dumps(run(run_dir, n, interval, kind, at, delay, settle)), flush=True)


if __name__ == "__main__":
    main()
