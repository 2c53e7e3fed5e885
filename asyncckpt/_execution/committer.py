"""Puts a run directory's commits in place on a thread of its own, so that the sweep pays for a
commit no more than a write of what it snapshots into the page cache.

A commit is a whole manifest: one that lands later says everything an earlier one said. So while
the thread is busy, a newer commit replaces the one waiting (its snapshots kept where the newer
one has none of theirs): the thread always writes the latest, and a sweep never waits for a
backlog of flushes.

The thread numbers the commits: commit ``c``'s snapshots are ``KIND.c.bin`` and its manifest
says ``"commit": c``. The sweep writes a snapshot itself, from the program's own arrays (no copy
of them is held anywhere: :func:`~asyncckpt.storage.rundir.stage_snapshot`), under the name
:meth:`Committer.claim` gives it while the thread is idle, and hands the commit its entry; the
thread flushes it, then puts the manifest naming it in place. A manifest names
(``"replaced"``) the files the manifest it replaces named and it does not, which the thread
removes once it is in place. A process killed in commit ``c + 1`` (or with a snapshot written
for ``c + 2`` meanwhile) leaves at most those names unnamed, and one killed before its removals the
files manifest ``c`` says it replaced: the first commit of the next process removes both. No
other file is ever removed. Whoever waits for it waits a deadline at most: a stalled device
holds the thread, never the caller, and the directory's lock with it until its write returns.
"""
from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from ..errors import StorageError
from ..storage.rundir import cut_short, flush_snapshot, named_files, read_manifest, write_manifest

__all__ = ["Committer", "Snapshots"]

log = logging.getLogger(__name__)

#: What a commit snapshots: per kind ("outputs", "adjoint", ...), the manifest's entry of the
#: file the sweep wrote under the name :meth:`Committer.claim` gave (not yet flushed), or None
#: for none
Snapshots = dict[str, dict[str, Any] | None]


