"""A run that outlives its process (``run_dir=``): its Level-2 states, outputs and adjoint
committed to a run directory as the sweeps go, and a later process's resumption from the last
commit (docs/resume.md). What a commit is, is :mod:`asyncckpt.storage.rundir`'s; when one is
made, and what a resumed run does, is here:

- forward: each Level-2 state once its write returned (on the device), with the outputs as
  they were when it was stored; at the sweep's end, the outputs of the whole sweep;
- reverse: the adjoint at each Level-2 boundary (an interval start freed), and at the end;
- a resumed forward sweep restores the last committed state (and the outputs) and runs on from
  it; a resumed reverse sweep restores the outputs and the adjoint and reverses what is left.
"""
from __future__ import annotations

import logging
import time
from collections.abc import Iterable, Iterator
from pathlib import Path
from typing import Any

import numpy as np

from schedules import AsyncMultistage, EndForward, Free, Store, Tier
from schedules.actions import Action
from schedules.multistage import reverse_stored

from .._memory.buffers import aligned_buffer
from ..errors import CorruptionError, StorageError, UsageError
from ..storage.durable import STATES_FILE, DurableFileStorage
from ..storage.rundir import FORMAT, DirectoryLock, read_manifest, read_snapshot
from .committer import Committer, Snapshots
from .identity import writer
from .engine import TransferEngine
from .resumable import ResumableEngine
from .bounded import ABANDON_S
from .run_files import check_same_run, check_unused, remove_run, take_directory
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
        #: None for a fresh run, else where the run resumes: its sweep and step
        self.resumed: dict[str, Any] | None = None if manifest is None else {
            "sweep": "reverse" if manifest["sweep"] == "done" else manifest["sweep"],
            "step": 0 if manifest["sweep"] == "done" else manifest["step"],
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
        self._committer = Committer(path, {what: self._found.get(what)
                                           for what in ("outputs", "adjoint")})
        self._pending: list[int] = []  # stored this sweep, not committed yet, oldest first
        self._outputs_at: dict[int, list[np.ndarray]] = {}  # ... the outputs when stored
        self._sweep = "idle"

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
            source = self._reverse_from(schedule, self.resumed["step"] if self.resumed else 0)
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
        self._snapshots = {"outputs": None, "adjoint": None}
        self._commit()
        # in place before the run writes a state: an earlier run's manifest may name the
        # records this run writes into
        self._wait_commits()

    def _forward_from(self, schedule: AsyncMultistage, step: int) -> Iterator[Action]:
        """The schedule from the committed u_step on, restored into the live arrays (and the
        outputs as they were then) first; where either is damaged or missing, under the
        recompute policy, the whole run from u_0 (the live arrays a fresh process holds)."""
        assert self._engine is not None
        try:
            self._restore_state(step)
            self._restore("outputs", self.outputs, step)
        except StorageError as exc:
            if not self._engine.recovery.enabled:
                raise
            log.warning("run_dir %s: %s; the run starts again from u_0", self.path, exc)
            for key in sorted(self._states):
                self._engine.free(key)
            self._begin(schedule)
            yield from schedule
            return
        actions = iter(schedule)
        for action in actions:
            if action == Store(step, Tier.L2):
                break
        yield from actions

    def _reverse_from(self, schedule: AsyncMultistage, step: int) -> Iterator[Action]:
        """A forward sweep that restores the outputs of the whole sweep, then the reverse of
        steps ``step - 1`` down to 0 from the committed states, from the committed adjoint."""
        self._restore("outputs", self.outputs, schedule.n_steps)
        yield EndForward()
        self._restore("adjoint", self.adjoint, step)
        yield from reverse_stored(sorted(k for k in self._states if k < step), step,
                                  schedule.l1_slots + 1, schedule.taping)

    def _after(self, action: Action) -> None:
        """What the run commits once ``action`` is done."""
        if type(action) is EndForward:
            self._sweep = "reverse"
        elif self._sweep == "forward":
            if type(action) is Store and action.tier is Tier.L2:
                self._pending.append(action.step)
                if self.outputs is not None:
                    self._outputs_at[action.step] = [
                        np.array(a, copy=True) for a in self.outputs.get_data(action.step)]
            if self._pending:
                self._commit_forward()
        elif type(action) is Free and action.tier is Tier.L2:
            self._states.pop(action.step, None)
            if self.adjoint is not None:  # without it a reverse resumes from its start
                self._snapshot("adjoint", self.adjoint, action.step)
                self._manifest.update(sweep="reverse", step=action.step)
                self._commit()

    def _commit_forward(self) -> None:
        """Commit the states stored this sweep whose writes returned, oldest first, up to the
        first still under way (a state is committed only with every one before it)."""
        assert self._engine is not None
        self._engine.check()
        digests, done = self._engine.digests, []
        while self._pending and self._pending[0] in digests:
            done.append(self._pending.pop(0))
        if not done:
            return
        records = self.storage.records()
        for key in done:
            self._states[key] = (*records[key], int(digests[key]))
        if self.outputs is not None:
            self._snapshot("outputs", self._outputs_at[done[-1]], None)
            for key in done:
                del self._outputs_at[key]
        self._manifest.update(sweep="forward", step=done[-1])
        self._commit()

    def ended(self, until: type) -> None:
        """A sweep ended: the forward sweep's (every write settled) or the reverse sweep's
        commit."""
        if self._sweep == "idle" or (until is EndForward and self._sweep == "resumed"):
            return
        assert self._engine is not None
        if until is EndForward:
            self._engine.drain()
            self._commit_forward()
            if self._pending:  # a state was lost on the way: the run resumes before it
                return
            self._snapshot("outputs", self.outputs, None)
            self._manifest.update(sweep="reverse", step=self.identity["n_timesteps"])
        else:
            self._states.clear()
            self._snapshot("adjoint", self.adjoint, 0)
            self._manifest.update(sweep="done", step=0)
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

    def _restore(self, what: str, descriptor: Any, step: int) -> None:
        """Copy the committed ``what`` into ``descriptor``'s arrays at ``step``."""
        entry = self._found.get(what)
        if descriptor is not None and entry is not None:
            read_snapshot(self.path, entry, descriptor.get_data_location(step))

    def _restore_state(self, step: int) -> None:
        """Copy the committed u_step into the live arrays, after checking its checksum."""
        assert self._interpreter is not None
        record, size, digest = self._states[step]
        buffer = aligned_buffer(size)
        self.storage.get(step, buffer[:size])
        link = self._interpreter.link
        if link.checksum(buffer[:size]) != digest:
            raise CorruptionError(f"u_{step} in {self.path / STATES_FILE} (record {record}) "
                                  "is damaged: its checksum does not match the manifest's")
        link.deliver(buffer, self._interpreter.arrays(step, into=True))

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

