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
