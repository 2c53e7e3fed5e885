"""One plan for every rank of an MPI job, agreed with reductions, and a failure on one rank
raised on all of them without putting the run in lockstep.

Every collective here is one ``Iallreduce`` (MAX) of :data:`WORDS` float64 words on a private
duplicate of the user's communicator: word 0 is the highest failing rank plus one (0: none),
then the values every rank takes the largest of, then the negated values it takes the least of.
Because every collective is the same call of the same size, a rank that fails anywhere joins
whichever collective the others reach next, and they learn of it there.

A failure is agreed on by a rule every rank applies to the same results: where the first
collective that reports one is the m-th of the group, every rank starts collectives up to the
(m + :attr:`RankGroup.LAG`)-th, completes them all, takes the failing rank's message from it
(the only pickled call, on the failure path alone) and raises. Agreement points (``check_in``)
complete their reduction :attr:`RankGroup.LAG` points later, so no rank waits for one on its
critical path unless it is that far ahead of another. mpi4py is imported only by the caller
that hands in a communicator.
"""
from __future__ import annotations

import math
import sys
import time
from collections import deque
from collections.abc import Callable, Sequence
from typing import Any

import numpy as np

from ..errors import InvalidTypeError, RankFailedError
from ..storage import per_rank

__all__ = ["Agreed", "Ranks", "RankGroup", "SoloRanks", "WORDS", "agree_on_run", "ranks_of",
           "world_if_running"]

#: A wait for a reduction polls it, sleeping this long at first, then twice as long each time
#: up to the longest: a reduction that is late costs at most that much beyond its completion.
POLL_FIRST_S, POLL_LONGEST_S = 1e-5, 1e-3

#: The float64 words of every collective: one failure word, then the values agreed on.
WORDS = 64

#: Values agreed on: (largest, least), None where no rank has one.
Agreed = tuple[list[float | None], list[float | None]]


def _encode(largest: Sequence[float | None], least: Sequence[float | None]) -> np.ndarray:
    """The send buffer: failure word 0 (set by the caller), then ``largest``, then ``least``
    negated; None is -inf, which every value beats."""
    if 1 + len(largest) + len(least) > WORDS:
        raise ValueError(f"{len(largest)} + {len(least)} values do not fit in one collective "
                         f"of {WORDS} words")
    words = np.full(WORDS, -np.inf)
    words[0] = 0.0
    for i, value in enumerate(largest, 1):
        if value is not None:
            words[i] = value
    for i, value in enumerate(least, 1 + len(largest)):
        if value is not None:
            words[i] = -value
    return words


def _decode(words: np.ndarray, largest: int, least: int) -> Agreed:
    def value(word: float, sign: float) -> float | None:
        return None if word == -math.inf else sign * float(word)
    return ([value(w, 1.0) for w in words[1:1 + largest]],
            [value(w, -1.0) for w in words[1 + largest:1 + largest + least]])


class SoloRanks:
    """The ranks of a run in one process: every agreement returns this process's own values,
    and a failure has no other rank to reach."""

    rank = 0
    size = 1
    settled = False
    failure: BaseException | None = None
    calls = 0  # collectives made: none

    def __repr__(self) -> str:
        return "SoloRanks()"

    def agree(self, largest: Sequence[float | None] = (),
              least: Sequence[float | None] = ()) -> Agreed:
        return list(largest), list(least)

    def start(self, largest: Sequence[float | None] = (),
              least: Sequence[float | None] = ()) -> "Ticket":
        return Ticket(None, np.zeros(0), len(largest), len(least), (list(largest), list(least)))

    def check_in(self) -> None:
        """No other rank to hear from."""

    def note(self, failure: BaseException) -> None:
        """One process has no peers to keep in step with: raise ``failure`` now."""
        raise failure

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

    def same(self, what: str, value: Sequence[float], context: Callable[[], Any] | None = None
             ) -> None:
        """One process holds one value."""

    def storage_spec(self, storage: Any) -> Any:
        """``storage`` as it is: no other rank shares its paths."""
        return storage

    def free(self) -> None:
        """Nothing to free."""


