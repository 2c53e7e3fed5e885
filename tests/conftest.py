"""Shared fixtures: Level-2 locations on tmpfs and on disk, a leak check for every test, and a
watchdog that ends a frozen test's process."""
from __future__ import annotations

import faulthandler
import os
import threading
import time
from pathlib import Path

import pytest

SHM = Path("/dev/shm")
#: this folder (the shared workloads and job scripts), and the project's root
TESTS = Path(__file__).resolve().parent
ROOT = TESTS.parent


#: How long past its own timeout a test may run before its process is ended, every thread's
#: stack printed: pytest-timeout's alarm runs on the main thread, and never runs where a C call
#: that never returns holds the GIL; faulthandler's watchdog needs no GIL.
FROZEN_S = float(os.environ.get("ASYNCCKPT_FROZEN_S", 120))
_STDERR = pytest.StashKey[int]()


def pytest_configure(config: pytest.Config) -> None:
    config.stash[_STDERR] = os.dup(2)


def pytest_unconfigure(config: pytest.Config) -> None:
    os.close(config.stash[_STDERR])


def _timeout(item: pytest.Item) -> float:
    """pytest-timeout's seconds for ``item`` (0: none): its marker's, else --timeout's or
    the ini file's."""
    marker = item.get_closest_marker("timeout")
    if marker is not None and (marker.args or "timeout" in marker.kwargs):
        return float(marker.args[0] if marker.args else marker.kwargs["timeout"])
    return float(item.config.getoption("timeout", None) or item.config.getini("timeout") or 0)


@pytest.hookimpl(wrapper=True)
def pytest_runtest_protocol(item: pytest.Item, nextitem: pytest.Item | None):
    timeout = _timeout(item)
    if timeout > 0:
        faulthandler.dump_traceback_later(timeout + FROZEN_S, exit=True,
                                          file=item.config.stash[_STDERR])
    try:
        return (yield)
    finally:
        faulthandler.cancel_dump_traceback_later()


def asyncckpt_threads() -> list[str]:
    """The library's threads but the reaper, which one process keeps for good (it closes what
    finalizers hand it)."""
    return [t.name for t in threading.enumerate()
            if t.name.startswith("asyncckpt") and t.name != "asyncckpt-reaper"]


def wait_no_threads(timeout: float = 5.0) -> list[str]:
    """Threads named asyncckpt-* still alive after ``timeout`` seconds."""
    deadline = time.monotonic() + timeout
    while asyncckpt_threads() and time.monotonic() < deadline:
        time.sleep(0.01)
    return asyncckpt_threads()


@pytest.fixture
def shm_dir(tmp_path: Path):
    """A fresh directory on tmpfs (a ramdisk), or skip where there is none."""
    if not SHM.is_dir() or not os.access(SHM, os.W_OK):
        pytest.skip("no writable /dev/shm")
    import tempfile

    path = Path(tempfile.mkdtemp(prefix="asyncckpt-test-", dir=SHM))
    yield path
    leftovers = list(path.iterdir())
    for p in leftovers:
        import shutil

        shutil.rmtree(p, ignore_errors=True)
    path.rmdir()
    assert not leftovers, f"files left behind on tmpfs: {leftovers}"


@pytest.fixture
def disk_dir(tmp_path: Path):
    """A fresh directory on the disk filesystem; asserts nothing is left in it afterwards."""
    path = tmp_path / "level2"
    path.mkdir()
    yield path
    leftovers = list(path.iterdir())
    assert not leftovers, f"files left behind on disk: {leftovers}"


@pytest.fixture
def small_tmpfs(tmp_path: Path):
    """A 20 MiB tmpfs of its own (root can mount one; skip where it cannot)."""
    import subprocess

    where = tmp_path / "small"
    where.mkdir()
    done = subprocess.run(["mount", "-t", "tmpfs", "-o", "size=20m", "tmpfs", str(where)],
                          capture_output=True, text=True)
    if done.returncode:
        pytest.skip(f"cannot mount a tmpfs here: {done.stderr.strip()}")
    try:
        yield where
    finally:
        subprocess.run(["umount", str(where)], check=True)


@pytest.fixture(autouse=True)
def no_leaked_threads():
    yield
    assert wait_no_threads() == [], "asyncckpt threads left running"


@pytest.fixture(autouse=True)
def fresh_cost_memory():
    """Every test's "auto" checkpointers start from no remembered costs, whatever ran before."""
    from asyncckpt import cost_memory

    cost_memory.forget()
    yield
    cost_memory.forget()
