"""The files of a run directory, one by one: opened without following links, made only where no
file has the name, read only where a manifest names a file a run writes, and the directory's
lock never held by a forked child (asyncckpt/storage/rundir.py)."""
from __future__ import annotations

import json
import os

import numpy as np
import pytest

from asyncckpt.errors import CorruptionError, UsageError
from asyncckpt.storage.durable import STATES_FILE, DurableFileStorage
from asyncckpt.storage.rundir import (FORMAT, MANIFEST, TEMPORARY, lock_directory, open_own,
                                      read_manifest, read_snapshot, write_manifest,
                                      write_snapshot)


def test_open_own_refuses_a_link_a_hard_link_and_a_fifo(tmp_path):
    target = tmp_path / "elsewhere"
    target.write_bytes(b"theirs")
    cases = {"link": lambda p: p.symlink_to(target), "hard": lambda p: os.link(target, p),
             "fifo": lambda p: os.mkfifo(p)}
    for name, make in cases.items():
        make(tmp_path / name)
        with pytest.raises(UsageError, match=str(tmp_path / name)):
            os.close(open_own(tmp_path / name, os.O_RDWR | os.O_CREAT))
    assert target.read_bytes() == b"theirs"


def test_durable_storage_refuses_a_states_file_of_two_names(tmp_path):
    """A hard link named states.bin: the states would be written into the other name's file."""
    other = tmp_path / "other"
    other.write_bytes(b"\0" * 4096)
    run_dir = tmp_path / "run"
    run_dir.mkdir()
    os.link(other, run_dir / STATES_FILE)
    with pytest.raises(UsageError, match="hard links"):
        DurableFileStorage(run_dir)
    assert other.read_bytes() == b"\0" * 4096


def test_a_snapshot_is_made_only_where_no_file_has_its_name(tmp_path):
    (tmp_path / "outputs.3.bin").write_bytes(b"the user's")
    with pytest.raises(UsageError, match="did not write it"):
        write_snapshot(tmp_path, "outputs.3.bin", [np.arange(4.0)])
    assert (tmp_path / "outputs.3.bin").read_bytes() == b"the user's"


def test_the_manifests_temporary_is_made_anew_never_written_through(tmp_path):
    outside = tmp_path / "outside"
    outside.write_bytes(b"keep")
    run_dir = tmp_path / "run"
    run_dir.mkdir()
    (run_dir / TEMPORARY).symlink_to(outside)
    write_manifest(run_dir, {"format": FORMAT, "step": 3})
    assert read_manifest(run_dir) == {"format": FORMAT, "step": 3}
    assert outside.read_bytes() == b"keep"
    assert not (run_dir / MANIFEST).is_symlink()


def test_a_manifest_read_through_a_link_is_refused(tmp_path):
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    write_manifest(elsewhere, {"format": FORMAT})
    run_dir = tmp_path / "run"
    run_dir.mkdir()
    (run_dir / MANIFEST).symlink_to(elsewhere / MANIFEST)
    with pytest.raises(UsageError, match="symbolic link"):
        read_manifest(run_dir)


@pytest.mark.parametrize("name", ["../outside.bin", "/etc/passwd", "notes.txt", 7])
def test_a_manifest_naming_a_file_a_run_never_writes_is_damaged(tmp_path, name):
    """A manifest names the files a run removes at its end: one naming a path outside the
    directory (its checksum recomputed by whoever edited it) is refused before anything is
    read or removed."""
    write_manifest(tmp_path, {"format": FORMAT, "outputs": {"file": name, "nbytes": 8,
                                                            "digest": 0}})
    with pytest.raises(CorruptionError, match="names the file"):
        read_manifest(tmp_path)


def test_a_snapshot_reads_back_and_a_damaged_one_is_refused(tmp_path):
    arrays = [np.arange(6.0), np.arange(3, dtype=np.int32)]
    entry = write_snapshot(tmp_path, "outputs.1.bin", arrays)
    out = [np.zeros_like(a) for a in arrays]
    read_snapshot(tmp_path, entry, out)
    assert all((a == b).all() for a, b in zip(arrays, out))
    data = bytearray((tmp_path / "outputs.1.bin").read_bytes())
    data[3] ^= 0xFF
    (tmp_path / "outputs.1.bin").write_bytes(bytes(data))
    with pytest.raises(CorruptionError, match="outputs.1.bin"):
        read_snapshot(tmp_path, entry, out)


def test_a_forked_child_closes_its_copy_of_the_lock(tmp_path):
    """flock belongs to the open file: a child that kept the descriptor held the directory
    after the parent let go."""
    lock = lock_directory(tmp_path)
    told, tell = os.pipe()  # the child says whether it holds the lock
    hold, done = os.pipe()  # ... and lives until the parent closes ``done``
    pid = os.fork()
    if pid == 0:
        os.close(told)
        os.close(done)
        os.write(tell, json.dumps(lock.held).encode())
        os.read(hold, 1)
        os._exit(0)
    os.close(tell)
    os.close(hold)
    try:
        assert json.loads(os.read(told, 16)) is False  # the child holds nothing
        with pytest.raises(UsageError, match="in use"):
            lock_directory(tmp_path)
        lock.release()
        again = lock_directory(tmp_path)  # while the child lives
        again.release()
    finally:
        os.close(told)
        os.close(done)
        os.waitpid(pid, 0)
    lock.release()  # twice is no error
