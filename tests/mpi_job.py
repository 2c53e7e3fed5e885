"""Run under mpiexec by tests/test_mpi.py: one scenario per call, each rank printing one JSON line
``{"rank": r, ...}`` with what it saw.

Every rank owns its own part (a workload seeded by its rank) and checkpoints it with
``comm=COMM_WORLD``. Scenarios:

- ``plans``: "auto", "adaptive", a fixed interval and an unknown n (which only the last rank's
  ``stop`` ends), with rank 0's steps slower and the last rank's Level-2 slower: each rank's
  adjoint equals its store-all reference bit for bit, and the plans must be the same on every
  rank.
- ``write-fails``: the last rank's Level-2 fails on its third write.
- ``operator-fails``: rank 1's forward operator raises at step 7.
- ``compat``: ``asyncckpt.compat.Revolver`` without ``comm``, in a running MPI job.
"""
from __future__ import annotations

import json
import sys
import tempfile
import time
from pathlib import Path

from mpi4py import MPI

sys.path.insert(0, str(Path(__file__).resolve().parent))
from faults import FaultyMixin  # noqa: E402
from workloads import Forward, RecurrentCell, Reverse, store_all_reference  # noqa: E402

from asyncckpt import AsyncCheckpointer, FileStorage, HostMemoryStorage  # noqa: E402
from asyncckpt.compat import Revolver  # noqa: E402

COMM = MPI.COMM_WORLD
RANK, SIZE = COMM.Get_rank(), COMM.Get_size()
N = 60


class SlowForward(Forward):
    def apply(self, *, t_start: int, t_end: int) -> None:
        time.sleep(2e-4 * (t_end - t_start))
        super().apply(t_start=t_start, t_end=t_end)


class SlowMemory(FaultyMixin, HostMemoryStorage):
    pass


class FailingFile(FaultyMixin, FileStorage):
    pass


class CrashingForward(Forward):
    def apply(self, *, t_start: int, t_end: int) -> None:
        if t_start <= 7 < t_end:
            raise RuntimeError("the forward operator crashed at step 7")
        super().apply(t_start=t_start, t_end=t_end)


def exact(model, reference) -> bool:
    return all(a.tobytes() == b.tobytes() for a, b in zip(model.gradients(), reference))


def sweep(model, ckp, stop=None) -> None:
    model.reset()
    if stop is None:
        ckp.apply_forward()
    else:
        ckp.apply_forward(stop=stop)
    model.reset_adjoint()
    ckp.apply_reverse()


def plans(root: Path) -> dict:
    model = RecurrentCell(N, seed=RANK)
    reference = store_all_reference(model)
    fwd = SlowForward(model) if RANK == 0 else Forward(model)
    results = {}
    for name, interval in (("auto", "auto"), ("adaptive", "adaptive"), ("fixed", 7),
                           ("unknown-n", "adaptive")):
        slow = SlowMemory(delay=(0.001, 0.002), seed=RANK) if RANK == SIZE - 1 else None
        storage = slow if slow is not None else root
        n = None if name == "unknown-n" else N
        with AsyncCheckpointer(model, fwd, Reverse(model), n, l1_slots=3, interval=interval,
                               storage=storage, comm=COMM) as ckp:
            if name != "unknown-n" and slow is None:
                assert ckp.storage.path.name == f"rank{RANK:05d}", ckp.storage.path
            runs = []
            for _ in range(2):
                # only the last rank knows where the run ends: the others follow it
                stop = (lambda t: RANK == SIZE - 1 and t == N) if n is None else None
                sweep(model, ckp, stop)
                runs.append({"exact": exact(model, reference), "n": ckp.stats.n_timesteps,
                             "interval": ckp.stats.interval, "slots": ckp.stats.l1_slots,
                             "starts": ckp.stats.interval_starts,
                             "tf": ckp.stats.calibration.get("tf_s")})
            results[name] = runs
        if slow is not None:
            slow.close()
    return results


def write_fails(root: Path) -> dict:
    model = RecurrentCell(N, seed=RANK)
    storage = FailingFile(root / f"own{RANK}", fail_put_at=3) if RANK == SIZE - 1 else root
    try:
        with AsyncCheckpointer(model, Forward(model), Reverse(model), N, l1_slots=3,
                               interval=5, storage=storage, transfers="background",
                               comm=COMM) as ckp:
            sweep(model, ckp)
        return {"raised": None}
    except Exception as exc:  # noqa: BLE001 - what each rank saw is the result
        return {"raised": type(exc).__name__, "message": str(exc)}
    finally:
        if isinstance(storage, FileStorage):
            storage.close()


def operator_fails(root: Path) -> dict:
    """The operator crashes in two runs of one checkpointer: the second failure must reach the
    other ranks as the first did."""
    model = RecurrentCell(N, seed=RANK)
    fwd = CrashingForward(model) if RANK == 1 else Forward(model)
    seen = []
    with AsyncCheckpointer(model, fwd, Reverse(model), N, l1_slots=3, interval=5,
                           storage=root, comm=COMM) as ckp:
        for _ in range(2):
            try:
                sweep(model, ckp)
                seen.append((None, ""))
            except Exception as exc:  # noqa: BLE001 - what each rank saw is the result
                seen.append((type(exc).__name__, str(exc)))
    return {"raised": seen[0][0], "message": seen[0][1], "again": seen[1][0]}


def compat(root: Path) -> dict:
    model = RecurrentCell(N, seed=RANK)
    reference = store_all_reference(model)
    with Revolver(model, Forward(model), Reverse(model), 3, N, storage=root) as revolver:
        model.reset()
        revolver.apply_forward()
        model.reset_adjoint()
        revolver.apply_reverse()
        return {"collective": revolver.checkpointer.ranks.size == SIZE,
                "exact": exact(model, reference), "interval": revolver.stats.interval}


def recompute_refused(root: Path) -> dict:
    model = RecurrentCell(N)
    try:
        AsyncCheckpointer(model, Forward(model), Reverse(model), N, l1_slots=3, interval=4,
                          on_level2_error="recompute", comm=COMM)
    except Exception as exc:  # noqa: BLE001 - the scenario reports what was raised
        return {"error": type(exc).__name__, "message": str(exc)}
    return {"error": None}


def main() -> None:
    scenario, root = sys.argv[1], Path(sys.argv[2] if len(sys.argv) > 2 else tempfile.gettempdir())
    result = {"plans": plans, "write-fails": write_fails, "operator-fails": operator_fails,
              "compat": compat, "recompute-refused": recompute_refused}[scenario](root)
    print(json.dumps({"rank": RANK, "size": SIZE, **result}), flush=True)


if __name__ == "__main__":
    main()
