"""One conformance suite for every Level-2 backend, plus FileStorage's own guarantees."""
from __future__ import annotations

import os
import stat
from pathlib import Path

import numpy as np
import pytest

from asyncckpt import FileStorage, HostMemoryStorage, StorageFullError
from asyncckpt._buffers import PAGE, aligned_buffer

SIZES = [1, 100, PAGE, PAGE + 1, 3 * PAGE - 7, (1 << 20) + 13]


class StorageConformance:
    """Subclasses set ``make`` (a fixture returning a fresh backend)."""

    @pytest.fixture
    def storage(self):
        raise NotImplementedError

    @pytest.mark.parametrize("nbytes", SIZES)
    @pytest.mark.parametrize("aligned", [True, False])
    def test_round_trip(self, storage, nbytes: int, aligned: bool) -> None:
        rng = np.random.default_rng(nbytes)
        if aligned:
            src = aligned_buffer(nbytes)[:nbytes]
            out = aligned_buffer(nbytes)[:nbytes]
        else:
            src = np.zeros(nbytes + 1, dtype=np.uint8)[1:]
            out = np.zeros(nbytes + 3, dtype=np.uint8)[3:]
        src[:] = rng.integers(0, 256, nbytes, dtype=np.uint8)
        storage.put(7, src)
        storage.put(8, src[::-1].copy())
        assert 7 in storage and 8 in storage and 9 not in storage
        storage.get(7, out)
        assert out.tobytes() == src.tobytes()
        storage.get(8, out)
        assert out.tobytes() == src[::-1].tobytes()
        storage.delete(7)
        assert 7 not in storage
        storage.put(7, src)  # a freed slot is reused
        storage.get(7, out)
        assert out.tobytes() == src.tobytes()

    def test_missing_and_duplicate_keys(self, storage) -> None:
        buf = aligned_buffer(64)[:64]
        with pytest.raises(KeyError, match="get\\(3\\)"):
            storage.get(3, buf)
        with pytest.raises(KeyError, match="delete\\(3\\)"):
            storage.delete(3)
        storage.put(3, buf)
        with pytest.raises(KeyError, match="already stored"):
            storage.put(3, buf)

    def test_reserve_then_use(self, storage) -> None:
        storage.reserve(5000, 4)
        buf = aligned_buffer(5000)[:5000]
        for key in range(6):  # more than reserved still works
            buf[:] = key
            storage.put(key, buf)
        for key in range(6):
            storage.get(key, buf)
            assert (buf == key).all()

    def test_reserve_beyond_the_device_fails_fast_with_numbers(self, storage) -> None:
        with pytest.raises(StorageFullError, match=r"\d+(\.\d+)? GiB"):
            storage.reserve(1 << 30, 1 << 20)  # a petabyte

    def test_close_twice(self, storage) -> None:
        storage.close()
        storage.close()


class TestHostMemoryStorage(StorageConformance):
    @pytest.fixture
    def storage(self):
        backend = HostMemoryStorage()
        yield backend
        backend.close()

    def test_adopt_swaps_buffers_without_copying(self) -> None:
        backend = HostMemoryStorage()
        staging = aligned_buffer(PAGE)
        staging[:10] = 42
        spare = backend.adopt(1, staging, 10)
        assert spare is not staging and spare.nbytes >= 10
        out = np.zeros(10, dtype=np.uint8)
        backend.get(1, out)
        assert (out == 42).all()
        backend.close()


class TestFileStorageTmpfs(StorageConformance):
    @pytest.fixture
    def storage(self, shm_dir: Path):
        backend = FileStorage(shm_dir)
        yield backend
        backend.close()


class TestFileStorageDiskDirect(StorageConformance):
    @pytest.fixture
    def storage(self, disk_dir: Path):
        backend = FileStorage(disk_dir, direct_min_bytes=0)
        if not backend.direct:
            backend.close()
            pytest.skip("O_DIRECT unsupported here")
        yield backend
        backend.close()


