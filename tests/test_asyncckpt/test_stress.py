"""Randomized runs with random delays injected into every Level-2 read and write, a third of
them also losing one transfer (a failed write or read, a flipped byte, a short read) that the
recompute policy must survive.

Zero deadlocks (every run under a timeout), zero wrong adjoints (bit-identical to store-all),
zero leaked threads or files. ``ASYNCCKPT_STRESS_RUNS=5000 pytest -m stress`` runs longer.
"""
from __future__ import annotations

import os
import random
from pathlib import Path

import pytest

from asyncckpt import AsyncCheckpointer
from conftest import wait_no_threads
from faults import FaultyFile, FaultyMemory
from workloads import (Forward, Leapfrog, RecurrentCell, Reverse, forward_reverse,
                       store_all_reference)

RUNS = int(os.environ.get("ASYNCCKPT_STRESS_RUNS", "300"))


@pytest.mark.stress
@pytest.mark.timeout(max(240, RUNS))
def test_randomized_runs_with_random_delays(disk_dir: Path, shm_dir: Path) -> None:
    rng = random.Random(20261122)
    for run in range(RUNS):
        seed = rng.randrange(2**32)
        case = random.Random(seed)
        n = case.randint(1, 30)
        interval = case.randint(1, n)
        slots = case.randint(1, 4)
        staging = case.randint(1, 3)
        model = (RecurrentCell if case.random() < 0.5 else Leapfrog)(n, seed=seed % 1000)
        reference = store_all_reference(model)
        where = case.choice(["memory", "disk", "tmpfs"])
        delay = (0.0, case.choice([0.0, 0.0005, 0.002]))
        # a third of the runs meet one Level-2 fault: a transient failed write or read, a flipped
        # byte, a short read, or a state that can never be written (not u_0)
        fault: dict = {}
        if case.random() < 1 / 3:
            kind = case.choice(["fail_put_at", "fail_get_at", "flip_get_at", "short_get_at",
                                "bad_keys"])
            fault = {kind: case.randint(1, 4)}
            if kind == "bad_keys":  # any interval start but u_0 never reaches Level-2
                fault = {kind: {interval * case.randint(1, max(1, (n - 1) // interval))}}
        storage = (FaultyMemory(delay=delay, seed=seed, **fault) if where == "memory" else
                   FaultyFile(disk_dir if where == "disk" else shm_dir, delay=delay, seed=seed,
                              **fault))
        context = (f"run {run} seed {seed}: n={n} I={interval} s={slots} staging={staging} "
                   f"{where} delay={delay} fault={fault}")
        with AsyncCheckpointer(model, Forward(model), Reverse(model), n, l1_slots=slots,
                               interval=interval, storage=storage, staging_buffers=staging,
                               transfers=case.choice(["background", "background", "inline"]),
                               on_level2_error="recompute") as ckp:
            for _ in range(case.randint(1, 2)):
                got_all = forward_reverse(model, ckp)
                model.trace.check_protocol(n)
                for got, want in zip(got_all, reference):
                    assert got.tobytes() == want.tobytes(), context
        storage.close()
        assert wait_no_threads() == [], context
    assert list(disk_dir.iterdir()) == [] and list(shm_dir.iterdir()) == []
