"""The files of a run directory as a whole: taking a directory up (locked, checked to be unused
or to hold this checkpointer's run, the states its manifest names restored), and the removal of
a finished run's files (only those its manifest names, its states and its temporary: nothing
else in the directory is touched)."""
from __future__ import annotations

import dataclasses
import logging
import os
from pathlib import Path
from typing import Any, NamedTuple

import numpy as np

from .._memory.buffers import padded
from ..errors import MemoryBudgetError, StorageError, UsageError
from ..storage.directories import make_private
from ..storage.durable import STATES_FILE, DurableFileStorage
from ..storage.rundir import (MANIFEST, REMOVING, TEMPORARY, DirectoryLock, cut_short,
                              fsync_directory, lock_directory, named_files, read_manifest)

__all__ = ["FoundRun", "charge_ram", "snapshot_bytes", "check_same_run", "check_unused", "find_run",
           "finish_removal", "remove_run", "take_directory"]

log = logging.getLogger(__name__)

#: What a directory that holds no manifest may hold: what a run killed before its first
#: commit, or while its files were being removed, left
_LEFT_BY_A_KILL = (STATES_FILE, TEMPORARY, REMOVING)


def take_directory(path: Path) -> DirectoryLock:
    """Make ``path`` (private) where it is missing, and lock it for this checkpointer alone."""
    if not path.exists():
        make_private(path)
    elif not path.is_dir():
        raise UsageError(f"run_dir {str(path)!r} is not a directory")
    return lock_directory(path)


class FoundRun(NamedTuple):
    """What a run directory taken up holds (:func:`find_run`)."""

    #: the manifest of the run to resume, or None for a fresh run
    manifest: dict[str, Any] | None
    #: the run's Level-2 (the checkpointer's parts close it)
    storage: DurableFileStorage
    #: the committed states: key -> (record, bytes, checksum)
    states: dict[int, tuple[int, int, int]]

    def resumed(self) -> dict[str, Any] | None:
        """None for a fresh run, else where the run resumes: its sweep and step (a finished
        run's reverse at 0 where its adjoint was committed, else at n: it runs again)."""
        manifest = self.manifest
        return None if manifest is None else {
            "sweep": "reverse" if manifest["sweep"] == "done" else manifest["sweep"],
            "step": manifest["step"],
            "interval": manifest["plan"]["interval"], "states": len(self.states)}

    def plan(self) -> tuple[int, int] | None:
        """The plan (interval, Level-1 slots) a resumed run must follow: its states' steps."""
        manifest = self.manifest
        return None if manifest is None else (
            manifest["plan"]["interval"], manifest["plan"]["l1_slots"])


def find_run(path: Path, identity: dict[str, Any]) -> FoundRun:
    """Take up the run in ``path`` (locked by :func:`take_directory`): the one its manifest
    names, its states restored into the run's Level-2, else a fresh one."""
    manifest = read_manifest(path)
    if manifest is None:
        check_unused(path)
    else:
        check_same_run(path, identity, manifest["run"])
        if manifest["sweep"] == "forward" and not manifest["states"]:
            manifest = None  # killed before its first commit: nothing to resume
    storage = DurableFileStorage(path)
    states: dict[int, tuple[int, int, int]] = {}
    if manifest is not None:
        states = {k: (r, b, d) for k, r, b, d in manifest["states"]}
        try:
            storage.restore(identity["nbytes"], {k: (r, b) for k, (r, b, _)
                                                 in states.items()})
        except BaseException:
            storage.close()
            raise
    return FoundRun(manifest, storage, states)


def check_unused(path: Path) -> None:
    """Raise unless ``path`` holds nothing but what a run that never committed, or one killed
    while its directory was being removed, left (that removal is finished here); make it
    private (0700)."""
    if os.path.lexists(path / REMOVING):
        finish_removal(path, remove_directory=False)
    others = sorted(p.name for p in path.iterdir() if p.name not in _LEFT_BY_A_KILL)
    if others:
        raise UsageError(f"run_dir {str(path)!r} holds no run's manifest but other "
                         f"files ({', '.join(others[:5])}): give an empty or new directory")
    try:
        os.chmod(path, 0o700)  # private, as a directory made here is
    except OSError as exc:
        raise StorageError(f"run_dir {str(path)!r} cannot be made private (0700): "
                           f"{exc.strerror}; give a directory this process may write") from exc