class TestFileStorageDiskBuffered(StorageConformance):
    @pytest.fixture
    def storage(self, disk_dir: Path):
        backend = FileStorage(disk_dir, direct=False)
        yield backend
        backend.close()


def test_private_directory_and_cleanup(disk_dir: Path) -> None:
    a, b = FileStorage(disk_dir), FileStorage(disk_dir)
    try:
        assert a.directory != b.directory
        for backend in (a, b):
            assert stat.S_IMODE(backend.directory.stat().st_mode) == 0o700
        buf = aligned_buffer(100)[:100]
        buf[:] = 1
        a.put(0, buf)
        buf[:] = 2
        b.put(0, buf)
        out = np.zeros(100, dtype=np.uint8)
        a.get(0, out)
        assert (out == 1).all()
        for f in a.directory.iterdir():
            assert stat.S_IMODE(f.stat().st_mode) == 0o600
        a.close()
        assert not a.directory.exists() and b.directory.exists()
        b.get(0, out)
        assert (out == 2).all()
    finally:
        a.close()
        b.close()
    assert list(disk_dir.iterdir()) == []


def test_missing_path_is_created_and_removed(tmp_path: Path) -> None:
    path = tmp_path / "a" / "b"
    backend = FileStorage(path)
    assert path.is_dir()
    backend.close()
    assert not (tmp_path / "a").exists()


def test_path_that_is_a_file_is_rejected(tmp_path: Path) -> None:
    target = tmp_path / "file"
    target.write_text("x")
    with pytest.raises(ValueError, match="is not a directory"):
        FileStorage(target)


def test_path_that_cannot_be_created_is_rejected() -> None:
    with pytest.raises(ValueError, match="cannot be created"):
        FileStorage("/proc/asyncckpt-level2")


def test_path_of_the_wrong_type_is_rejected() -> None:
    with pytest.raises(TypeError, match="str or os.PathLike"):
        FileStorage(42)  # type: ignore[arg-type]


@pytest.mark.skipif(os.geteuid() == 0, reason="root writes anywhere")
def test_unwritable_path_is_rejected(tmp_path: Path) -> None:
    tmp_path.chmod(0o500)
    try:
        with pytest.raises(ValueError, match="not writable"):
            FileStorage(tmp_path)
    finally:
        tmp_path.chmod(0o700)


def test_backends_round_trip_through_their_config(disk_dir: Path) -> None:
    from asyncckpt.storage import from_config

    original = FileStorage(disk_dir, direct=False, direct_min_bytes=4096)
    rebuilt = from_config(original.get_config())
    try:
        assert rebuilt.get_config() == original.get_config()
        assert rebuilt.directory != original.directory
    finally:
        original.close()
        rebuilt.close()
    assert isinstance(from_config(HostMemoryStorage().get_config()), HostMemoryStorage)
    with pytest.raises(ValueError, match="'S3Storage' is not a storage backend"):
        from_config({"name": "S3Storage"})


def test_closed_dram_is_reused_by_the_next_backend_and_released_on_request() -> None:
    from asyncckpt.storage import release_memory

    release_memory()
    first = HostMemoryStorage()
    buf = np.full(3 * PAGE, 7, dtype=np.uint8)
    first.put(0, buf)
    held = first._stored[0]
    first.close()
    second = HostMemoryStorage()
    second.put(5, buf)
    assert second._stored[5] is held  # no fresh memory faulted in
    out = np.zeros_like(buf)
    second.get(5, out)
    assert (out == 7).all()
    second.close()
    assert release_memory() == 3 * PAGE
    assert release_memory() == 0


def test_memory_pool_keeps_at_most_its_limit() -> None:
    from asyncckpt._pool import MemoryPool

    pool = MemoryPool(limit_bytes=10 * PAGE)
    pool.give([np.zeros(4 * PAGE, np.uint8) for _ in range(3)])
    assert pool.nbytes == 8 * PAGE
    assert pool.take(4 * PAGE - 100) is not None  # a page-padded buffer serves too
    assert pool.take(PAGE) is None
    assert pool.release() == 4 * PAGE
