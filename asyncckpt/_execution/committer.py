"""Puts a run directory's commits in place on a thread of its own, so that the sweep pays for a
commit no more than a copy of what it snapshots.

A commit is a whole manifest: one that lands later says everything an earlier one said. So while
the thread is busy, a newer commit replaces the one waiting (its snapshots kept where the newer
one has none of theirs): the thread always writes the latest, and a sweep never waits for a
backlog of flushes.
"""
from __future__ import annotations

import threading
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np

from ..errors import StorageError
from ..storage.durable import STATES_FILE
from ..storage.rundir import write_manifest, write_snapshot

__all__ = ["Committer"]

#: What a commit snapshots: per name ("outputs", "adjoint"), the file to write and its arrays
#: (copies the sweep no longer touches), or None for none
Snapshots = dict[str, tuple[str, Sequence[np.ndarray]] | None]


class Committer:
    """The commits of the run directory ``path``.

    Parameters
    ----------
    path : Path
        The run directory.
    entries : dict
        The snapshots the last manifest put in place names (name -> its entry, or None): a
        commit that writes none of one names these.
    """

    def __init__(self, path: Path, entries: dict[str, Any]) -> None:
        self.path = path
        self._entries = dict(entries)
        self._cond = threading.Condition()
        self._next: tuple[dict[str, Any], Snapshots] | None = None
        self._busy = False
        self._failure: BaseException | None = None
        self._thread: threading.Thread | None = None
        self._stopping = False
        #: seconds the thread spent writing and flushing
        self.seconds = 0.0

    def submit(self, manifest: dict[str, Any], snapshots: Snapshots) -> None:
        """Commit ``manifest`` with ``snapshots`` once the thread gets to it (replacing a
        commit still waiting); raise the failure of an earlier one."""
        self._raise_failure()
        with self._cond:
            if self._next is not None:
                snapshots = {**self._next[1], **snapshots}
            self._next = (manifest, snapshots)
            if self._thread is None:
                self._thread = threading.Thread(target=self._loop, name="asyncckpt-commit",
                                                daemon=True)
                self._thread.start()
            self._cond.notify_all()

    def wait(self, timeout: float) -> None:
        """Wait until every commit submitted is in place (at most ``timeout`` seconds), and
        raise the failure of one."""
        deadline = time.monotonic() + timeout
        with self._cond:
            while (self._next is not None or self._busy) and self._failure is None:
                left = deadline - time.monotonic()
                if left <= 0:
                    raise StorageError(f"the commits to {self.path} took more than "
                                       f"{timeout:g} s: the device is stalled")
                self._cond.wait(left)
        self._raise_failure()

    def close(self, timeout: float) -> None:
        """:meth:`wait` (at most ``timeout`` seconds), then stop the thread; safe to call
        twice. A commit still running then is left to its daemon thread."""
        try:
            self.wait(timeout)
        finally:
            with self._cond:
                self._stopping = True
                self._cond.notify_all()
            if self._thread is not None and not self._busy:
                self._thread.join(timeout)
            self._thread = None

    def _raise_failure(self) -> None:
        if self._failure is not None:
            raise StorageError(f"a commit to {self.path} failed: {self._failure!r}") \
                from self._failure

    def _loop(self) -> None:
        while True:
            with self._cond:
                while self._next is None and not self._stopping:
                    self._cond.wait()
                if self._next is None:
                    return
                (manifest, snapshots), self._next = self._next, None
                self._busy = True
            start = time.perf_counter()
            try:
                self._write(manifest, snapshots)
            except BaseException as exc:  # noqa: BLE001 - raised on the sweep's thread
                self._failure = exc
            finally:
                self.seconds += time.perf_counter() - start
                with self._cond:
                    self._busy = False
                    self._cond.notify_all()

    def _write(self, manifest: dict[str, Any], snapshots: Snapshots) -> None:
        """Write the snapshots, then the manifest naming them; then remove those it no longer
        names."""
        for what, snapshot in snapshots.items():
            self._entries[what] = None if snapshot is None else write_snapshot(
                self.path, snapshot[0], snapshot[1])
        write_manifest(self.path, {**manifest, **self._entries})
        named = {e["file"] for e in self._entries.values() if e is not None}
        for path in self.path.glob("*.bin"):
            if path.name != STATES_FILE and path.name not in named:
                path.unlink(missing_ok=True)
