"""What a run directory's commits say (``run_dir=``): the manifest a run makes as its sweeps go
(the run, its plan, where its sweeps are, the checksum of its adjoint's seed), the Level-2
states it names, and the snapshots (outputs, adjoint, live states) taken since the last commit,
handed whole to the :class:`~asyncckpt._execution.committer.Committer`'s thread. A state the
forward sweep stored is named once its write returned, and only with every one stored before
it, with the outputs as they were when it was stored. When a commit is made is
:class:`~asyncckpt._execution.resume.RunDir`'s.

A snapshot is written from the program's own arrays into its file (the page cache), where
the committer's thread flushes it: no copy of it is held in process memory. So one is in
flight at a time: the outputs are written when a state is stored while the thread is idle,
and the states stored meanwhile are committed with a later one's (a kill loses no more than
the commits the thread was too busy to take).
"""
from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np

from schedules import AsyncMultistage

from ..storage.durable import DurableFileStorage
from ..storage.rundir import FORMAT, stage_snapshot
from .committer import Committer, Snapshots
from .engine import TransferEngine
from .identity import writer
from .interpreter import Interpreter

__all__ = ["SNAPSHOTS", "Commits"]

#: What a manifest names besides the states: the outputs, the adjoint, u_n (committed at the
#: end of the forward sweep) and the live state the reverse sweep left (at the run's end)
SNAPSHOTS = ("outputs", "adjoint", "final", "left")


class Commits:
    """The commits of the run in ``path``.

    Parameters
    ----------
    path : Path
        The run directory.
    found : dict
        The manifest found (empty for a fresh run): the one the commits go on from.
    states : dict
        The states it names: key -> (record, bytes, checksum).
    identity : dict
        What the run is (a fresh manifest says it).
    storage : DurableFileStorage
        The run's Level-2 (which record holds a state).
    outputs : descriptor or None
        What the forward sweep produces besides the state.
    """

    def __init__(self, path: Path, found: dict[str, Any],
                 states: dict[int, tuple[int, int, int]], identity: dict[str, Any],
                 storage: DurableFileStorage, outputs: Any) -> None:
        self.identity, self.storage, self.outputs = identity, storage, outputs
        #: the manifest found, then the one being made
        self.manifest: dict[str, Any] = dict(found)
        #: committed states: key -> (record, bytes, checksum)
        self.states = states
        self._writer = writer()
        self._serial = self.manifest.get("serial", 0)
        self._snapshots: Snapshots = {}  # written with the next commit
        #: what puts the commits in place
        self.committer = Committer(path, {what: found.get(what) for what in SNAPSHOTS})
        #: stored this sweep, not committed yet, oldest first
        self.pending: list[int] = []
        #: the stored state whose outputs are written for the next commit, and their entry
        self._outputs_at: tuple[int, dict[str, Any]] | None = None

    def fresh(self, schedule: AsyncMultistage) -> None:
        """A fresh run: a manifest that holds no state yet, and says what the run is."""
        self.states, self.pending, self._outputs_at = {}, [], None
        self.manifest = {"format": FORMAT, "run": self.identity,
                         "plan": {"interval": schedule.interval,
                                  "l1_slots": schedule.l1_slots},
                         "sweep": "forward", "step": 0}
        self._snapshots = dict.fromkeys(SNAPSHOTS)
        self.commit()

    def stored(self, step: int) -> None:
        """The forward sweep stored u_step on Level-2: it is committed once its write
        returned, with the outputs as they are now where the committer is idle (else with a
        later state's)."""
        self.pending.append(step)
        if self.outputs is not None and self._outputs_at is None:
            path = self.committer.claim("outputs")
            if path is not None:
                self._outputs_at = (step, stage_snapshot(path, self.outputs.get_data(step)))

    def forward(self, engine: TransferEngine | None, settled: bool = False) -> None:
        """Commit the states stored this sweep whose writes returned, oldest first, up to the
        first still under way (a state is committed only with every one before it); once
        every write is ``settled``, all those written (a lost one left out), with no
        commit: the end of the forward sweep's commit names them."""
        assert engine is not None
        engine.check()
        digests, done = engine.digests, []
        if settled:
            done = [key for key in self.pending if key in digests]
            self.pending, self._outputs_at = [], None
        elif self.outputs is None:
            while self.pending and self.pending[0] in digests:
                done.append(self.pending.pop(0))
        elif self._outputs_at is not None:  # up to the state whose outputs are written
            tagged = self._outputs_at[0]
            while (self.pending and self.pending[0] <= tagged
                   and self.pending[0] in digests):
                done.append(self.pending.pop(0))
            if not done or done[-1] != tagged:
                self.pending[:0] = done
                return
        if not done:
            return
        records = self.storage.records()
        for key in done:
            self.states[key] = (*records[key], int(digests[key]))
        if settled:
            return
        if self._outputs_at is not None:
            self._serial += 1
            self._snapshots["outputs"] = self._outputs_at[1]
            self._outputs_at = None
        self.manifest.update(sweep="forward", step=done[-1])
        self.commit()

    def snapshot(self, what: str, source: Any, step: int | None) -> bool:
        """Write ``what`` (the arrays of descriptor ``source`` at ``step``; None: n) for the
        next commit, which the caller submits at once (:meth:`Committer.claim`, replacing
        one waiting); whether it was written (nothing to write, where ``source`` is None)."""
        if source is None:
            return True
        return self._stage(what, source.get_data(
            self.identity["n_timesteps"] if step is None else step))

    def snapshot_state(self, what: str, step: int, interpreter: Interpreter | None) -> bool:
        """:meth:`snapshot` the live state (the descriptor's arrays of u_step, as
        ``interpreter`` reads them: in the layout a Level-1 slot holds) as ``what``."""
        assert interpreter is not None
        return self._stage(what, interpreter.arrays(step, into=False))

    def _stage(self, what: str, arrays: list[np.ndarray]) -> bool:
        path = self.committer.claim(what, replace=True)
        if path is None:
            return False
        self._serial += 1
        self._snapshots[what] = stage_snapshot(path, arrays)
        return True

    def commit(self) -> None:
        """Hand the manifest, with the snapshots taken since the last, to the committer."""
        self.manifest["states"] = [[k, *v] for k, v in sorted(self.states.items())]
        self.manifest["serial"], self.manifest["writer"] = self._serial, self._writer
        self.committer.submit(dict(self.manifest), self._snapshots)
        self._snapshots = {}
