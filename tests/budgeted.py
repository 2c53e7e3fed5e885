"""A checkpointer's run in a process of its own, its peak resident memory measured from a
reset once the caller's own arrays (and the modules asked for) are resident: what the budget
tests hold against a bound."""
from __future__ import annotations

import json
import os
import subprocess
import sys

from conftest import ROOT

_RUN = """
import importlib, json, os, stat, sys, threading, time
import numpy as np
import psutil
import asyncckpt.storage
from asyncckpt import ArrayCheckpoint, AsyncCheckpointer
from experiments.lstm.worker import peak_rss_bytes, reset_peak_rss

n, nbytes, options = int(sys.argv[1]), int(sys.argv[2]), json.loads(sys.argv[3])
workload, modules, runs = sys.argv[4], json.loads(sys.argv[5]), int(sys.argv[6])
for module in modules:  # a library's import is code, not state the runtime holds
    importlib.import_module(module)
if "storage_code" in options:  # a backend built by the caller's own code
    options["storage"] = eval(options.pop("storage_code"), vars(asyncckpt.storage))
# outputs= and adjoint= of the sizes asked for: the program's own arrays, resident before the base
extra = {kind: np.zeros(options.pop(f"{kind}_nbytes") // 8) for kind in ("outputs", "adjoint")
         if f"{kind}_nbytes" in options}
for kind, array in extra.items():
    array.fill(1.0)
    options[kind] = ArrayCheckpoint([array])
RAM = {os.stat(p.mountpoint).st_dev for p in psutil.disk_partitions(all=True)
       if p.fstype in ("tmpfs", "ramfs") and os.path.isdir(p.mountpoint)}
tmpfs_peak, held_peak, sampling = 0, 0, True
PAGE = os.sysconf("SC_PAGE_SIZE")

def ram_file_bytes():
    # bytes of RAM-backed files this process holds open (its own nameless files)
    seen = {}
    for fd in os.listdir("/proc/self/fd"):
        try:
            st = os.stat(f"/proc/self/fd/{fd}")
        except OSError:
            continue
        if stat.S_ISREG(st.st_mode) and st.st_dev in RAM:
            seen[st.st_dev, st.st_ino] = st.st_blocks * 512
    if "run_dir" in options and os.path.isdir(options["run_dir"]):  # its files, open or not
        with os.scandir(options["run_dir"]) as entries:
            for entry in entries:
                try:
                    st = entry.stat(follow_symlinks=False)
                except OSError:
                    continue
                if stat.S_ISREG(st.st_mode) and st.st_dev in RAM:
                    seen[st.st_dev, st.st_ino] = st.st_blocks * 512
    return sum(seen.values())

def sample():
    # resident memory and RAM-backed files at the same moment, every millisecond
    global tmpfs_peak, held_peak
    while sampling:
        with open("/proc/self/statm") as statm:
            resident = int(statm.read().split()[1]) * PAGE
        files = ram_file_bytes()
        tmpfs_peak, held_peak = max(tmpfs_peak, files), max(held_peak, resident + files)
        time.sleep(0.001)

sampler = threading.Thread(target=sample, daemon=True)
sampler.start()
state = np.zeros(nbytes // 8)
adjoint, scratch = np.zeros_like(state), np.zeros_like(state)
for array in (state, adjoint, scratch):
    array.fill(0.0)  # the caller's own arrays resident before the base: not the runtime's
if workload == "logistic":  # chaotic: states a codec cannot shrink much
    state[:] = np.random.default_rng(0).uniform(0.1, 0.9, state.size)

class Forward:
    def apply(self, *, t_start, t_end):
        if "outputs" in extra:  # an output a step: the program writes its outputs as it goes
            extra["outputs"][t_start % extra["outputs"].size] = state[0]
        for _ in range(t_start, t_end):
            if workload == "logistic":  # x = 3.9 x (1 - x)
                np.subtract(1.0, state, out=scratch)
                np.multiply(state, scratch, out=state)
                np.multiply(state, 3.9, out=state)
            else:
                np.sin(state, out=state)
                np.add(state, 1.0, out=state)

class Reverse:
    def apply(self, *, t_start, t_end):
        np.add(adjoint, np.cos(state, out=scratch), out=adjoint)

reset_peak_rss()  # from what the process holds now, not from the imports' transient peak
base = peak_rss_bytes()
with AsyncCheckpointer(ArrayCheckpoint([state]), Forward(), Reverse(), n, **options) as ckp:
    for _ in range(runs):
        ckp.apply_forward()
        ckp.apply_reverse()
    tiers = [type(tier).__name__ for tier in ckp.storage.tiers or [ckp.storage]]
    writes = getattr(ckp.storage, "writes", None)
peak = peak_rss_bytes()
sampling = False
sampler.join()
print(json.dumps({"base": base, "peak": peak, "tmpfs_peak": tmpfs_peak,
                  "held_peak": held_peak, "tiers": tiers,
                  "writes": writes, "adjoint": float(adjoint.sum())}))
"""


def run_in_process(n: int, nbytes: int, env: dict | None = None, *, workload: str = "sine",
                   imported: tuple[str, ...] = (), runs: int = 1,
                   **options) -> subprocess.CompletedProcess:
    """A run of ``n`` states of ``nbytes`` bytes in a fresh process, with ``options`` for the
    checkpointer and ``env`` added to its environment (``storage_code``: Python code, run in
    the namespace of :mod:`asyncckpt.storage`, that builds the ``storage=`` backend); its last
    line of stdout is a JSON report of the base and peak resident bytes, the peak bytes of
    RAM-backed files the process held open and of those and its resident memory together
    (sampled every millisecond), the Level-2 tiers, their writes and the adjoint.
    ``workload``: "sine" (x = sin x + 1, smooth) or "logistic" (x = 3.9 x (1 - x)
    from random values, chaotic: states that do not compress well); ``imported``: modules
    imported before the base (a codec's library); ``runs``: forward and reverse sweeps of the
    one checkpointer (whose plan "auto" may revise between them)."""
    return subprocess.run([sys.executable, "-c", _RUN, str(n), str(nbytes),
                           json.dumps(options), workload, json.dumps(list(imported)),
                           str(runs)],
                          capture_output=True, text=True, cwd=ROOT, timeout=300,
                          env={**os.environ, **(env or {})})