def check_same_run(path: Path, identity: dict[str, Any], theirs: dict[str, Any]) -> None:
    """Raise, naming what differs, unless ``theirs`` (a manifest's run) is ``identity``."""
    differ = [f"{name} {theirs.get(name)!r} there, {mine!r} here"
              for name, mine in identity.items() if theirs.get(name) != mine]
    if differ:
        raise UsageError(f"run_dir {str(path)!r} holds another run: "
                         f"{'; '.join(differ)} (give another run_dir, or remove it)")


def remove_run(path: Path) -> None:
    """Remove a finished run's files from ``path``, then ``path`` where nothing else is in it.

    The manifest is put aside first (renamed :data:`~asyncckpt.storage.rundir.REMOVING`): a
    kill from there on leaves no run, and the record of the files to remove, which the next
    run in the directory removes (:func:`check_unused`)."""
    try:
        os.replace(path / MANIFEST, path / REMOVING)
    except FileNotFoundError:
        pass  # nothing committed: the states' file alone, if that
    else:
        fsync_directory(path)
    finish_removal(path)


def finish_removal(path: Path, remove_directory: bool = True) -> None:
    """Remove the files the manifest put aside names or says it replaced, the states' file
    and the run's temporaries (the manifest's, and the snapshots of the commits after it, cut
    short by a kill), then the manifest put aside, then (where ``remove_directory``) ``path``
    where nothing else is in it."""
    record = read_manifest(path, REMOVING) or {}
    left = cut_short(record) | set(record.get("replaced", ()))
    for name in sorted({STATES_FILE, TEMPORARY} | named_files(record) | left):
        (path / name).unlink(missing_ok=True)  # a link itself, never what it names
    (path / REMOVING).unlink(missing_ok=True)
    if remove_directory:
        try:
            path.rmdir()
        except OSError:
            log.info("run_dir %s holds other files: left in place", path)



def charge_ram(run: Any, options: Any, nbytes: int, bound: int, l1_slots: int,
               engine_buffers: int) -> Any:
    """For a run directory on a RAM-backed filesystem (``run``, a
    :class:`~asyncckpt._execution.resume.RunDir`): bound the states of ``nbytes`` it may hold
    to what ``bound`` bytes (the budget, or the default bound) leave beside ``l1_slots``
    slots, the engine's buffers and the most its snapshot files hold at once
    (:func:`snapshot_bytes`), as a DRAM tier's are (its ``room_for`` answers it, so "auto"
    plans within it); the ``options`` the run follows (its slots fixed: the room beside them
    is the directory's).

    Raises
    ------
    MemoryBudgetError
        Where no state fits, or a fixed interval stores more states than fit (naming the
        least interval that fits).
    """
    storage = run.storage
    snapshots = snapshot_bytes(run.outputs, run.adjoint, nbytes)
    n, size = options.n_timesteps, padded(nbytes)
    held = (bound - snapshots) // size - engine_buffers  # slots and the directory's states
    if options.l1_slots is None:  # the budget's to split: half of it for the directory
        l1_slots = max(1, min(l1_slots, held // 2))
    room = held - l1_slots
    where = (f"run_dir {str(storage.path)!r} is on a RAM-backed filesystem: its states count "
             f"against the {bound} bytes of host memory beside {l1_slots} Level-1 slots, "
             f"{engine_buffers} staging and prefetch buffers and {snapshots} bytes of "
             "snapshots")
    if room < 1:
        raise MemoryBudgetError(f"{where}, which leave no room for a state: give a larger "
                                "budget, fewer l1_slots, or a run_dir on a disk")
    interval = options.interval
    if isinstance(interval, int) and interval > 0 and -(-n // interval) > room:
        raise MemoryBudgetError(
            f"{where}: interval {interval} keeps {-(-n // interval)} states there, {room} fit "
            f"(interval {-(-n // room)} is the least that fits); give a larger interval or "
            "budget, or a run_dir on a disk")
    storage.ram_room = room
    return dataclasses.replace(options, l1_slots=l1_slots)


def snapshot_bytes(outputs: Any, adjoint: Any, nbytes: int) -> int:
    """The most bytes a run's snapshot files hold at once, each page-padded: in the forward
    sweep three of ``outputs`` (the one named, one a commit under way writes, one the sweep
    writes for the next) and u_n; in the reverse, the outputs, u_n, three of ``adjoint`` and
    the live state the sweep left."""
    def size(descriptor: Any) -> int:
        if descriptor is None:
            return 0
        return padded(sum(int(np.asarray(a).nbytes) for a in descriptor.get_data(0)))
    out, adj, state = size(outputs), size(adjoint), padded(nbytes)
    return max(3 * out + state, out + 3 * adj + 2 * state)
