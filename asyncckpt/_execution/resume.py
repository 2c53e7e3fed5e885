"""A run that outlives its process (``run_dir=``): its Level-2 states, outputs and adjoint
committed to a run directory as the sweeps go, and a later process's resumption from the last
commit (docs/resume.md). What a commit is, is :mod:`asyncckpt.storage.rundir`'s; what one says,
:mod:`~asyncckpt._execution.commits`'s; taking the directory up,
:mod:`~asyncckpt._execution.run_files`'s; reading back what a resumed run restores,
:mod:`~asyncckpt._execution.restore`'s. When a commit is made, and when a resumed run restores
what, is here:

- forward: each Level-2 state once its write returned (on the device), with the outputs as
  they were when it was stored; at the sweep's end, u_n and the outputs of the whole sweep,
  with every state written;
- reverse: the checksum of the adjoint's seed, and the adjoint at each Level-2 boundary (an
  interval start freed); at the end, the adjoint and the live state the sweep left;
- a resumed forward sweep restores the last committed state and the outputs (both checked
  before either is delivered) and runs on from it; a resumed reverse sweep restores u_n and the
  outputs, refuses a seed other than the one committed, restores the adjoint and reverses what
  is left: what the program sees after each call is the uninterrupted run's, or an error.
"""
from __future__ import annotations

import logging
import time
from collections.abc import Iterable, Iterator
from pathlib import Path
from typing import Any

from schedules import Advance, AsyncMultistage, EndForward, Free, Load, Store, Tier
from schedules.actions import Action
from schedules.multistage import reverse_stored

from ..errors import CorruptionError, StorageError, UsageError
from ..storage.rundir import DirectoryLock
from .commits import Commits
from .engine import TransferEngine
from .resumable import ResumableEngine
from .bounded import ABANDON_S
from .restore import Restorer
from .run_files import find_run, remove_run, take_directory
from .interpreter import Interpreter

__all__ = ["NoRunDir", "RunDir"]

log = logging.getLogger(__name__)


class NoRunDir:
    """A run without a run directory: nothing is committed, nothing resumed."""

    resumed: dict[str, Any] | None = None
    plan: tuple[int, int] | None = None
    storage = None

    def attach(self, engine: TransferEngine, interpreter: Interpreter) -> None:
        """Nothing to attach to."""

    def actions(self, schedule: Iterable[Action]) -> Iterator[Action]:
        """The schedule's actions, as they are."""
        return iter(schedule)

    def ended(self, until: type) -> None:
        """Nothing to commit."""

    def close(self, until: float | None = None) -> None:
        """Nothing to remove."""


