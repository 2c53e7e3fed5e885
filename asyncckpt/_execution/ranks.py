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
from collections.abc import Callable
from typing import Any

from ..errors import InvalidTypeError, RankFailedError
from ..storage import per_rank

__all__ = ["Ranks", "RankGroup", "SoloRanks", "ranks_of", "world_if_running"]


class SoloRanks:
    """The ranks of a run in one process: every collective returns this process's own value,
    and a failure has no other rank to reach."""

    rank = 0
    size = 1
    settled = False

    def __repr__(self) -> str:
        return "SoloRanks()"

    def exchange(self, payload: Any = None, failure: BaseException | None = None) -> list[Any]:
        if failure is not None:
            raise failure
        return [payload]

    def fail(self, failure: BaseException) -> None:
        """Nothing to tell: the caller raises ``failure`` itself."""

    def max(self, value: float) -> float:
        return value

    def min(self, value: int) -> int:
        return value

    def all(self, flag: bool) -> bool:
        return bool(flag)

    def any(self, flag: bool) -> bool:
        return bool(flag)

    def same(self, what: str, value: Any, context: Callable[[], Any] | None = None) -> None:
        """One process holds one value."""

    def storage_spec(self, storage: Any) -> Any:
        """``storage`` as it is: no other rank shares its paths."""
        return storage

    def free(self) -> None:
        """Nothing to free."""


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

    def same(self, what: str, value: Any, context: Callable[[], Any] | None = None) -> None:
        """Check that every rank holds the same ``value`` (a plan must be one plan); where they
        differ, the error gives what each rank's ``context()`` returned (what the value was
        made from)."""
        pairs = self.exchange((value, None if context is None else context()))
        values = [v for v, _ in pairs]
        if any(v != values[0] for v in values):
            detail = "" if context is None else f"; made from {[c for _, c in pairs][:8]}"
            raise RankFailedError(f"the ranks disagree on {what}: {values[:8]}{detail}")

    def storage_spec(self, storage: Any) -> Any:
        """``storage`` with a private directory of this rank under every path (``rank00003``)."""
        return per_rank(storage, self.rank)

    def free(self) -> None:
        self.comm.Free()


#: What the checkpointer asks of the ranks of its run: one process, or an MPI job.
Ranks = SoloRanks | RankGroup


def ranks_of(comm: Any) -> Ranks:
    """The ranks a checkpointer given ``comm`` runs on: :class:`SoloRanks` for None."""
    return SoloRanks() if comm is None else RankGroup(comm)


def world_if_running() -> Any | None:
    """``MPI.COMM_WORLD`` when mpi4py is already imported and initialised with more than one
    rank (an MPI job such as Devito's), else None; never imports mpi4py."""
    mpi = sys.modules.get("mpi4py.MPI")
    if mpi is None or not mpi.Is_initialized() or mpi.Is_finalized():
        return None
    return mpi.COMM_WORLD if mpi.COMM_WORLD.Get_size() > 1 else None
