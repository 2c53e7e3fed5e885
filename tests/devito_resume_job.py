"""Run by tests/test_asyncckpt/compat/test_devito_resume.py in a process of its own: Devito's
acoustic gradient (``examples.seismic``, unmodified) through compat's Revolver with a run
directory, killed by a real SIGKILL where told, else writing the gradient (and Devito's own
full-history gradient of the same problem) to OUT as .npy files and printing what it resumed.

Usage: devito_resume_job.py RUN_DIR OUT [fwd|rev STEP]
"""
from __future__ import annotations

import json
import os
import signal
import sys
from pathlib import Path

import numpy as np
from devito import CheckpointOperator, configuration
from examples.seismic.acoustic import acoustic_setup, wavesolver

import asyncckpt.compat

NT, SHAPE, SPACING = 400, (41, 37), (10.0, 10.0)


class Adjoint:
    """The gradient's own state: the adjoint wavefield v (its whole time buffer) and the
    gradient accumulator, committed at Level-2 boundaries of the reverse sweep."""

    def __init__(self, v, grad) -> None:
        self.arrays = [v._data, grad._data]  # contiguous, halo included
        self.size = sum(array.size for array in self.arrays)
        self.dtype = v.dtype

    def get_data(self, t: int) -> list:
        return self.arrays

    get_data_location = get_data


class Kept(CheckpointOperator):
    """Devito's CheckpointOperator, keeping the fields it was given (its ``args`` are C
    pointers): the adjoint descriptor needs the reverse operator's v and grad."""

    def __init__(self, op, **kwargs) -> None:
        super().__init__(op, **kwargs)
        self.fields = kwargs


def killing(apply, at: int, reverse: bool):
    """``apply``, SIGKILLing the process at step ``at`` of its sweep."""
    def call(*, t_start: int, t_end: int) -> None:
        if (t_start == at) if reverse else (t_end > at):
            os.kill(os.getpid(), signal.SIGKILL)
        apply(t_start=t_start, t_end=t_end)
    return call


def main() -> None:
    run_dir, out = sys.argv[1], Path(sys.argv[2])
    sweep, at = (sys.argv[3], int(sys.argv[4])) if len(sys.argv) > 4 else (None, -1)
    configuration["log-level"] = "ERROR"
    probe = acoustic_setup(shape=SHAPE, spacing=SPACING, tn=1.0, space_order=4, nbl=10)
    tn = probe.model.critical_dt * (NT - 1)
    solver = acoustic_setup(shape=SHAPE, spacing=SPACING, tn=tn, space_order=4, nbl=10)
    rec, _, _ = solver.forward(save=False)
    made = []

    class Durable(asyncckpt.compat.Revolver):
        def __init__(self, cp, fwd, rev, n_checkpoints, n_timesteps, **kw):
            adjoint = Adjoint(rev.fields["v"], rev.fields["grad"])
            # 20 states on Level-2, so that a kill lands after some commits
            super().__init__(cp, fwd, rev, 4, n_timesteps, interval=20, run_dir=run_dir,
                             adjoint=adjoint, **kw)
            made.append(self)
            if sweep == "fwd":
                fwd.apply = killing(fwd.apply, at, reverse=False)
            elif sweep == "rev":
                rev.apply = killing(rev.apply, at, reverse=True)

    wavesolver.Revolver, wavesolver.CheckpointOperator = Durable, Kept
    grad, _ = solver.jacobian_adjoint(rec, None, checkpointing=True)
    np.save(out / "grad.npy", grad.data)
    _, u_saved, _ = solver.forward(save=True)
    full, _ = solver.jacobian_adjoint(rec, u_saved, checkpointing=False)
    np.save(out / "full.npy", full.data)
    revolver = made[0]
    print(json.dumps({"resumed": revolver.checkpointer.resumed,
                      "forward_steps": revolver.stats.forward_steps, "n": NT - 2}))


if __name__ == "__main__":
    main()
