"""Run under mpiexec with DEVITO_MPI=1 by tests/test_mpi.py: Devito's acoustic gradient on this
rank's subdomain, through asyncckpt's Revolver on its default path (``n_checkpoints=None``, no
``comm``: a running MPI job plans over COMM_WORLD), against Devito's own full-history gradient.
Each rank prints one JSON line."""
from __future__ import annotations

import json
import sys

import numpy as np
from devito import configuration
from examples.seismic import acoustic
from mpi4py import MPI

import asyncckpt.compat

NT = int(sys.argv[1]) if len(sys.argv) > 1 else 600


def main() -> None:
    configuration["log-level"] = "WARNING"
    shape, spacing = (41, 41), (10.0, 10.0)
    probe = acoustic.acoustic_setup(shape=shape, spacing=spacing, tn=1.0, space_order=4, nbl=10)
    tn = probe.model.critical_dt * (NT - 1)
    solver = acoustic.acoustic_setup(shape=shape, spacing=spacing, tn=tn, space_order=4, nbl=10)
    rec, u_saved, _ = solver.forward(save=True)
    full_history, _ = solver.jacobian_adjoint(rec, u_saved, checkpointing=False)
    want = np.array(full_history.data)  # this rank's part
    seen = []

    class Recorded(asyncckpt.compat.Revolver):
        def apply_reverse(self) -> None:
            super().apply_reverse()
            seen.append((self.checkpointer.ranks.size > 1, self.stats.interval,
                         self.stats.l1_slots))

    acoustic.wavesolver.Revolver = Recorded
    exact = []
    for _ in range(2):
        grad, _ = solver.jacobian_adjoint(rec, u_saved, checkpointing=True)
        exact.append(bool(np.array_equal(np.array(grad.data), want)))
    comm = MPI.COMM_WORLD
    print(json.dumps({"rank": comm.Get_rank(), "size": comm.Get_size(), "exact": exact,
                      "points": int(want.size), "plans": seen}), flush=True)


if __name__ == "__main__":
    main()
