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
- ``counts``: a fixed interval of 5 at n = 100 and n = 10000, "adaptive" and "auto": each run's
  collective calls, and which calls the checkpointer's communicator saw.
- ``delete-stalls``: the last rank's Level-2 delete blocks for good (a hung mount) in the
  reverse sweep, with ``transfer_timeout=1``; each rank reports what it raised and after how
  many seconds of the sweep.
- ``random-failure SEED``: one rank, drawn from SEED, fails at a random step of either sweep (a
  Level-2 write or read, or its forward or reverse operator).
- ``runs-differ``: the last rank's n_timesteps (or each rank's fixed interval) differs from the
  others' (by one step beyond 2^53 too, which float64 words alone cannot tell apart); each rank
  reports what it raised.
"""
from __future__ import annotations

import json
import random
import sys
import tempfile
import threading
import time
from pathlib import Path

from mpi4py import MPI

sys.path.insert(0, str(Path(__file__).resolve().parent))
from faults import FaultyMixin  # noqa: E402
from workloads import Forward, RecurrentCell, Reverse, store_all_reference  # noqa: E402

from asyncckpt import (AsyncCheckpointer, CheckpointError, FileStorage,  # noqa: E402
                       HostMemoryStorage)
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


class StallingDelete(HostMemoryStorage):
    """DRAM Level-2 whose deletes block until ``release`` is set (never, in the job)."""

    def __init__(self) -> None:
        super().__init__()
        self.release = threading.Event()

    def delete(self, key: int) -> None:
        self.release.wait()
        super().delete(key)


class CrashingForward(Forward):
    def __init__(self, model, at: int = 7) -> None:
        super().__init__(model)
        self.at = at

    def apply(self, *, t_start: int, t_end: int) -> None:
        if t_start <= self.at < t_end:
            raise RuntimeError(f"the forward operator crashed at step {self.at}")
        super().apply(t_start=t_start, t_end=t_end)


class CrashingReverse(Reverse):
    def __init__(self, model, at: int) -> None:
        super().__init__(model)
        self.at = at

    def apply(self, *, t_start: int, t_end: int) -> None:
        if t_start == self.at:
            raise RuntimeError(f"the reverse operator crashed at step {self.at}")
        super().apply(t_start=t_start, t_end=t_end)


class CountingComm:
    """The checkpointer's communicator, counting the calls made on it by name."""

    def __init__(self, comm) -> None:
        self.comm, self.calls = comm, {}

    def __getattr__(self, name):
        method = getattr(self.comm, name)
        if not callable(method):
            return method

        def counted(*args, **kwargs):
            self.calls[name] = self.calls.get(name, 0) + 1
            return method(*args, **kwargs)
        return counted


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


def counts(root: Path) -> dict:
    """Collectives per run: a fixed interval at two n a hundred times apart, and the online
    and "auto" plans; each rank's adjoint checked against its store-all reference."""
    results = {}
    for name, n, interval in (("fixed-100", 100, 5), ("fixed-10000", 10000, 5),
                              ("adaptive", 400, "adaptive"), ("auto", 400, "auto")):
        model = RecurrentCell(n, seed=RANK)
        reference = store_all_reference(model)
        with AsyncCheckpointer(model, Forward(model), Reverse(model), n, l1_slots=3,
                               interval=interval, storage=root, comm=COMM) as ckp:
            counting = ckp.ranks.comm = CountingComm(ckp.ranks.comm)
            runs = []
            for _ in range(2):
                sweep(model, ckp)
                runs.append({"collectives": ckp.stats.collectives,
                             "exact": exact(model, reference),
                             "interval": ckp.stats.interval,
                             "writes": ckp.stats.l2_writes})
            results[name] = {"runs": runs, "calls": counting.calls}
    return results


