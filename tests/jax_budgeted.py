"""A compiled ``jax.jit(jax.grad(...))`` of ``checkpoint_scan`` in a process of its own: what
compiling it holds, and the peak resident growth of its first and second calls, each from a
reset once the program's own arrays (and what compilation left) are resident."""
from __future__ import annotations

import json
import os
import subprocess
import sys

from conftest import ROOT

_RUN = """
import json, os, sys, threading, time
import numpy as np
import jax, jax.numpy as jnp
jax.config.update("jax_enable_x64", True)
from asyncckpt._memory.pool import trim_heap
from asyncckpt.jax import checkpoint_scan, last_plan
from experiments.lstm.worker import peak_rss_bytes, reset_peak_rss

budget, carry_bytes, n = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
storage = sys.argv[4] if len(sys.argv) > 4 else None
size = carry_bytes // 8
rng = np.random.default_rng(0)
u0 = jnp.asarray(rng.standard_normal(size))
a = jnp.asarray(rng.standard_normal(size) * 0.5)
xs = jnp.asarray(rng.standard_normal(n) * 0.1)
jax.block_until_ready((u0, a, xs))  # the program's own arrays, resident before any base

def loss(a, u0, xs):
    def step(u, x):  # closes over a: its cotangent is summed over every step
        u = u + 0.01 * jnp.tanh(u * a + x)
        return u, jnp.sum(u) * x
    final, ys = checkpoint_scan(step, u0, xs, memory_budget=budget, storage=storage)
    return jnp.sum(final ** 2) + jnp.sum(ys)

def tmpfs():  # the pages of the files this process holds open on /dev/shm (a RAM tier's)
    total = 0
    for fd in os.listdir("/proc/self/fd"):
        try:
            if os.readlink(f"/proc/self/fd/{fd}").startswith("/dev/shm/"):
                total += os.fstat(int(fd)).st_blocks * 512
        except OSError:
            pass
    return total

def anon():  # anonymous resident memory and a tmpfs tier's pages
    with open("/proc/self/status") as status:
        for line in status:
            if line.startswith("RssAnon:"):
                return int(line.split()[1]) * 1024 + tmpfs()

peak, sampling = 0, True
def sample():  # anonymous resident memory every millisecond
    global peak
    while sampling:
        peak = max(peak, anon())
        time.sleep(0.001)
threading.Thread(target=sample, daemon=True).start()

def grown(run):
    global peak
    trim_heap()  # what the heap kept free is not the run's: it faults in its own pages
    time.sleep(0.01)
    reset_peak_rss()
    base = anon()
    peak = base
    result = run()
    time.sleep(0.01)
    return result, peak - base

compiled, compiling = grown(lambda: jax.jit(jax.grad(loss, argnums=(0, 1))).lower(
    a, u0, xs).compile())
own = sum(leaf.nbytes for leaf in (a, u0))  # the gradients the call returns
calls = []
for _ in range(2):
    gradients, growth = grown(lambda: jax.block_until_ready(compiled(a, u0, xs)))
    calls.append(growth - own)
    del gradients
sampling = False
plan = last_plan()
print(json.dumps({"compiling": compiling, "calls": calls, "interval": plan.interval,
                  "chunk": plan.chunk, "checkpointer": dict(plan.options)["memory_budget"],
                  "temp": compiled.memory_analysis().temp_size_in_bytes}))
"""


def run_compiled(budget: str, carry_bytes: int, n: int, storage: str | None = None) -> dict:
    """``jax.jit(jax.grad)`` of a tanh recurrence of ``n`` steps whose carry takes
    ``carry_bytes`` (float64), through ``checkpoint_scan(memory_budget=budget)``, compiled and
    called twice in a fresh process: the report's ``compiling`` is the anonymous resident
    growth of tracing and compiling it, ``calls`` that of each call beyond the gradients it
    returns, ``temp`` XLA's temporaries (``memory_analysis``), with the plan's interval, chunk
    and the checkpointer's budget. ``storage``: Level-2's (a tmpfs tier's pages, of the files
    the process holds open under /dev/shm, are counted with the anonymous memory)."""
    done = subprocess.run([sys.executable, "-c", _RUN, budget, str(carry_bytes), str(n)]
                          + ([] if storage is None else [storage]),
                          capture_output=True, text=True, cwd=ROOT, timeout=300,
                          env=dict(os.environ))
    assert done.returncode == 0, done.stderr[-3000:]
    return json.loads(done.stdout.splitlines()[-1])
