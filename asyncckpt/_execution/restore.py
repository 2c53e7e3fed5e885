"""What a resumed run (``run_dir=``) restores into the program from the manifest it found: the
live state (a committed u_step, u_n, or where the reverse sweep left it), the outputs and the
adjoint, each read and checked before it is delivered; and the check that a resumed reverse
sweep's adjoint seed is the one committed. When each is restored is
:class:`~asyncckpt._execution.resume.RunDir`'s.
"""
from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np

from .._memory.buffers import aligned_buffer
from ..errors import CorruptionError, UsageError
from ..storage.durable import STATES_FILE, DurableFileStorage
from ..storage.rundir import MANIFEST, check_snapshot, digest_of, read_snapshot
from .interpreter import Interpreter

__all__ = ["Restorer"]


class Restorer:
    """Reads what the manifest ``found`` in ``path`` names back into the program.

    Parameters
    ----------
    path : Path
        The run directory.
    found : dict
        The manifest found (empty for a fresh run: nothing to restore).
    storage : DurableFileStorage
        The run's Level-2, holding the committed states.
    """

    def __init__(self, path: Path, found: dict[str, Any], storage: DurableFileStorage) -> None:
        self.path, self.found, self.storage = path, found, storage
        #: what delivers a state into the live arrays (set when the run attaches)
        self.interpreter: Interpreter | None = None

    def restore(self, what: str, descriptor: Any, step: int) -> None:
        """Copy the committed ``what`` into ``descriptor``'s arrays at ``step``."""
        entry = self.found.get(what)
        if descriptor is not None and entry is not None:
            read_snapshot(self.path, entry, descriptor.get_data_location(step))

    def read(self, what: str, descriptor: Any, step: int) -> dict[str, Any] | None:
        """The manifest's entry of the committed ``what``, its file checked (read in chunks,
        nothing held), for :meth:`deliver` (None where there is none to restore)."""
        entry = self.found.get(what)
        if descriptor is None or entry is None:
            return None
        check_snapshot(self.path, entry)
        return entry

    def deliver(self, descriptor: Any, entry: dict[str, Any] | None, step: int) -> None:
        """Read the snapshot ``entry`` names (from :meth:`read`) into ``descriptor``'s
        arrays at ``step``, checked again as it is read."""
        if descriptor is not None and entry is not None:
            read_snapshot(self.path, entry, descriptor.get_data_location(step))

    def read_final(self, what: str) -> np.ndarray:
        """The committed live state ``what`` ("final": u_n; "left": where the reverse sweep
        left it), checked, in a buffer for :meth:`deliver_state`."""
        entry = self.found.get(what)
        if entry is None:
            raise CorruptionError(f"{self.path / MANIFEST} names no {what} state: a run of "
                                  "its sweep commits one")
        buffer = aligned_buffer(entry["nbytes"])
        read_snapshot(self.path, entry, [buffer[:entry["nbytes"]]])
        return buffer

    def read_state(self, step: int, states: dict[int, tuple[int, int, int]]) -> np.ndarray:
        """The committed u_step (``states``: key -> record, bytes, checksum), its checksum
        checked, in a buffer for :meth:`deliver_state`."""
        assert self.interpreter is not None
        record, size, digest = states[step]
        buffer = aligned_buffer(size)
        self.storage.get(step, buffer[:size])
        if self.interpreter.link.checksum(buffer[:size]) != digest:
            raise CorruptionError(f"u_{step} in {self.path / STATES_FILE} (record {record}) "
                                  "is damaged: its checksum does not match the manifest's")
        return buffer

    def deliver_state(self, buffer: np.ndarray, step: int) -> None:
        """Copy a state read by :meth:`read_state` or :meth:`read_final` into the live
        arrays of u_step."""
        assert self.interpreter is not None
        self.interpreter.link.deliver(buffer, self.interpreter.arrays(step, into=True))

    def checked_seed(self, adjoint: Any, n: int, committed: int | None) -> int:
        """The checksum of the adjoint's seed (``adjoint``'s arrays at ``n``), which a resumed
        reverse sweep's must equal where one is ``committed`` (else the committed adjoint,
        restored over it, would be another job's).

        Raises
        ------
        UsageError
            If the seed is not the one committed.
        """
        seed = digest_of(adjoint.get_data(n))
        if committed is not None and committed != seed:
            raise UsageError(
                f"run_dir {str(self.path)!r} holds a run whose reverse sweep began from "
                f"another adjoint seed (xxh3:{committed:016x} there, xxh3:{seed:016x} here): "
                "its committed adjoint is not this seed's; seed the adjoint as that run did, "
                "or give another run_dir")
        return seed
