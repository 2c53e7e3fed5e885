"""The shipped conformance suite (asyncckpt.testing.StorageTests) on every backend of the project,
proof that it fails broken backends, and FileStorage's own guarantees."""
from __future__ import annotations

import os
import stat
from pathlib import Path

import numpy as np
import pytest

from asyncckpt import FileStorage, HostMemoryStorage, Storage, StorageFullError, StorageKeyError
from asyncckpt.storage import TieredStorage, WrapperStorage
from asyncckpt._tuning.calibrate import BURST_STATES, measure_transfer
from asyncckpt._memory.buffers import PAGE, aligned_buffer
from asyncckpt.storage.kept import KEPT_FILES, RELEASE_IN_BACKGROUND_BYTES, fits_beside, release_files
from asyncckpt.testing import StorageTests
from conftest import wait_no_threads


class ProjectBackend(StorageTests):
    """The shipped conformance suite, plus what this project's backends promise beyond it."""

    def test_errors_name_the_call_and_the_key(self, tmp_path: Path) -> None:
        storage = self.make_storage(tmp_path)
        buf = aligned_buffer(64)[:64]
        with pytest.raises(StorageKeyError, match="get\\(3\\): key not stored"):
            storage.get(3, buf)
        with pytest.raises(StorageKeyError, match="delete\\(3\\): key not stored"):
            storage.delete(3)
        storage.put(3, buf)
        with pytest.raises(StorageKeyError, match="put\\(3\\): key already stored"):
            storage.put(3, buf)
        storage.close()

    def test_reserve_beyond_the_device_fails_fast_with_numbers(self, tmp_path: Path) -> None:
        storage = self.make_storage(tmp_path)
        with pytest.raises(StorageFullError, match=r"\d+(\.\d+)? GiB"):
            storage.reserve(1 << 30, 1 << 20)  # a petabyte
        storage.close()


class TestHostMemoryStorage(ProjectBackend):
    def make_storage(self, tmp_path: Path) -> Storage:
        return HostMemoryStorage()

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


class TestFileStorageTmpfs(ProjectBackend):
    def make_storage(self, tmp_path: Path) -> Storage:
        return FileStorage("/dev/shm")


class TestFileStorageDiskDirect(ProjectBackend):
    def make_storage(self, tmp_path: Path) -> Storage:
        backend = FileStorage(tmp_path, direct_min_bytes=0)
        if not backend.direct:
            backend.close()
            pytest.skip("O_DIRECT unsupported here")
        return backend


class TestFileStorageDiskBuffered(ProjectBackend):
    def make_storage(self, tmp_path: Path) -> Storage:
        return FileStorage(tmp_path, direct=False)


class ForgetfulStorage(HostMemoryStorage):
    """Broken on purpose: a put of a key it once held keeps the old bytes (a stale cache)."""

    def __init__(self) -> None:
        super().__init__()
        self.cache: dict[int, bytes] = {}

    def put(self, key: int, buf: np.ndarray) -> None:
        super().put(key, buf)
        self.cache.setdefault(key, buf.tobytes())

    def adopt(self, key: int, buffer: np.ndarray, nbytes: int) -> np.ndarray:
        return Storage.adopt(self, key, buffer, nbytes)

    def get(self, key: int, out: np.ndarray) -> None:
        super().get(key, out)
        out[:] = np.frombuffer(self.cache[key], dtype=np.uint8)