class Ticket:
    """One collective under way: :meth:`result` completes it (and every one started before it,
    in order) and gives the values agreed on."""

    def __init__(self, group: "RankGroup | None", words: np.ndarray, largest: int, least: int,
                 known: Agreed | None = None) -> None:
        self.group, self.words, self.largest, self.least = group, words, largest, least
        self.request: Any = None
        self.sent: np.ndarray | None = None  # kept alive until the reduction completes
        self.done = known is not None
        self._values = known

    def result(self) -> Agreed:
        """The values every rank agreed on; raises on every rank where one of them failed."""
        if not self.done:
            assert self.group is not None
            self.group.complete(self)
        assert self._values is not None
        return self._values

    def _finish(self) -> None:
        # polled, not waited for: MPI's own wait spins, and on a node with more ranks than
        # cores (or beside the I/O threads) it takes the core a later rank needs to get here
        request, pause = self.request, POLL_FIRST_S
        while not request.Test():
            time.sleep(pause)
            pause = min(2 * pause, POLL_LONGEST_S)
        self.done = True
        self._values = _decode(self.words, self.largest, self.least)


class RankGroup:
    """The ranks of ``comm`` running one checkpointer each, on one collective plan.

    Parameters
    ----------
    comm : mpi4py.MPI.Comm
        An intracommunicator (duplicated, so the checkpointer's messages never meet the
        user's).
    """

    #: Agreement points a reduction stays open for: started at one, completed at the next.
    LAG = 1

    def __init__(self, comm: Any) -> None:
        if not all(hasattr(comm, name) for name in ("Dup", "Get_rank", "Get_size",
                                                    "Iallreduce")):
            raise InvalidTypeError(f"comm must be an mpi4py communicator, got "
                                   f"{type(comm).__name__}")
        from mpi4py import MPI  # the caller's communicator has imported it already
        self._max = MPI.MAX
        self.comm = comm.Dup()
        self.rank: int = self.comm.Get_rank()
        self.size: int = self.comm.Get_size()
        #: a failure was agreed on: no rank expects another collective from this run (cleared
        #: when the next run begins)
        self.settled = False
        #: this rank's failure, reported at every collective from the one after it happened
        self.failure: BaseException | None = None
        self.calls = 0  # collectives started, a count every rank shares
        self._pending: deque[Ticket] = deque()
        self._failed_at: tuple[int, int] | None = None  # (the m-th collective, failing rank)

    def __repr__(self) -> str:
        return f"RankGroup(rank {self.rank} of {self.size})"

    def start(self, largest: Sequence[float | None] = (),
              least: Sequence[float | None] = ()) -> Ticket:
        """Start a collective agreeing on the largest of ``largest`` and the least of ``least``
        (the same number of values on every rank)."""
        sent = _encode(largest, least)
        if self.failure is not None:
            sent[0] = self.rank + 1
        ticket = Ticket(self, np.empty(WORDS), len(largest), len(least))
        ticket.request = self.comm.Iallreduce(sent, ticket.words, op=self._max)
        ticket.sent = sent
        self.calls += 1
        self._pending.append(ticket)
        return ticket

    def complete(self, upto: Ticket | None = None) -> None:
        """Complete the collectives under way, in order, up to ``upto`` (all of them for None);
        where one reports a failure, agree on it and raise."""
        while self._pending:
            ticket = self._pending.popleft()
            ticket._finish()
            if self._failed_at is None and ticket.words[0] > 0:
                self._failed_at = (self.calls - len(self._pending), int(ticket.words[0]) - 1)
                self._agree_failure()
            if ticket is upto:
                return

    def agree(self, largest: Sequence[float | None] = (),
              least: Sequence[float | None] = ()) -> Agreed:
        """The largest of every rank's ``largest`` and the least of its ``least``, now."""
        return self.start(largest, least).result()

    def check_in(self) -> None:
        """An agreement point: start a reduction of this rank's failure (if any) and complete
        the one started :attr:`LAG` points ago; raises on every rank where one failed."""
        self.start()
        while len(self._pending) > self.LAG:
            self.complete(self._pending[0])

    def note(self, failure: BaseException) -> None:
        """This rank failed where it can keep making the schedule's operator calls (a Level-2
        transfer): report it from the next collective on, and raise it where the ranks agree."""
        if self.failure is None:
            self.failure = failure

    def fail(self, failure: BaseException) -> None:
        """This rank cannot go on: join the collectives the others make until they too know of
        it (the caller then raises ``failure``); nothing where a failure was agreed on."""
        if self.settled:
            return
        self.note(failure)
        try:
            self.agree()
        except BaseException:  # noqa: BLE001 - the caller raises its own failure
            pass

    def _agree_failure(self) -> None:
        """Every rank: start collectives up to the (m + LAG)-th, complete them, raise."""
        assert self._failed_at is not None
        m, failing = self._failed_at
        while self.calls < m + self.LAG:
            self.start()
        pending, self._pending = self._pending, deque()
        for ticket in pending:
            ticket._finish()
        own = self.failure
        report = self.comm.bcast(None if own is None else f"{type(own).__name__}: {own}",
                                 root=failing)
        self.settled, self.failure, self._failed_at = True, None, None
        if own is not None:
            raise own
        raise RankFailedError(f"rank {failing} of {self.size} failed ({report}); rank "
                              f"{self.rank} stops too")

    def max(self, value: float) -> float:
        largest, _ = self.agree([value])
        assert largest[0] is not None
        return largest[0]

    def min(self, value: int) -> int:
        _, least = self.agree(least=[value])
        assert least[0] is not None
        return int(least[0])

    def all(self, flag: bool) -> bool:
        return self.min(int(bool(flag))) == 1

    def any(self, flag: bool) -> bool:
        return self.max(int(bool(flag))) == 1

    def same(self, what: str, value: Sequence[float], context: Callable[[], Any] | None = None
             ) -> None:
        """Check that every rank holds the same numbers ``value`` (a plan must be one plan);
        where they differ, the error gives what each rank's ``context()`` returned (what the
        value was made from), gathered on that path alone."""
        largest, least = self.agree(list(value), list(value))
        if largest != least:
            gathered = self.comm.allgather((list(value), None if context is None else context()))
            detail = "" if context is None else f"; made from {[c for _, c in gathered][:8]}"
            raise RankFailedError(f"the ranks disagree on {what}: "
                                  f"{[v for v, _ in gathered][:8]}{detail}")

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


