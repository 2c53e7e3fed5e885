"""A run that outlives its process (``run_dir=``): its Level-2 states, outputs and adjoint
committed to a run directory as the sweeps go, and a later process's resumption from the last
commit (docs/resume.md). What a commit is, is :mod:`asyncckpt.storage.rundir`'s; when one is
made, and what a resumed run does, is here:

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

import numpy as np

from schedules import Advance, AsyncMultistage, EndForward, Free, Load, Store, Tier
from schedules.actions import Action
from schedules.multistage import reverse_stored

from .._memory.buffers import aligned_buffer
from ..errors import CorruptionError, StorageError, UsageError
from ..storage.durable import STATES_FILE, DurableFileStorage
from ..storage.rundir import (FORMAT, MANIFEST, DirectoryLock, digest_of, read_manifest,
                              read_snapshot)
from .committer import Committer, Snapshots
from .identity import writer
from .engine import TransferEngine
from .resumable import ResumableEngine
from .bounded import ABANDON_S
from .run_files import check_same_run, check_unused, remove_run, take_directory
from .interpreter import Interpreter

__all__ = ["NoRunDir", "RunDir"]

log = logging.getLogger(__name__)

#: What a manifest names besides the states: the outputs, the adjoint, u_n (committed at the
#: end of the forward sweep) and the live state the reverse sweep left (at the run's end)
SNAPSHOTS = ("outputs", "adjoint", "final", "left")


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
        manifest = read_manifest(path)
        if manifest is None:
            check_unused(path)
        else:
            check_same_run(path, identity, manifest["run"])
            if manifest["sweep"] == "forward" and not manifest["states"]:
                manifest = None  # killed before its first commit: nothing to resume
        #: this run's Level-2 (the checkpointer's parts close it)
        self.storage = DurableFileStorage(path)
        #: the manifest found (what a resumed run restores from), then the one being made
        self._found: dict[str, Any] = manifest or {}
        self._manifest: dict[str, Any] = dict(self._found)
        #: committed states: key -> (record, bytes, checksum)
        self._states: dict[int, tuple[int, int, int]] = {}
        if manifest is not None:
            self._states = {k: (r, b, d) for k, r, b, d in manifest["states"]}
            try:
                self.storage.restore(identity["nbytes"], {k: (r, b) for k, (r, b, _)
                                                          in self._states.items()})
            except BaseException:
                self.storage.close()
                raise
        #: None for a fresh run, else where the run resumes: its sweep and step (a finished
        #: run's reverse at 0 where its adjoint was committed, else at n: it runs again)
        self.resumed: dict[str, Any] | None = None if manifest is None else {
            "sweep": "reverse" if manifest["sweep"] == "done" else manifest["sweep"],
            "step": manifest["step"],
            "interval": manifest["plan"]["interval"], "states": len(self._states)}
        #: the plan (interval, Level-1 slots) a resumed run must follow: its states' steps
        self.plan: tuple[int, int] | None = None if manifest is None else (
            manifest["plan"]["interval"], manifest["plan"]["l1_slots"])
        self._resuming = self.resumed is not None
        self._writer = writer()
        self._engine: ResumableEngine | None = None
        self._interpreter: Interpreter | None = None
        self._serial = self._manifest.get("serial", 0)
        self._snapshots: Snapshots = {}  # written with the next commit
        self._committer = Committer(path, {what: self._found.get(what) for what in SNAPSHOTS})
        self._pending: list[int] = []  # stored this sweep, not committed yet, oldest first
        self._outputs_at: dict[int, list[np.ndarray]] = {}  # ... the outputs when stored
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
        for key, (_, size, digest) in self._states.items():
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
        """A fresh run: a manifest that holds no state yet, and says what the run is."""
        self._states, self._pending, self._outputs_at = {}, [], {}
        self._manifest = {"format": FORMAT, "run": self.identity,
                          "plan": {"interval": schedule.interval,
                                   "l1_slots": schedule.l1_slots},
                          "sweep": "forward", "step": 0}
        self._snapshots = dict.fromkeys(SNAPSHOTS)
        self._commit()
        # in place before the run writes a state: an earlier run's manifest may name the
        # records this run writes into
        self._wait_commits()

    def _forward_from(self, schedule: AsyncMultistage, step: int) -> Iterator[Action]:
        """The schedule from the committed u_step on, restored into the live arrays (and the
        outputs as they were then) first, both checked before either is delivered; where
        either is damaged or missing, under the recompute policy, the whole run from the
        committed u_0 (refused where that cannot be read either)."""
        assert self._engine is not None
        try:
            state = self._read_state(step)
            outputs = self._read("outputs", self.outputs, step)
        except StorageError as exc:
            if not self._engine.recovery.enabled:
                raise
            try:
                self._deliver_state(self._read_state(0), 0)
            except StorageError as again:
                raise CorruptionError(f"run_dir {self.path}: {exc}; and the run cannot start "
                                      f"again from u_0: {again}") from again
            log.warning("run_dir %s: %s; the run starts again from the committed u_0",
                        self.path, exc)
            for key in sorted(self._states):
                self._engine.free(key)
            self._begin(schedule)
            yield from schedule
            return
        self._deliver_state(state, step)
        self._deliver(self.outputs, outputs, step)
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
        n = schedule.n_steps
        final = self._read_final("final")
        outputs = self._read("outputs", self.outputs, n)
        self._deliver_state(final, n)
        self._deliver(self.outputs, outputs, n)
        yield EndForward()
        self._restore("adjoint", self.adjoint, step)
        if step == 0:
            left = self._found.get("left_step", 0)
            self._deliver_state(self._read_final("left"), left)
            self._live = left
        yield from reverse_stored(sorted(k for k in self._states if k < step), step,
                                  schedule.l1_slots + 1, schedule.taping)

    def _after(self, action: Action) -> None:
        """What the run commits once ``action`` is done."""
        if type(action) is EndForward:
            self._reverse_begins()
        elif self._sweep == "forward":
            if type(action) is Store and action.tier is Tier.L2:
                self._pending.append(action.step)
                if self.outputs is not None:
                    self._outputs_at[action.step] = [
                        np.array(a, copy=True) for a in self.outputs.get_data(action.step)]
            if self._pending:
                self._commit_forward()
        elif type(action) in (Advance, Load):
            self._live = action.end if type(action) is Advance else action.step
        elif (type(action) is Free and action.tier is Tier.L2 and self.adjoint is not None
              and self._sweep == "reverse" and action.step > 0):
            # without adjoint= a reverse resumes from its start: every state stays named; u_0
            # is freed last, and the run's end commits what follows it (with the live state)
            self._states.pop(action.step, None)
            self._snapshot("adjoint", self.adjoint, action.step)
            self._manifest.update(sweep="reverse", step=action.step)
            self._commit()

    def _reverse_begins(self) -> None:
        """The reverse sweep starts, its adjoint seeded: the seed's checksum goes with the
        next commit; a resumed reverse sweep's seed must be the one committed (else the
        committed adjoint, restored over it, would be another job's)."""
        if self._sweep not in ("forward", "resumed"):
            return  # a run whose forward sweep's end was not committed commits nothing more
        self._sweep = "reverse"
        if self.adjoint is None:
            return
        seed = digest_of(self.adjoint.get_data(self.identity["n_timesteps"]))
        committed = self._manifest.get("seed")
        if committed is not None and committed != seed:
            self.keep = True  # the run stays for the job whose it is
            raise UsageError(
                f"run_dir {str(self.path)!r} holds a run whose reverse sweep began from "
                f"another adjoint seed (xxh3:{committed:016x} there, xxh3:{seed:016x} here): "
                "its committed adjoint is not this seed's; seed the adjoint as that run did, "
                "or give another run_dir")
        self._manifest["seed"] = seed

    def _commit_forward(self, settled: bool = False) -> None:
        """Commit the states stored this sweep whose writes returned, oldest first, up to the
        first still under way (a state is committed only with every one before it); once
        every write is ``settled``, all those written (a lost one left out), with no
        commit: the end of the forward sweep's commit names them."""
        assert self._engine is not None
        self._engine.check()
        digests, done = self._engine.digests, []
        if settled:
            done = [key for key in self._pending if key in digests]
            self._pending = []
        while self._pending and self._pending[0] in digests:
            done.append(self._pending.pop(0))
        if not done:
            return
        records = self.storage.records()
        for key in done:
            self._states[key] = (*records[key], int(digests[key]))
        if settled:
            self._outputs_at.clear()
            return
        if self.outputs is not None:
            self._snapshot("outputs", self._outputs_at[done[-1]], None)
            for key in done:
                del self._outputs_at[key]
        self._manifest.update(sweep="forward", step=done[-1])
        self._commit()

    def ended(self, until: type) -> None:
        """A sweep ended: the forward sweep's (every write settled) or the reverse sweep's
        commit."""
        n = self.identity["n_timesteps"]
        if until is EndForward:
            if self._sweep != "forward":  # none committed, or a forward sweep restored
                return
            assert self._engine is not None
            self._engine.drain()
            self._commit_forward(settled=True)
            if 0 not in self._states:  # u_0 lost: nothing a later process could reverse
                log.warning("run_dir %s: u_0 was lost on the way: the rest of this run "
                            "commits nothing", self.path)
                self._sweep = "unsaved"
                return
            self._snapshot("outputs", self.outputs, None)
            self._snapshot_state("final", n)
            self._manifest.update(sweep="reverse", step=n)
        elif self._sweep != "reverse":
            if self._sweep == "unsaved":  # what is on the device is no run: close removes it
                self._manifest["sweep"], self._sweep = "done", "idle"
            return
        else:
            # with adjoint= a finished run's adjoint is committed; without it, its states
            # stay named and a later checkpointer runs its reverse sweep again
            if self.adjoint is not None:
                self._states.clear()
                self._snapshot("adjoint", self.adjoint, 0)
                self._snapshot_state("left", self._live)
                self._manifest["left_step"] = self._live
            self._manifest.update(sweep="done", step=0 if self.adjoint is not None else n)
            self._sweep = "idle"
        self._commit()
        # a sweep's end is on the device when apply_forward or apply_reverse returns: a job
        # killed between the sweeps never runs the forward sweep again
        self._wait_commits()

    def _wait_commits(self) -> None:
        """Wait for the commits under way, ``transfer_timeout`` at most (the engine's
        deadline for a transfer), else raise: the device is stalled."""
        assert self._engine is not None
        self._committer.wait(self._engine.calls.deadline_s)

    # commits and restores

    def _snapshot(self, what: str, source: Any, step: int | None) -> None:
        """Snapshot ``what`` (the arrays of descriptor ``source`` at ``step``, copied, or
        copies already) for the next commit to write."""
        if source is None:
            return
        arrays = source if isinstance(source, list) else [
            np.array(a, copy=True) for a in source.get_data(
                self.identity["n_timesteps"] if step is None else step)]
        self._serial += 1
        self._snapshots[what] = arrays  # the committer names its file

    def _commit(self) -> None:
        """Hand the manifest, with the snapshots taken since the last, to the committer."""
        self._manifest["states"] = [[k, *v] for k, v in sorted(self._states.items())]
        self._manifest["serial"], self._manifest["writer"] = self._serial, self._writer
        self._committer.submit(dict(self._manifest), self._snapshots)
        self._snapshots = {}

    def _snapshot_state(self, what: str, step: int) -> None:
        """Snapshot the live state (the descriptor's arrays of u_step) as ``what``."""
        assert self._interpreter is not None
        arrays = self._interpreter.arrays(step, into=False)
        size = sum(a.nbytes for a in arrays)
        buffer = aligned_buffer(size)
        self._interpreter.link.keep(arrays, buffer)
        self._snapshot(what, [buffer[:size]], None)

    def _restore(self, what: str, descriptor: Any, step: int) -> None:
        """Copy the committed ``what`` into ``descriptor``'s arrays at ``step``."""
        entry = self._found.get(what)
        if descriptor is not None and entry is not None:
            read_snapshot(self.path, entry, descriptor.get_data_location(step))

    def _read(self, what: str, descriptor: Any, step: int) -> list[np.ndarray] | None:
        """The committed ``what``, checked, in arrays shaped as ``descriptor``'s at ``step``
        (None where there is none to restore)."""
        entry = self._found.get(what)
        if descriptor is None or entry is None:
            return None
        arrays = [np.empty(np.shape(a), a.dtype) for a in descriptor.get_data_location(step)]
        read_snapshot(self.path, entry, arrays)
        return arrays

    @staticmethod
    def _deliver(descriptor: Any, arrays: list[np.ndarray] | None, step: int) -> None:
        """Copy ``arrays`` (from :meth:`_read`) into ``descriptor``'s at ``step``."""
        if descriptor is not None and arrays is not None:
            for into, source in zip(descriptor.get_data_location(step), arrays):
                into[...] = source

    def _read_final(self, what: str) -> np.ndarray:
        """The committed live state ``what`` ("final": u_n; "left": where the reverse sweep
        left it), checked, in a buffer for :meth:`_deliver_state`."""
        entry = self._found.get(what)
        if entry is None:
            raise CorruptionError(f"{self.path / MANIFEST} names no {what} state: a run of "
                                  "its sweep commits one")
        buffer = aligned_buffer(entry["nbytes"])
        read_snapshot(self.path, entry, [buffer[:entry["nbytes"]]])
        return buffer

    def _read_state(self, step: int) -> np.ndarray:
        """The committed u_step, its checksum checked, in a buffer for :meth:`_deliver_state`."""
        assert self._interpreter is not None
        record, size, digest = self._states[step]
        buffer = aligned_buffer(size)
        self.storage.get(step, buffer[:size])
        if self._interpreter.link.checksum(buffer[:size]) != digest:
            raise CorruptionError(f"u_{step} in {self.path / STATES_FILE} (record {record}) "
                                  "is damaged: its checksum does not match the manifest's")
        return buffer

    def _deliver_state(self, buffer: np.ndarray, step: int) -> None:
        """Copy a state read by :meth:`_read_state` or :meth:`_read_final` into the live
        arrays of u_step."""
        assert self._interpreter is not None
        self._interpreter.link.deliver(buffer, self._interpreter.arrays(step, into=True))

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
        removal = (None if self._manifest.get("sweep", "done") != "done" or self.keep
                   else lambda: remove_run(self.path))
        self._committer.finish(time.monotonic() + ABANDON_S if until is None else until,
                               removal, lock.release)