class Committer:
    """The commits of the run directory ``path``.

    Parameters
    ----------
    path : Path
        The run directory, holding the manifest last put in place, if any (read here: what
        it names, and the number of its commit).
    entries : dict
        The snapshots a resumed run's manifest names (kind -> its entry, or None): a
        commit that writes none of one names these.
    """

    def __init__(self, path: Path, entries: dict[str, Any]) -> None:
        self.path = path
        self._entries = dict(entries)
        last = read_manifest(path) or {}
        #: the files the manifest in place names, and the number of its commit
        self._named = named_files(last)
        self._commits = int(last.get("commit", 0))
        #: the kinds of snapshot the run commits (every kind the manifest names the files of)
        self._kinds = set(self._entries) | set(last.get("snapshots", ()))
        #: what a process killed in the commit after it, or before its removals, left
        self._left: set[str] | None = None
        if last:
            self._left = set(last.get("replaced", ())) | cut_short(
                {"commit": self._commits, "snapshots": sorted(self._kinds)})
        self._cond = threading.Condition()
        self._next: tuple[dict[str, Any], Snapshots] | None = None
        self._busy = False
        self._failure: BaseException | None = None
        self._thread: threading.Thread | None = None
        self._stopping = False
        #: what the thread runs once every commit is in place (the removal of a finished run),
        #: and then, in any case, as its last work (the release of the directory's lock)
        self._last: Callable[[], None] | None = None
        self._release: Callable[[], None] | None = None
        self._done = threading.Event()
        #: seconds the thread spent writing and flushing
        self.seconds = 0.0
        #: the number of the commit the thread took last (under way while it is busy)
        self._taken = self._commits
        #: names claimed for the sweep's snapshots, not yet committed
        self._claimed: set[str] = set()
        #: the snapshots of a waiting commit a claim withdrew, for the next submit
        self._withdrawn: Snapshots | None = None

    def claim(self, kind: str, replace: bool = False) -> Path | None:
        """Where the sweep writes a snapshot of ``kind`` for the next commit submitted
        (``KIND.c.bin``, ``c`` that commit's number: the one after the commit under way, if
        any), or None where one failed, or while a commit waits unless ``replace`` (then the
        commit the sweep submits next takes its place, as any newer commit would: the sweep
        submits it at once). Else the sweep snapshots nothing: a later commit says more. The
        sweep submits nothing else before the commit that names it; a name claimed again
        before (a snapshot no commit named) is its own, removed first."""
        with self._cond:
            if self._failure is not None or (self._next is not None and not replace):
                return None
            if self._next is not None:  # withdrawn: the next submit says all it said
                self._withdrawn, self._next = self._next[1], None
            if not self._busy:  # else the commit under way removed them
                self._remove_left()
            name = f"{kind}.{(self._taken if self._busy else self._commits) + 1}.bin"
            if name in self._claimed:
                (self.path / name).unlink(missing_ok=True)
            self._claimed.add(name)
            return self.path / name

    def _remove_left(self) -> None:
        """Remove what a process killed in the commit after the manifest in place, or before
        its removals, left (once)."""
        if self._left is not None:  # the run's own, left by a kill
            for name in sorted(self._left):
                (self.path / name).unlink(missing_ok=True)
            self._left = None

    def submit(self, manifest: dict[str, Any], snapshots: Snapshots) -> None:
        """Commit ``manifest`` with ``snapshots`` once the thread gets to it (replacing a
        commit still waiting); raise the failure of an earlier one."""
        self._raise_failure()
        with self._cond:
            if self._withdrawn is not None:
                snapshots, self._withdrawn = {**self._withdrawn, **snapshots}, None
            if self._next is not None:
                snapshots = {**self._next[1], **snapshots}
            self._next = (manifest, snapshots)
            self._start()
            self._cond.notify_all()

    def _start(self) -> None:
        if self._thread is None:
            self._thread = threading.Thread(target=self._loop, name="asyncckpt-commit",
                                            daemon=True)
            self._thread.start()

    def wait(self, timeout: float) -> None:
        """Wait until every commit submitted is in place, and raise the failure of one.

        Raises
        ------
        StorageError
            After ``timeout`` seconds (``transfer_timeout``) with a commit still under way (its
            ``__cause__`` a :class:`TimeoutError`): the device is stalled.
        """
        deadline = time.monotonic() + timeout
        with self._cond:
            while (self._next is not None or self._busy) and self._failure is None:
                left = deadline - time.monotonic()
                if left <= 0:
                    cause = TimeoutError(f"no answer within {timeout:g} s (transfer_timeout)")
                    raise StorageError(f"the commits to {self.path} took more than "
                                       f"{timeout:g} s: the device is stalled") from cause
                self._cond.wait(left)
        self._raise_failure()

    def finish(self, until: float, last: Callable[[], None] | None,
               release: Callable[[], None]) -> None:
        """Put the commits submitted in place, then run ``last`` (where they all were), then
        ``release``, in any case; all on the thread, waited for until ``until`` (a
        :func:`time.monotonic`) at the latest: past it, they are left to the thread, which
        runs ``release`` once its write returns. Logs a failure rather than raising it: what
        was put in place before stays, resumable. Call it once."""
        with self._cond:
            self._stopping = True
            self._last, self._release = last, release
            if self._thread is None and self._next is None:
                idle = True  # nothing ever committed, nothing under way: no thread to wait on
            else:
                idle = False
                self._start()
                self._cond.notify_all()
        if idle:
            self._end()
        elif self._done.wait(max(until - time.monotonic(), 0.0)):
            assert self._thread is not None
            self._thread.join()
        else:
            log.warning("run_dir %s: a commit still runs (the device is stalled): left to its "
                        "thread, which holds the directory until its write returns", self.path)
            return
        self._thread = None
        if self._failure is not None:
            log.warning("run_dir %s: a commit failed: %r", self.path, self._failure)

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
                    break
                (manifest, snapshots), self._next = self._next, None
                self._busy, self._taken = True, self._commits + 1
            start = time.perf_counter()
            try:
                if self._failure is None:  # after a failure nothing more is put in place
                    self._write(manifest, snapshots)
            except BaseException as exc:  # noqa: BLE001 - raised on the sweep's thread
                self._failure = exc
            finally:
                self.seconds += time.perf_counter() - start
                with self._cond:
                    self._busy = False
                    self._cond.notify_all()
        self._end()

    def _end(self) -> None:
        """The last work: ``last`` where every commit is in place, then ``release``."""
        try:
            if self._last is not None and self._failure is None:
                self._last()
        except BaseException as exc:  # noqa: BLE001 - logged by finish, or left to the thread
            self._failure = exc
        finally:
            if self._release is not None:
                self._release()
            self._done.set()

    def _write(self, manifest: dict[str, Any], snapshots: Snapshots) -> None:
        """Write the snapshots, then the manifest naming them; then remove those the manifest
        it replaced named and this one does not."""
        commit = self._commits + 1
        kinds = self._kinds | set(snapshots)
        self._remove_left()
        for kind, entry in snapshots.items():
            if entry is not None:
                if entry["file"] != f"{kind}.{commit}.bin":
                    raise StorageError(f"the snapshot {entry['file']} was written for another "
                                       f"commit than {commit}")
                flush_snapshot(self.path, entry)
                self._claimed.discard(entry["file"])
            self._entries[kind] = entry
        record = {**manifest, **self._entries, "commit": commit, "snapshots": sorted(kinds)}
        named = named_files(record)
        replaced = sorted(self._named - named)
        write_manifest(self.path, {**record, "replaced": replaced})
        self._commits, self._kinds, self._named = commit, kinds, named
        for name in replaced:
            (self.path / name).unlink(missing_ok=True)
