"""What a run directory's commits say (``run_dir=``): the manifest a run makes as its sweeps go
(the run, its plan, where its sweeps are, the checksum of its adjoint's seed), the Level-2
states it names, and the snapshots (outputs, adjoint, live states) taken since the last commit,
handed whole to the :class:`~asyncckpt._execution.committer.Committer`'s thread. A state the
forward sweep stored is named once its write returned, and only with every one stored before
it, with the outputs as they were when it was stored. When a commit is made is
:class:`~asyncckpt._execution.resume.RunDir`'s.
"""
from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np

from schedules import AsyncMultistage

from .._memory.buffers import aligned_buffer
from ..storage.durable import DurableFileStorage
from ..storage.rundir import FORMAT
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
        self._outputs_at: dict[int, list[np.ndarray]] = {}  # ... the outputs when stored

    def fresh(self, schedule: AsyncMultistage) -> None:
        """A fresh run: a manifest that holds no state yet, and says what the run is."""
        self.states, self.pending, self._outputs_at = {}, [], {}
        self.manifest = {"format": FORMAT, "run": self.identity,
                         "plan": {"interval": schedule.interval,
                                  "l1_slots": schedule.l1_slots},
                         "sweep": "forward", "step": 0}
        self._snapshots = dict.fromkeys(SNAPSHOTS)
        self.commit()

    def stored(self, step: int) -> None:
        """The forward sweep stored u_step on Level-2: it is committed once its write
        returned, with the outputs as they are now."""
        self.pending.append(step)
        if self.outputs is not None:
            self._outputs_at[step] = [
                np.array(a, copy=True) for a in self.outputs.get_data(step)]

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
            self.pending = []
        while self.pending and self.pending[0] in digests:
            done.append(self.pending.pop(0))
        if not done:
            return
        records = self.storage.records()
        for key in done:
            self.states[key] = (*records[key], int(digests[key]))
        if settled:
            self._outputs_at.clear()
            return
        if self.outputs is not None:
            self.snapshot("outputs", self._outputs_at[done[-1]], None)
            for key in done:
                del self._outputs_at[key]
        self.manifest.update(sweep="forward", step=done[-1])
        self.commit()

    def snapshot(self, what: str, source: Any, step: int | None) -> None:
        """Snapshot ``what`` (the arrays of descriptor ``source`` at ``step``, copied, or
        copies already) for the next commit to write."""
        if source is None:
            return
        arrays = source if isinstance(source, list) else [
            np.array(a, copy=True) for a in source.get_data(
                self.identity["n_timesteps"] if step is None else step)]
        self._serial += 1
        self._snapshots[what] = arrays  # the committer names its file

    def snapshot_state(self, what: str, step: int, interpreter: Interpreter | None) -> None:
        """Snapshot the live state (the descriptor's arrays of u_step, as ``interpreter``
        reads them) as ``what``."""
        assert interpreter is not None
        arrays = interpreter.arrays(step, into=False)
        size = sum(a.nbytes for a in arrays)
        buffer = aligned_buffer(size)
        interpreter.link.keep(arrays, buffer)
        self.snapshot(what, [buffer[:size]], None)

    def commit(self) -> None:
        """Hand the manifest, with the snapshots taken since the last, to the committer."""
        self.manifest["states"] = [[k, *v] for k, v in sorted(self.states.items())]
        self.manifest["serial"], self.manifest["writer"] = self._serial, self._writer
        self.committer.submit(dict(self.manifest), self._snapshots)
        self._snapshots = {}
