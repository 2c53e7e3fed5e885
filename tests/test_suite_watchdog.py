"""The suite's own promise: a test frozen where pytest-timeout cannot reach it ends its process
with every thread's stack printed, not a run that waits forever."""
from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path

from conftest import ROOT

FROZEN = '''
import ctypes

import pytest


@pytest.mark.timeout(1)
def test_frozen_with_the_gil_held():
    libc = ctypes.PyDLL(None)  # a PyDLL call keeps the GIL: no signal handler runs meanwhile
    mutex = ctypes.create_string_buffer(64)  # a default pthread mutex, unlocked
    libc.pthread_mutex_lock(mutex)
    libc.pthread_mutex_lock(mutex)  # locked by this thread already: never returns
'''


def test_a_test_frozen_with_the_gil_held_ends_its_run_with_every_threads_stack(
        tmp_path: Path) -> None:
    probe = tmp_path / "test_probe.py"
    probe.write_text(FROZEN)
    env = {**os.environ, "ASYNCCKPT_FROZEN_S": "2", "PYTHONPATH": str(ROOT)}
    began = time.monotonic()
    done = subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider",
                           "-p", "tests.conftest", "-c", str(ROOT / "setup.cfg"),
                           "--rootdir", str(tmp_path), str(probe)],
                          cwd=ROOT, env=env, capture_output=True, text=True, timeout=60)
    took = time.monotonic() - began
    output = done.stdout + done.stderr
    assert done.returncode != 0, output
    assert "Timeout" in output and "in test_frozen_with_the_gil_held" in output, output
    assert took < 30, f"{took:.1f} s: the watchdog should end it 1 + 2 s into the test"
