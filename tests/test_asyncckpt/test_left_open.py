"""A checkpointer its program never closes: the interpreter's exit closes it and deletes its
Level-2 files, and the garbage collector's finalizer closes it without starting a thread
(a thread started from a finalizer may wait forever for the threading module's locks, and
one started while the interpreter exits never starts)."""
from __future__ import annotations

import subprocess
import sys

import pytest

from conftest import ROOT

_LEFT_OPEN = """
import gc, sys, threading
sys.path.insert(0, "tests")
from workloads import Forward, RecurrentCell, Reverse, forward_reverse
from asyncckpt import AsyncCheckpointer

how, level2 = sys.argv[1], sys.argv[2]
storage = ["dram", level2] if how.endswith("tiers") else level2
model = RecurrentCell(60)
ckp = AsyncCheckpointer(model, Forward(model), Reverse(model), 60, l1_slots=2, interval=5,
                        memory_budget="64KiB" if how.endswith("tiers") else None,
                        storage=storage)
forward_reverse(model, ckp)
if how.startswith("collected"):
    ckp.cycle = ckp  # garbage only the cyclic collector finds
    before = threading.active_count()
    del ckp
    gc.collect()
    assert threading.active_count() <= before, "the finalizer started a thread"
    print("collected", flush=True)
"""


@pytest.mark.parametrize("how", ["exit", "exit-tiers", "collected", "collected-tiers"])
def test_a_checkpointer_left_open_is_closed_and_its_files_deleted(tmp_path, how) -> None:
    level2 = tmp_path / "level2"
    done = subprocess.run([sys.executable, "-c", _LEFT_OPEN, how, str(level2)], cwd=ROOT,
                          capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr[-2000:]
    assert not level2.exists() or not list(level2.iterdir())


_COLLECTED_UNDER_EACH_LOCK = """
import gc, sys, threading, time
sys.path.insert(0, "tests")
from workloads import Forward, RecurrentCell, Reverse, forward_reverse
import asyncckpt
from asyncckpt import AsyncCheckpointer

LOCK_TYPES = (type(threading.Lock()), type(threading.RLock()), threading.Condition)
level2 = sys.argv[1]


def run(path):
    model = RecurrentCell(60)
    ckp = AsyncCheckpointer(model, Forward(model), Reverse(model), 60, l1_slots=2, interval=5,
                            memory_budget="64KiB", storage=["dram", path])
    forward_reverse(model, ckp)
    return ckp


def library_locks(roots):
    # every lock reachable from the roots through the library's own objects and containers
    seen, found, todo = set(), {}, list(roots)
    while todo:
        obj = todo.pop()
        if id(obj) in seen:
            continue
        seen.add(id(obj))
        if isinstance(obj, LOCK_TYPES):
            found[id(obj)] = obj
            continue
        module = getattr(type(obj), "__module__", "") or ""
        if isinstance(obj, (dict, list, tuple, set, frozenset)) or module.startswith("asyncckpt") \\
                or (type(obj).__name__ == "module" and obj.__name__.startswith("asyncckpt")):
            todo.extend(gc.get_referents(obj))
    return list(found.values())


live = run(level2 + "/live")  # its storages' and engine's locks are held in turn too
modules = [m for name, m in sorted(sys.modules.items()) if name.startswith("asyncckpt")]
locks = library_locks([*modules, live])
for k, lock in enumerate(locks):
    path = f"{level2}/{k}"
    ckp = run(path)
    ckp.cycle = ckp  # garbage only the cyclic collector finds
    del ckp
    before = threading.active_count()
    with lock:  # the collector runs the finalizer while this thread holds the lock
        gc.collect()
    assert threading.active_count() <= before, "the finalizer started a thread"
    deadline = time.monotonic() + 30
    import os
    while os.path.exists(path) and os.listdir(path) and time.monotonic() < deadline:
        time.sleep(0.01)
    assert not (os.path.exists(path) and os.listdir(path)), f"not closed: {os.listdir(path)}"
live.close()
print(f"collected under {len(locks)} locks", flush=True)
"""


def test_the_collector_run_inside_any_library_lock_closes_a_checkpointer_left_open(tmp_path):
    """A finalizer takes no lock: the cyclic collector, run while this thread holds each lock
    the library holds (the memory pool's, a storage's, the engine's), hands the unclosed
    checkpointer to the reaper, which closes it once the lock is free (the pool's lock held
    here hung ``MemoryPool.give`` in ``__del__`` forever)."""
    done = subprocess.run([sys.executable, "-c", _COLLECTED_UNDER_EACH_LOCK, str(tmp_path)],
                          cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr[-2000:]
    count = int(done.stdout.split()[2])
    assert count >= 5, done.stdout  # the pool's, the storages', the engine's at least