class RunDir:
    """The run directory of a run (see the module's docstring).

    Parameters
    ----------
    path : Path
        The directory (made, 0700, where missing).
    identity : dict
        :func:`~asyncckpt._execution.identity.identity_of` this checkpointer's run.
    outputs, adjoint : descriptor or None
        What the forward sweep produces besides the state, and the reverse sweep's own state.
    keep : bool
        Keep the directory of a finished run (else it is removed at ``close``).
    """

    def __init__(self, path: Path, identity: dict[str, Any], outputs: Any, adjoint: Any,
                 keep: bool) -> None:
        self.path, self.identity, self.keep = path, identity, keep
        self.outputs, self.adjoint = outputs, adjoint
        #: the lock that keeps the directory this checkpointer's alone until close (None
        #: once closed)
        self._lock: DirectoryLock | None = take_directory(path)
        try:
            self._open(path, identity)
        except BaseException:
            self._lock.release()
            raise

    def _open(self, path: Path, identity: dict[str, Any]) -> None:
        """Take up the run in ``path``: the one its manifest names, else a fresh one."""
        found = find_run(path, identity)
        storage, states = found.storage, found.states
        #: this run's Level-2 (the checkpointer's parts close it)
        self.storage = storage
        #: the manifest found (what a resumed run restores from)
        self._found: dict[str, Any] = found.manifest or {}
        self._restorer = Restorer(path, self._found, storage)
        #: None for a fresh run, else where it resumes (:meth:`FoundRun.resumed`)
        self.resumed: dict[str, Any] | None = found.resumed()
        #: the plan (interval, Level-1 slots) a resumed run must follow: its states' steps
        self.plan: tuple[int, int] | None = found.plan()
        self._resuming = self.resumed is not None
        self._engine: ResumableEngine | None = None
        self._interpreter: Interpreter | None = None
        #: the manifest being made, the states it names, the snapshots for its next commit
        self._commits = Commits(path, self._found, states, identity, storage, self.outputs)
        #: "idle", "forward", "resumed" (a forward sweep restored), "reverse", or "unsaved" (a
        #: run whose u_0 was lost: the rest of it commits nothing)
        self._sweep = "idle"
        self._live = 0  # the step the live arrays hold in the reverse sweep

    def attach(self, engine: TransferEngine, interpreter: Interpreter) -> None:
        """Run on ``engine`` (a :class:`ResumableEngine`) and ``interpreter``; the committed
        states are the engine's from now on."""
        if interpreter.link.device is not None:
            raise UsageError(f"run_dir keeps states of host memory; u_0 lives on "
                             f"{interpreter.link.device.name}")
        assert isinstance(engine, ResumableEngine)
        self._engine, self._interpreter = engine, interpreter
        self._restorer.interpreter = interpreter
        for key, (_, size, digest) in self._commits.states.items():
            engine.restored(key, size, digest)

    # the sweeps

    def actions(self, schedule: Iterable[Action]) -> Iterator[Action]:
        """The actions of a run: the schedule's (from where an earlier process left it, for
        the first run of a resumed checkpointer), with the commits made between them."""
        if not isinstance(schedule, AsyncMultistage):
            log.warning("run_dir %s: the plan %r keeps no states on Level-2: nothing of this "
                        "run is committed", self.path, schedule)
            yield from schedule
            return
        sweep = "forward"
        if not self._resuming:
            self._begin(schedule)
            source: Iterator[Action] = iter(schedule)
        elif self._found["sweep"] == "forward":
            source = self._forward_from(schedule, self._found["step"])
        else:  # the forward sweep is done: nothing of it to commit again
            source = self._reverse_from(schedule, self._found["step"])
            sweep = "resumed"
        self._resuming, self._sweep = False, sweep
        for action in source:
            yield action
            self._after(action)

    def _begin(self, schedule: AsyncMultistage) -> None:
        """A fresh run: its first commit (:meth:`Commits.fresh`), in place before it goes on."""
        self._commits.fresh(schedule)
        # in place before the run writes a state: an earlier run's manifest may name the
        # records this run writes into
        self._wait_commits()

    def _forward_from(self, schedule: AsyncMultistage, step: int) -> Iterator[Action]:
        """The schedule from the committed u_step on, restored into the live arrays (and the
        outputs as they were then) first, both checked before either is delivered; where
        either is damaged or missing, under the recompute policy, the whole run from the
        committed u_0 (refused where that cannot be read either)."""
        assert self._engine is not None
        restorer, states = self._restorer, self._commits.states
        try:
            state = restorer.read_state(step, states)
            outputs = restorer.read("outputs", self.outputs, step)
        except StorageError as exc:
            if not self._engine.recovery.enabled:
                raise
            try:
                restorer.deliver_state(restorer.read_state(0, states), 0)
            except StorageError as again:
                raise CorruptionError(f"run_dir {self.path}: {exc}; and the run cannot start "
                                      f"again from u_0: {again}") from again
            log.warning("run_dir %s: %s; the run starts again from the committed u_0",
                        self.path, exc)
            for key in sorted(states):
                self._engine.free(key)
            self._begin(schedule)
            yield from schedule
            return
        restorer.deliver_state(state, step)
        restorer.deliver(self.outputs, outputs, step)
        actions = iter(schedule)
        for action in actions:
            if action == Store(step, Tier.L2):
                break
        yield from actions

    def _reverse_from(self, schedule: AsyncMultistage, step: int) -> Iterator[Action]:
        """A forward sweep that restores u_n and the outputs of the whole sweep (both checked
        before either is delivered), then the reverse of steps ``step - 1`` down to 0 from the
        committed states, from the committed adjoint (the seed checked first, by
        :meth:`_reverse_begins`); a finished run's that reverses nothing restores the live
        state its reverse sweep left."""
        n, restorer = schedule.n_steps, self._restorer
        final = restorer.read_final("final")
        outputs = restorer.read("outputs", self.outputs, n)
        restorer.deliver_state(final, n)
        restorer.deliver(self.outputs, outputs, n)
        yield EndForward()
        restorer.restore("adjoint", self.adjoint, step)
        if step == 0:
            left = self._found.get("left_step", 0)
            restorer.deliver_state(restorer.read_final("left"), left)
            self._live = left
        yield from reverse_stored(sorted(k for k in self._commits.states if k < step), step,
                                  schedule.l1_slots + 1, schedule.taping)

    def _after(self, action: Action) -> None:
        """What the run commits once ``action`` is done."""
        if type(action) is EndForward:
            self._reverse_begins()
        elif self._sweep == "forward":
            if self._commits.pending:  # first: a state stored now may take the outputs' file
                self._commits.forward(self._engine)
            if type(action) is Store and action.tier is Tier.L2:
                self._commits.stored(action.step)
        elif type(action) is Advance:
            self._live = action.end
        elif type(action) is Load:
            self._live = action.step
        elif (type(action) is Free and action.tier is Tier.L2 and self.adjoint is not None
              and self._sweep == "reverse" and action.step > 0):
            # without adjoint= a reverse resumes from its start: every state stays named; u_0
            # is freed last, and the run's end commits what follows it (with the live state)
            # while the committer is busy this boundary is not committed: a later one says more
            commits = self._commits
            commits.states.pop(action.step, None)
            if commits.snapshot("adjoint", self.adjoint, action.step):
                commits.manifest.update(sweep="reverse", step=action.step)
                commits.commit()

    def _reverse_begins(self) -> None:
        """The reverse sweep starts, its adjoint seeded: the seed's checksum goes with the
        next commit; a resumed reverse sweep's seed must be the one committed (else the
        committed adjoint, restored over it, would be another job's)."""
        if self._sweep not in ("forward", "resumed"):
            return  # a run whose forward sweep's end was not committed commits nothing more
        self._sweep = "reverse"
        if self.adjoint is None:
            return
        try:
            seed = self._restorer.checked_seed(self.adjoint, self.identity["n_timesteps"],
                                               self._commits.manifest.get("seed"))
        except UsageError:
            self.keep = True  # the run stays for the job whose it is
            raise
        self._commits.manifest["seed"] = seed

    def ended(self, until: type) -> None:
        """A sweep ended: the forward sweep's (every write settled) or the reverse sweep's
        commit."""
        n, commits = self.identity["n_timesteps"], self._commits
        if until is EndForward:
            if self._sweep != "forward":  # none committed, or a forward sweep restored
                return
            assert self._engine is not None
            self._engine.drain()
            commits.forward(self._engine, settled=True)
            self._wait_commits()  # the committer idle: the snapshots below are written now
            if 0 not in commits.states:  # u_0 lost: nothing a later process could reverse
                log.warning("run_dir %s: u_0 was lost on the way: the rest of this run "
                            "commits nothing", self.path)
                self._sweep = "unsaved"
                return
            commits.snapshot("outputs", self.outputs, None)
            commits.snapshot_state("final", n, self._interpreter)
            commits.manifest.update(sweep="reverse", step=n)
        elif self._sweep != "reverse":
            if self._sweep == "unsaved":  # what is on the device is no run: close removes it
                commits.manifest["sweep"], self._sweep = "done", "idle"
            return
        else:
            # with adjoint= a finished run's adjoint is committed; without it, its states
            # stay named and a later checkpointer runs its reverse sweep again
            if self.adjoint is not None:
                self._wait_commits()
                commits.states.clear()
                commits.snapshot("adjoint", self.adjoint, 0)
                commits.snapshot_state("left", self._live, self._interpreter)
                commits.manifest["left_step"] = self._live
            commits.manifest.update(sweep="done", step=0 if self.adjoint is not None else n)
            self._sweep = "idle"
        commits.commit()
        # a sweep's end is on the device when apply_forward or apply_reverse returns: a job
        # killed between the sweeps never runs the forward sweep again
        self._wait_commits()

    def _wait_commits(self) -> None:
        """Wait for the commits under way, ``transfer_timeout`` at most (the engine's
        deadline for a transfer), else raise: the device is stalled."""
        assert self._engine is not None
        self._commits.committer.wait(self._engine.calls.deadline_s)

    def close(self, until: float | None = None) -> None:
        """Put the commits under way in place, then remove the directory of a finished run, or
        of none (nothing committed, nothing found), unless it is to be kept; let go of the
        directory. Waits until ``until`` (a :func:`time.monotonic`; default ``ABANDON_S`` from
        now) at the latest: a commit or removal still running then, on a stalled device, is
        left to the committer's thread, which lets go of the directory once it returns. Safe
        to call twice; nothing in a child the process forked (the parent's directory)."""
        lock, self._lock = self._lock, None
        if lock is None or not lock.held:
            return
        removal = (None if self._commits.manifest.get("sweep", "done") != "done" or self.keep
                   else lambda: remove_run(self.path))
        until = time.monotonic() + ABANDON_S if until is None else until
        self._commits.committer.finish(until, removal, lock.release)

