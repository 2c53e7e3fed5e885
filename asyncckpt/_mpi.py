"""One plan for every rank of an MPI job: costs reduced across ranks, adaptive decisions agreed,
and a failure on one rank raised on all of them.

Every collective here is one ``allgather`` on a private duplicate of the user's communicator, of
this rank's failure (or None) and a payload. Because all of them are the same call, a rank that
fails anywhere joins whichever exchange the others reach next: they learn of it there and raise,
instead of waiting for a rank that has left the run. mpi4py is imported only by the caller that
hands in a communicator.
"""
from __future__ import annotations

import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from .errors import InvalidTypeError, RankFailedError

__all__ = ["RankGroup", "world_if_running", "per_rank"]


class RankGroup:
    """The ranks of ``comm`` running one checkpointer each, on one collective plan.

    Parameters
    ----------
    comm : mpi4py.MPI.Comm
        An intracommunicator (duplicated, so the checkpointer's messages never meet the
        user's).
    """

    def __init__(self, comm: Any) -> None:
        if not all(hasattr(comm, name) for name in ("Dup", "Get_rank", "Get_size")):
            raise InvalidTypeError(f"comm must be an mpi4py communicator, got {type(comm).__name__}")
        self.comm = comm.Dup()
        self.rank: int = self.comm.Get_rank()
        self.size: int = self.comm.Get_size()
        #: a failure was agreed on: no rank expects another exchange from this run (cleared
        #: when the next run begins)
        self.settled = False

    def __repr__(self) -> str:
        return f"RankGroup(rank {self.rank} of {self.size})"

    def exchange(self, payload: Any = None, failure: BaseException | None = None) -> list[Any]:
        """Every rank's ``payload``, by rank; raises on every rank if any rank reports a
        failure: the failure itself on its own rank, :class:`RankFailedError` naming the rank
        and its error on the others."""
        report = None if failure is None else f"{type(failure).__name__}: {failure}"
        gathered = self.comm.allgather((report, payload))
        failed = [(rank, report) for rank, (report, _) in enumerate(gathered) if report]
        if failed:
            self.settled = True
            if failure is not None:
                raise failure
            rank, report = failed[0]
            raise RankFailedError(f"rank {rank} of {self.size} failed ({report}); rank "
                                  f"{self.rank} stops too")
        return [payload for _, payload in gathered]

    def fail(self, failure: BaseException) -> None:
        """Tell the other ranks at their next exchange that this rank failed (then raise it);
        nothing when a failure was already agreed on."""
        if not self.settled:
            self.exchange(failure=failure)

    def max(self, value: float) -> float:
        return max(self.exchange(value))

    def min(self, value: int) -> int:
        return min(self.exchange(value))

    def all(self, flag: bool) -> bool:
        return all(self.exchange(bool(flag)))

    def any(self, flag: bool) -> bool:
        return any(self.exchange(bool(flag)))

    def same(self, what: str, value: Any) -> None:
        """Check that every rank holds the same ``value`` (a plan must be one plan)."""
        values = self.exchange(value)
        if any(v != values[0] for v in values):
            raise RankFailedError(f"the ranks disagree on {what}: {values[:8]}")

    def free(self) -> None:
        self.comm.Free()


def world_if_running() -> Any | None:
    """``MPI.COMM_WORLD`` when mpi4py is already imported and initialised with more than one
    rank (an MPI job such as Devito's), else None; never imports mpi4py."""
    mpi = sys.modules.get("mpi4py.MPI")
    if mpi is None or not mpi.Is_initialized() or mpi.Is_finalized():
        return None
    return mpi.COMM_WORLD if mpi.COMM_WORLD.Get_size() > 1 else None


def per_rank(storage: Any, rank: int) -> Any:
    """A Level-2 spec with every path replaced by a private directory of this rank under it
    (``rank00003``); "dram", None and Storage objects stay as they are."""
    if isinstance(storage, Sequence) and not isinstance(storage, str):
        return [per_rank(tier, rank) for tier in storage]
    if storage is None or (isinstance(storage, str) and storage.strip().lower() == "dram"):
        return storage
    if isinstance(storage, (str, Path)) or hasattr(storage, "__fspath__"):
        return Path(storage) / f"rank{rank:05d}"
    return storage