def random_failure(root: Path, seed: int) -> dict:
    """One rank fails at a random point of either sweep; every rank reports what it raised,
    and the failing rank how far its forward sweep had gone when the ranks agreed on it."""
    draw = random.Random(seed)
    failing, kind = draw.randrange(SIZE), draw.choice(["write", "read", "forward", "reverse"])
    step = draw.randrange(1, N - 1)
    model = RecurrentCell(N, seed=RANK)
    fwd, rev, storage = Forward(model), Reverse(model), root
    if RANK == failing:
        if kind == "forward":
            fwd = CrashingForward(model, at=step)
        elif kind == "reverse":
            rev = CrashingReverse(model, at=step)
        else:
            at = {"fail_put_at" if kind == "write" else "fail_get_at": 1 + step // 5}
            storage = FailingFile(root / f"own{RANK}", **at)
    start = time.perf_counter()
    ckp = None
    try:
        with AsyncCheckpointer(model, fwd, rev, N, l1_slots=3, interval=5, storage=storage,
                               comm=COMM) as ckp:
            sweep(model, ckp)
        raised = message = None
    except Exception as exc:  # noqa: BLE001 - what each rank saw is the result
        raised, message = type(exc).__name__, str(exc)
    finally:
        if isinstance(storage, FileStorage):
            storage.close()
    return {"failing": failing, "kind": kind, "step": step, "raised": raised,
            "message": message, "seconds": time.perf_counter() - start,
            "forward_steps": None if ckp is None else ckp.stats.forward_steps,
            "reverse_steps": None if ckp is None else ckp.stats.reverse_steps}


def delete_stalls(root: Path) -> dict:
    """The last rank's deletes stall in the reverse sweep: every rank must raise, within the
    deadline, and none may wait for the stalled one for good."""
    model = RecurrentCell(N, seed=RANK)
    storage = StallingDelete() if RANK == SIZE - 1 else root
    ckp = AsyncCheckpointer(model, Forward(model), Reverse(model), N, l1_slots=3, interval=5,
                            storage=storage, transfer_timeout=1.0, comm=COMM)
    runs = []
    for _ in range(2):  # the next run deletes the stale keys first: they stall again
        start = time.monotonic()
        error: Exception | None = None
        try:
            sweep(model, ckp)
        except Exception as exc:  # noqa: BLE001 - what each rank saw is the result
            error = exc
        runs.append({"raised": type(error).__name__ if error else None, "message": str(error),
                     "checkpoint_error": isinstance(error, CheckpointError),
                     "seconds": time.monotonic() - start})
    start = time.monotonic()
    ckp.close()
    return {"runs": runs, "close_s": time.monotonic() - start}


def recompute_refused(root: Path) -> dict:
    model = RecurrentCell(N)
    try:
        AsyncCheckpointer(model, Forward(model), Reverse(model), N, l1_slots=3, interval=4,
                          on_level2_error="recompute", comm=COMM)
    except Exception as exc:  # noqa: BLE001 - the scenario reports what was raised
        return {"error": type(exc).__name__, "message": str(exc)}
    return {"error": None}


def runs_differ(root: Path) -> dict:
    """The last rank runs one step more (61 against 60), with a fixed interval or "auto", with
    Level-2 storage or Revolve in Level-1 alone, and then a fixed interval that differs."""
    seen = {}
    for name, n, interval, storage in (
            ("fixed", N + (RANK == SIZE - 1), 5, root), ("auto", N + (RANK == SIZE - 1), "auto", root),
            ("level1", N + (RANK == SIZE - 1), 0, None), ("interval", N, 5 + RANK, root),
            ("beyond-2^53", 2**53 + (RANK == SIZE - 1), 2**40, root)):
        model = RecurrentCell(N + 1, seed=RANK)
        try:
            with AsyncCheckpointer(model, Forward(model), Reverse(model), n, l1_slots=3,
                                   interval=interval, storage=storage, comm=COMM) as ckp:
                sweep(model, ckp)
            seen[name] = {"raised": None}
        except Exception as exc:  # noqa: BLE001 - what each rank saw is the result
            seen[name] = {"raised": type(exc).__name__, "message": str(exc)}
    return seen


def main() -> None:
    scenario, root = sys.argv[1], Path(sys.argv[2] if len(sys.argv) > 2 else tempfile.gettempdir())
    if scenario == "random-failure":
        result = random_failure(root, int(sys.argv[3]))
    else:
        result = {"plans": plans, "write-fails": write_fails, "operator-fails": operator_fails,
                  "compat": compat, "counts": counts,
                  "recompute-refused": recompute_refused, "runs-differ": runs_differ, "delete-stalls": delete_stalls}[scenario](root)
    print(json.dumps({"rank": RANK, "size": SIZE, **result}), flush=True)


if __name__ == "__main__":
    main()