class HalfStorage(HostMemoryStorage):
    """Broken on purpose: keeps only the first half of what it is given."""

    def put(self, key: int, buf: np.ndarray) -> None:
        kept = buf.copy()
        kept[buf.nbytes // 2:] = 0
        super().put(key, kept)

    def adopt(self, key: int, buffer: np.ndarray, nbytes: int) -> np.ndarray:
        return Storage.adopt(self, key, buffer, nbytes)


class NotAStorage:
    def put(self, key, buf): ...  # noqa: E704 - the five names, but not a Storage
    def get(self, key, out): ...  # noqa: E704
    def delete(self, key): ...  # noqa: E704
    def __contains__(self, key): return False  # noqa: E704
    def close(self): ...  # noqa: E704


@pytest.mark.parametrize(("backend", "failing"), [
    (ForgetfulStorage, "test_delete_then_put_returns_the_new_bytes"),
    (HalfStorage, "test_round_trips_of_several_sizes"),
    (HalfStorage, "test_adopt_stores_the_buffer_and_returns_one_to_reuse"),
])
def test_the_suite_fails_a_broken_backend(backend: type, failing: str, tmp_path: Path) -> None:
    class Suite(StorageTests):
        def make_storage(self, tmp_path: Path) -> Storage:
            return backend()

    with pytest.raises(AssertionError, match="stale bytes|other bytes|changed the stored"):
        getattr(Suite(), failing)(tmp_path)


def test_the_suite_refuses_what_is_not_a_storage(tmp_path: Path) -> None:
    class Suite(StorageTests):
        def make_storage(self, tmp_path: Path) -> Storage:
            return NotAStorage()  # type: ignore[return-value]

    with pytest.raises(AssertionError, match="not an asyncckpt Storage"):
        Suite().test_contains(tmp_path)
    with pytest.raises(NotImplementedError, match="override make_storage"):
        StorageTests().test_contains(tmp_path)


def test_the_checkpointer_refuses_what_is_not_a_storage() -> None:
    from asyncckpt.storage import open_storage

    with pytest.raises(TypeError, match=r"Storage instance, or a list of those \(tiers\); got NotAStorage"):
        open_storage(NotAStorage())  # type: ignore[arg-type]
    storage, owned = open_storage("DRAM")
    assert isinstance(storage, HostMemoryStorage) and owned
    storage.close()


def test_the_file_has_no_name_and_each_backend_its_own(disk_dir: Path) -> None:
    """Nothing under the path names a Level-2 file, even while states are stored; each file is
    private (0600, no links) and two backends on one path never meet."""
    a, b = FileStorage(disk_dir), FileStorage(disk_dir)
    try:
        buf = aligned_buffer(100)[:100]
        buf[:] = 1
        a.put(0, buf)
        buf[:] = 2
        b.put(0, buf)
        assert list(disk_dir.iterdir()) == []
        for backend in (a, b):
            info = os.fstat(backend.fileno())
            assert stat.S_IMODE(info.st_mode) == 0o600 and info.st_nlink == 0
        out = np.zeros(100, dtype=np.uint8)
        a.get(0, out)
        assert (out == 1).all()
        a.close()
        b.get(0, out)
        assert (out == 2).all()
    finally:
        a.close()
        b.close()
    assert list(disk_dir.iterdir()) == []



def _descriptor_closed(link: str, target: str) -> bool:
    return not os.path.lexists(link) or os.readlink(link) != target


def test_a_closed_file_is_kept_for_the_next_backend_under_its_directory(disk_dir: Path) -> None:
    """A program that makes a checkpointer per gradient writes into the blocks the last one
    allocated: the next backend under the same directory takes the closed one's file, with none
    of its states, and reserving no more than it held allocates nothing."""
    nbytes = 4 * PAGE
    first = FileStorage(disk_dir)
    first.reserve(nbytes, 8)
    buf = aligned_buffer(nbytes)[:nbytes]
    buf[:] = 7
    first.put(0, buf)
    inode, blocks = os.fstat(first.fileno()).st_ino, os.fstat(first.fileno()).st_blocks
    first.close()
    assert list(disk_dir.iterdir()) == []  # it has no name
    second = FileStorage(disk_dir)
    try:
        assert os.fstat(second.fileno()).st_ino == inode
        assert 0 not in second
        second.reserve(nbytes, 8)
        assert os.fstat(second.fileno()).st_blocks == blocks
        buf[:] = 3
        second.put(5, buf)
        out = np.zeros_like(buf)
        second.get(5, out)
        assert (out == 3).all()
        with pytest.raises(StorageKeyError):
            second.get(0, out)
        elsewhere = FileStorage(disk_dir / "other")
        assert os.fstat(elsewhere.fileno()).st_ino != inode
        elsewhere.close()
    finally:
        second.close()
    assert release_files() >= 8 * nbytes


def test_a_forked_child_never_takes_its_parents_kept_file(disk_dir: Path) -> None:
    """After ``fork`` the child has the parent's descriptors: were it to take the parent's kept
    file, both would write into one file. The child opens its own; the parent keeps its."""
    first = FileStorage(disk_dir)
    first.reserve(PAGE, 4)
    inode = os.fstat(first.fileno()).st_ino
    first.close()
    read, write = os.pipe()
    pid = os.fork()
    if pid == 0:  # the child: report its new backend's inode, then leave at once
        status = 1
        try:
            child = FileStorage(disk_dir)
            os.write(write, str(os.fstat(child.fileno()).st_ino).encode())
            child.close()
            release_files()
            status = 0
        finally:
            os._exit(status)
    os.close(write)
    with os.fdopen(read) as reader:
        child_inode = int(reader.read())
    _, status = os.waitpid(pid, 0)
    assert os.waitstatus_to_exitcode(status) == 0
    assert child_inode != inode
    again = FileStorage(disk_dir)
    try:
        assert os.fstat(again.fileno()).st_ino == inode
    finally:
        again.close()
        release_files()


def test_no_more_than_kept_files_are_kept(tmp_path: Path) -> None:
    """Closed backends under many directories (a test suite's) keep the most recent files
    only: the oldest's descriptor is closed."""
    links = []
    for i in range(KEPT_FILES + 1):
        backend = FileStorage(tmp_path / str(i))
        backend.reserve(PAGE, 1)
        link = f"/proc/self/fd/{backend.fileno()}"
        links.append((link, os.readlink(link)))
        backend.close()
    try:
        assert _descriptor_closed(*links[0])
        assert not any(_descriptor_closed(*link) for link in links[1:])
    finally:
        release_files()
    assert all(_descriptor_closed(*link) for link in links)


def test_a_file_is_kept_only_while_the_device_has_as_much_free_beside_it(disk_dir: Path) -> None:
    backend = FileStorage(disk_dir)
    try:
        free = backend.free_bytes()
        assert fits_beside(backend.fileno(), free // 2)
        assert not fits_beside(backend.fileno(), 2 * free + (1 << 30))
    finally:
        backend.close()
        release_files()


def test_releasing_a_large_kept_file_closes_it_and_leaves_no_thread(disk_dir: Path) -> None:
    """A file that held hundreds of MiB is released on a short-lived thread (the device may
    take a while to free its blocks): its descriptors still close, and no thread or file is
    left."""
    nbytes = RELEASE_IN_BACKGROUND_BYTES // 2
    backend = FileStorage(disk_dir)
    buf = aligned_buffer(nbytes)[:nbytes]
    for key in range(3):
        buf[:PAGE] = key
        backend.put(key, buf)
    link = f"/proc/self/fd/{backend.fileno()}"
    target = os.readlink(link)
    backend.close()
    assert not _descriptor_closed(link, target)  # kept for the next backend
    assert release_files() >= 3 * nbytes
    assert wait_no_threads() == []
    assert _descriptor_closed(link, target)
    assert list(disk_dir.iterdir()) == []
    backend.close()  # a second close does nothing
    assert release_files() == 0


_KILLED_WRITER = """
import sys, time
import numpy as np
from asyncckpt import ArrayCheckpoint, AsyncCheckpointer

state = np.zeros(1 << 18)

class Forward:
    def apply(self, *, t_start, t_end):
        for t in range(t_start, t_end):
            state[:] += 1.0
            if t == 40:
                print("mid-sweep", flush=True)
                time.sleep(60)

class Reverse:
    def apply(self, *, t_start, t_end):
        pass

with AsyncCheckpointer(ArrayCheckpoint([state]), Forward(), Reverse(), 100, l1_slots=2,
                       interval=1, storage=sys.argv[1]) as ckp:
    ckp.apply_forward()
"""


def test_a_process_killed_mid_sweep_leaves_nothing_on_the_device(disk_dir: Path) -> None:
    """SIGKILL, as an out-of-memory kill or a batch scheduler does it, in the middle of the
    forward sweep with 40 states (80 MiB) on disk: no file, no directory, no space held."""
    import signal
    import subprocess
    import sys

    from conftest import ROOT as root
    child = subprocess.Popen([sys.executable, "-c", _KILLED_WRITER, str(disk_dir)],
                             stdout=subprocess.PIPE, text=True, cwd=root)
    try:
        assert child.stdout is not None
        assert child.stdout.readline().strip() == "mid-sweep"
        held = [os.readlink(f"/proc/{child.pid}/fd/{fd}")
                for fd in os.listdir(f"/proc/{child.pid}/fd")]
        assert any(str(disk_dir) in link and "(deleted)" in link for link in held), held
        assert list(disk_dir.iterdir()) == []
    finally:
        child.send_signal(signal.SIGKILL)
        child.wait(30)
    assert child.returncode == -signal.SIGKILL
    assert list(disk_dir.iterdir()) == []


def test_missing_path_is_created_and_removed(tmp_path: Path) -> None:
    path = tmp_path / "a" / "b"
    backend = FileStorage(path)
    assert path.is_dir()
    backend.close()
    assert not (tmp_path / "a").exists()


def test_many_storages_making_one_shared_path_at_once_all_open(tmp_path: Path) -> None:
    """The ranks of an MPI job make rank00000, rank00001, ... under one missing path at once:
    a parent another one made meanwhile is no error (it was: 'cannot be created: File
    exists'), and each removes what it found missing once empty, so none is left behind but
    the shared path where a rank that found it there closed last."""
    import threading

    start, opened, errors = threading.Barrier(8), [], []

    def make(rank: int) -> None:
        start.wait()
        try:
            opened.append(FileStorage(tmp_path / "a" / "b" / f"rank{rank:05d}"))
        except Exception as exc:  # noqa: BLE001 - collected for the assertion
            errors.append(exc)

    threads = [threading.Thread(target=make, args=(rank,)) for rank in range(8)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert errors == [] and len(opened) == 8
    for storage in opened:
        storage.close()
    assert not list((tmp_path / "a").rglob("rank*"))


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
    finally:
        original.close()
        rebuilt.close()
    assert isinstance(from_config(HostMemoryStorage().get_config()), HostMemoryStorage)
    with pytest.raises(ValueError, match="'S3Storage' is not a storage backend"):
        from_config({"name": "S3Storage"})


def test_closed_dram_is_reused_by_the_next_backend_and_released_on_request() -> None:
    from asyncckpt.storage import release_memory

    from asyncckpt._memory.pool import POOL

    release_memory()
    first = HostMemoryStorage()
    buf = np.full(3 * PAGE, 7, dtype=np.uint8)
    made, made_s = POOL.faults()
    first.put(0, buf)
    assert POOL.faults()[0] == made + 1 and POOL.faults()[1] > made_s  # faulted in, and timed
    (held,) = first.buffers()
    first.close()
    second = HostMemoryStorage()
    second.put(5, buf)
    assert second.buffers()[0] is held  # no fresh memory faulted in
    assert POOL.faults()[0] == made + 1
    out = np.zeros_like(buf)
    second.get(5, out)
    assert (out == 7).all()
    second.close()
    assert release_memory() == 3 * PAGE
    assert release_memory() == 0


_RELEASED_RUN = """
import json
import numpy as np, psutil
from asyncckpt import ArrayCheckpoint, AsyncCheckpointer
from asyncckpt.storage import release_memory

process = psutil.Process()
state = np.zeros(2**20 // 8)
adjoint = np.zeros_like(state)

class Forward:
    def apply(self, *, t_start, t_end):
        for _ in range(t_start, t_end):
            np.add(state, 1.0, out=state)

class Reverse:
    def apply(self, *, t_start, t_end):
        np.add(adjoint, state, out=adjoint)

base, after = process.memory_info().rss, []
for slots in (3, 4, 5):
    with AsyncCheckpointer(ArrayCheckpoint([state]), Forward(), Reverse(), 400, l1_slots=slots,
                           interval=1) as ckp:
        ckp.apply_forward()
        ckp.apply_reverse()
    release_memory()
    after.append(process.memory_info().rss - base)
print(json.dumps(after))
"""


def test_release_memory_gives_the_dram_back_to_the_operating_system() -> None:
    """Three runs of 400 states of 1 MiB in DRAM (buffers from malloc's heap, under a huge
    page): after each, release_memory() leaves the process within 8 MiB of where it began
    (before, 43, 65 and 128 MiB stayed resident until malloc_trim)."""
    import json
    import subprocess
    import sys

    from conftest import ROOT as root
    done = subprocess.run([sys.executable, "-c", _RELEASED_RUN], capture_output=True,
                          text=True, cwd=root, timeout=300)
    assert done.returncode == 0, done.stderr
    after = json.loads(done.stdout.strip().splitlines()[-1])
    assert max(after) <= 8 * 2**20, [a / 2**20 for a in after]


def test_memory_pool_keeps_at_most_its_limit() -> None:
    from asyncckpt._memory.pool import MemoryPool

    pool = MemoryPool(limit_bytes=10 * PAGE)
    pool.give([np.zeros(4 * PAGE, np.uint8) for _ in range(3)])
    assert pool.nbytes == 8 * PAGE
    assert pool.take(4 * PAGE - 100) is not None  # a page-padded buffer serves too
    assert pool.take(PAGE) is None
    assert pool.release() == 4 * PAGE


def test_memory_pool_makes_buffers_kept_ones_first_and_counts_only_fresh_faults() -> None:
    from asyncckpt._memory.buffers import HUGE_PAGE, aligned_buffer
    from asyncckpt._memory.pool import FAULT_THREADS, MemoryPool

    pool = MemoryPool(limit_bytes=1 << 30)
    kept = aligned_buffer(4 * PAGE)
    pool.give([kept])
    buffers = pool.make(4 * PAGE - 100, 5)  # a page-padded size takes the kept buffer too
    assert buffers[0] is kept and len({id(b) for b in buffers}) == 5
    assert all(b.nbytes == 4 * PAGE and b.ctypes.data % PAGE == 0 and not b.any()
               for b in buffers)
    made, made_s = pool.faults()
    assert made == 4 and made_s > 0 and pool.nbytes == 0
    assert pool.make(PAGE, 0) == [] and pool.faults()[0] == 4
    # huge-page buffers fault in on several threads (where the machine has more than one core)
    assert FAULT_THREADS >= 1
    large = pool.make(HUGE_PAGE + 1, 3)
    assert len({id(b) for b in large}) == 3 and pool.faults()[0] == 7
    assert all(b.nbytes == HUGE_PAGE + PAGE and b.ctypes.data % PAGE == 0 and not b.any()
               for b in large)


class TestTieredStorage(ProjectBackend):
    """DRAM for two states, then a disk file: the suite's states spill across both."""

    def make_storage(self, tmp_path: Path) -> Storage:
        return TieredStorage([HostMemoryStorage(), FileStorage(tmp_path)], [2, None])

    def test_reserve_beyond_the_device_fails_fast_with_numbers(self, tmp_path: Path) -> None:
        storage = TieredStorage([HostMemoryStorage(), FileStorage(tmp_path)], [2, None])
        with pytest.raises(StorageFullError, match=r"\d+(\.\d+)? GiB"):
            storage.reserve(1 << 30, 1 << 20)
        storage.close()

    def test_states_fill_the_tiers_in_order_and_freed_room_is_reused(self, tmp_path: Path) -> None:
        storage = TieredStorage([HostMemoryStorage(), FileStorage(tmp_path)], [2, None])
        try:
            for key in range(5):
                storage.put(key, np.full(300, key, dtype=np.uint8))
            assert [storage.tier_of(k) for k in range(5)] == [0, 0, 1, 1, 1]
            storage.delete(1)
            storage.put(9, np.full(300, 9, dtype=np.uint8))
            assert storage.tier_of(9) == 0 and storage.writes == [3, 3]
            out = np.empty(300, dtype=np.uint8)
            for key in (0, 2, 3, 4, 9):
                storage.get(key, out)
                assert (out == key).all()
        finally:
            storage.close()

    def test_a_bounded_last_tier_refuses_more(self, tmp_path: Path) -> None:
        storage = TieredStorage([HostMemoryStorage()], [1])
        try:
            storage.put(0, np.zeros(10, dtype=np.uint8))
            with pytest.raises(StorageFullError, match="every tier is full"):
                storage.put(1, np.zeros(10, dtype=np.uint8))
            assert 1 not in storage
        finally:
            storage.close()


# -- the probe of Level-2's costs at construction ------------------------------------------------


class Recorded(WrapperStorage):
    """A real backend whose calls are recorded, with room for ``room`` states (a full device
    beyond them)."""

    def __init__(self, inner: Storage, room: int | None = None) -> None:
        super().__init__(inner)
        self.calls: list[tuple[str, int]] = []
        self.held: set[int] = set()
        self.room = room

    def put(self, key: int, data: np.ndarray) -> None:
        if self.room is not None and len(self.held) >= self.room:
            raise StorageFullError(f"no room for a state beside {self.room}")
        self.calls.append(("put", key))
        super().put(key, data)
        self.held.add(key)

    def delete(self, key: int) -> None:
        super().delete(key)
        self.held.discard(key)

    def get(self, key: int, out: np.ndarray) -> None:
        self.calls.append(("get", key))
        super().get(key, out)


def test_a_probe_of_files_writes_a_burst_of_states_then_reads_them(disk_dir) -> None:
    """A device throttled with a small burst allowance serves one state at its own speed and
    several in a row at its cap: files are probed with BURST_STATES in a row."""
    storage = Recorded(FileStorage(disk_dir))
    storage.put(-1, np.ones(3 * PAGE, np.uint8))  # a state the probe must leave alone
    tw, tr = measure_transfer(storage, 3 * PAGE)
    assert tw > 0 and tr > 0
    puts = [key for call, key in storage.calls if call == "put"][1:]
    gets = [key for call, key in storage.calls if call == "get"]
    assert len(puts) == BURST_STATES == len(set(puts)) and -1 not in puts and puts == gets
    assert storage.held == {-1} and -1 in storage
    full = Recorded(FileStorage(disk_dir), room=2)
    assert min(measure_transfer(full, PAGE)) > 0  # the row ends where the device is full
    assert len(full.calls) == 4 and not full.held
    with pytest.raises(StorageFullError):
        measure_transfer(Recorded(FileStorage(disk_dir), room=0), PAGE)
    memory = Recorded(HostMemoryStorage())
    measure_transfer(memory, PAGE)  # in memory: one state at a time, never four held at once
    assert {key for _, key in memory.calls} == {-1} and not memory.held
    for opened in (storage, full, memory):
        opened.close()


def test_every_directory_a_file_storage_makes_is_private_and_removed(tmp_path: Path) -> None:
    import stat as modes

    made = [tmp_path / "sub", tmp_path / "sub" / "deeper", tmp_path / "sub" / "deeper" / "x"]
    backend = FileStorage(made[-1])
    try:
        for directory in made:
            assert modes.S_IMODE(directory.stat().st_mode) == 0o700, directory
    finally:
        backend.close()
    assert list(tmp_path.iterdir()) == []


def test_a_forked_child_does_not_keep_the_parents_level2_file_open(tmp_path: Path) -> None:
    """The file has no name: its space goes with its last descriptor, and a child that kept
    one would hold it after the parent was killed."""
    import subprocess
    import sys

    program = f"""
import os, sys
from asyncckpt import FileStorage
backend = FileStorage({str(tmp_path)!r})
backend.reserve(1 << 20, 4)
mine = os.readlink(f"/proc/self/fd/{{backend.fileno()}}")
pid = os.fork()
if pid == 0:
    held = [os.readlink(f"/proc/self/fd/{{fd}}") for fd in os.listdir("/proc/self/fd")
            if os.path.exists(f"/proc/self/fd/{{fd}}")]
    try:
        backend.put(1, bytearray(16))
        used = "put worked"
    except Exception as exc:
        used = type(exc).__name__
    print(sum(target == mine for target in held), used, flush=True)
    os._exit(0)
os.waitpid(pid, 0)
backend.put(1, __import__("numpy").zeros(16, "uint8"))  # the parent's is untouched
backend.close()
"""
    done = subprocess.run([sys.executable, "-c", program], capture_output=True, text=True,
                          timeout=60)
    assert done.returncode == 0, done.stderr
    held, used = done.stdout.split()
    assert held == "0"
    assert used == "StorageError"


def test_a_file_on_a_ram_backed_filesystem_is_kept_as_pooled_memory(shm_dir: Path) -> None:
    """On tmpfs a closed backend's file is kept for the next backend there, as the pool keeps
    touched DRAM (freed and faulted in anew at every run, a tmpfs tier ran slower than a disk,
    whose file stays in the page cache); it counts as memory available to the next
    checkpointer, and ``release_memory`` gives it back as it gives the pool's buffers."""
    import psutil

    from asyncckpt._memory.pool import POOL
    from asyncckpt._planning.budget import available_memory
    from asyncckpt.storage import release_memory
    from asyncckpt.storage.kept import kept_ram_bytes, ram_backed

    release_files()
    assert ram_backed(os.path.realpath(shm_dir))
    backend = FileStorage(shm_dir)
    backend.reserve(1 << 20, 8)
    backend.close()
    assert kept_ram_bytes() == 8 << 20
    again = FileStorage(shm_dir)
    assert again.nbytes_held == 8 << 20 and kept_ram_bytes() == 0  # the same file, taken
    again.close()
    # counted as available: the system's (read just before and just after) and the file
    low = psutil.virtual_memory().available
    counted = available_memory() - POOL.nbytes
    high = psutil.virtual_memory().available
    assert min(low, high) + (8 << 20) <= counted <= max(low, high) + (8 << 20)
    # given back to the system: the tmpfs has the file's bytes free again (the machine's
    # available memory moves by more than 8 MiB between two reads on a shared machine)
    free = os.statvfs(shm_dir)
    assert release_memory() >= 8 << 20
    after = os.statvfs(shm_dir)
    assert kept_ram_bytes() == 0
    assert (after.f_bfree - free.f_bfree) * after.f_frsize >= 8 << 20


def test_a_kept_file_in_ram_is_cut_to_what_the_next_run_reserves(shm_dir: Path) -> None:
    """A kept tmpfs file larger than the next backend's reservation holds RAM its account
    does not charge: the reservation frees the rest (records in use excepted)."""
    release_files()
    first = FileStorage(shm_dir)
    first.reserve(1 << 20, 16)
    first.close()
    second = FileStorage(shm_dir)
    try:
        assert second.nbytes_held == 16 << 20
        second.reserve(1 << 20, 3)
        assert second.nbytes_held == 3 << 20
        state = np.arange(1 << 17, dtype=np.float64)
        for key in range(3):
            second.put(key, state)
        second.reserve(1 << 20, 1)  # three records in use: none of them is cut
        assert second.nbytes_held == 3 << 20
        out = np.empty_like(state)
        second.get(2, out)
        assert np.array_equal(out, state)
    finally:
        second.close()
        release_files()


def test_an_emptied_file_in_ram_keeps_its_reservation(shm_dir: Path) -> None:
    """A file on tmpfs that holds no state gives back what lies beyond its reservation (the
    probe's state before a plan reserved any), never the reservation: cut to nothing whenever
    the probe's or a run's last state was deleted, every put of the next run faulted its
    record in anew with a fallocate of its own, and the kept file was empty (the LSTM at
    n = 3200: 3202 fallocates a run on tmpfs, one on the disk)."""
    from asyncckpt.storage.kept import kept_ram_bytes

    release_files()
    backend = FileStorage(shm_dir)
    try:
        state = np.arange(1 << 17, dtype=np.float64)
        backend.put(0, state)  # a probe before any reservation
        backend.delete(0)
        assert backend.nbytes_held == 0
        backend.reserve(state.nbytes, 4)
        for run in range(2):
            for key in range(4):
                backend.put(key, state)
            assert os.fstat(backend.fileno()).st_blocks * 512 == 4 << 20
            for key in range(4):
                backend.delete(key)
            assert backend.nbytes_held == 4 << 20, run
            assert os.fstat(backend.fileno()).st_blocks * 512 == 4 << 20
        backend.put(9, state)
        backend.put(10, state)  # beyond the records in use: the reservation's, not new ones
        assert os.fstat(backend.fileno()).st_blocks * 512 == 4 << 20
    finally:
        backend.close()
    assert kept_ram_bytes() == 4 << 20
    release_files()


def test_a_file_storage_fills_its_device_before_it_reports_it_full(small_tmpfs: Path) -> None:
    """Growing the file by a quarter reported the device full with 6 MiB still free, and each
    failed put kept a record."""
    state = np.zeros(1 << 20, np.uint8)
    backend = FileStorage(small_tmpfs)
    try:
        stored = 0
        with pytest.raises(StorageFullError):
            while True:
                backend.put(stored, state)
                stored += 1
        assert stored >= 19  # 20 MiB, less what the filesystem keeps for itself
        for _ in range(3):  # a refused put takes no room: freeing one makes room for one
            with pytest.raises(StorageFullError):
                backend.put(stored, state)
        backend.delete(0)
        backend.put(stored, state)
        with pytest.raises(StorageFullError):
            backend.put(stored + 1, state)
    finally:
        backend.close()