#: How each rank's interval option enters :func:`agree_on_run`.
_INTERVAL_WORDS = {"auto": -1.0, "adaptive": -2.0}


def agree_on_run(ranks: Ranks, n: int | None, interval: int | str, nbytes: int) -> None:
    """Refuse, on every rank, ranks that would run different numbers of steps or intervals: one
    would finish while another waits in a collective the first never makes. States may differ
    in size (a domain decomposition's parts do); the plan made from them is agreed later."""
    def exact(value: int) -> tuple[float, float]:  # two float64 words hold any int below 2^104
        return float(value >> 52), float(value & (2**52 - 1))

    ranks.same("n_timesteps (-1: unknown) and interval (-1: 'auto', -2: 'adaptive')",
               (*((-1.0, -1.0) if n is None else exact(n)),
                *((_INTERVAL_WORDS[interval], 0.0) if isinstance(interval, str)
                  else exact(interval))),
               context=lambda: {"n_timesteps": n, "interval": interval, "state_bytes": nbytes})


def world_if_running() -> Any | None:
    """``MPI.COMM_WORLD`` when mpi4py is already imported and initialised with more than one
    rank (an MPI job such as Devito's), else None; never imports mpi4py."""
    mpi = sys.modules.get("mpi4py.MPI")
    if mpi is None or not mpi.Is_initialized() or mpi.Is_finalized():
        return None
    return mpi.COMM_WORLD if mpi.COMM_WORLD.Get_size() > 1 else None
