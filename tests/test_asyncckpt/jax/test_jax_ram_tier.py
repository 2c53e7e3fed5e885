"""Level-2 in RAM under a budget (``storage="dram"``, a tmpfs directory): every segment's first
carry stays within the budget beside what the scan holds, so the plan made while tracing is one
the checkpointer accepts, or the scan is refused then as a MemoryBudgetError naming the bytes
(it was JAX's ``INTERNAL: CpuCallback error`` when the compiled call ran)."""
from __future__ import annotations

import os
import tempfile

import numpy as np
import pytest

# jax.numpy, not jax: without JAX, tests/test_asyncckpt/jax imports as a namespace "jax"

pytest.importorskip("jax.numpy")

jax = pytest.importorskip("jax")
import jax.numpy as jnp  # noqa: E402
from conftest import wait_no_threads  # noqa: E402

from asyncckpt import MemoryBudgetError  # noqa: E402
from asyncckpt.jax import checkpoint_scan, last_plan, last_stats  # noqa: E402
from asyncckpt.planning import state_bytes  # noqa: E402
from asyncckpt.storage import in_host_memory  # noqa: E402

jax.config.update("jax_enable_x64", True)

MiB = 1 << 20
N = 400
#: a tmpfs directory where the machine has one (Linux's /dev/shm)
SHM = "/dev/shm"
TIERS = ["dram"] + ([SHM] if os.path.isdir(SHM) and in_host_memory(SHM) else [])


def step(u, _):
    u = u + 0.01 * jnp.tanh(u)
    return u, jnp.sum(u)


def loss(scan, **options):
    def f(u0):
        final, ys = scan(step, u0, length=N, **options)
        return jnp.sum(final ** 2) + jnp.sum(ys)
    return f


def carry():
    return jnp.asarray(np.random.default_rng(0).standard_normal(MiB // 8))  # 1 MiB


@pytest.mark.parametrize("storage", TIERS)
def test_a_budget_that_holds_no_plan_is_refused_while_tracing_naming_the_bytes(storage) -> None:
    """16 MiB: four carries the scan holds, and a segment's backward beside its carries on
    Level-2 need more than the rest at any interval."""
    u0 = carry()
    compiled = jax.jit(jax.grad(loss(checkpoint_scan, memory_budget="16MiB", storage=storage)))
    with pytest.raises(MemoryBudgetError,
                       match=r"memory_budget of 16777216 bytes holds no plan with Level-2 in RAM.*"
                             r"needs \d+ bytes, \d+ carries of 1048576 bytes"):
        compiled.lower(u0)  # traced, not compiled nor run
    assert wait_no_threads() == []


@pytest.mark.parametrize("storage", TIERS)
def test_a_budget_that_holds_a_plan_runs_every_carry_within_it(storage) -> None:
    """64 MiB: "auto" cuts segments whose first carries the checkpointer keeps beside what the
    scan holds; every segment runs once forward and once back, gradients lax.scan's."""
    u0 = carry()
    ours = jax.jit(jax.grad(loss(checkpoint_scan, memory_budget="64MiB", storage=storage)))(u0)
    plan = last_plan()
    checkpointer_budget = dict(plan.options)["memory_budget"]
    assert plan.segments * state_bytes(MiB) <= checkpointer_budget
    stats = last_stats()
    assert stats.forward_steps == stats.reverse_steps == plan.segments
    assert np.asarray(ours).tobytes() == np.asarray(jax.grad(loss(jax.lax.scan))(u0)).tobytes()
    assert wait_no_threads() == []


def test_a_fixed_interval_whose_carries_do_not_fit_names_those_that_do() -> None:
    u0 = carry()
    with pytest.raises(MemoryBudgetError,
                       match=r"cannot hold interval 2 with Level-2 in RAM.*its 200 carries of "
                             r"1048576 bytes.*the shortest interval that fits is \d+, the longest \d+"):
        jax.jit(jax.grad(loss(checkpoint_scan, memory_budget="64MiB", storage="dram",
                              interval=2))).lower(u0)


@pytest.mark.skipif(in_host_memory(tempfile.gettempdir()),
                    reason="the temporary directory is in RAM")
def test_a_disk_tier_takes_what_the_budget_leaves_out() -> None:
    """The same 16 MiB with the temporary directory beyond DRAM: carries spill, no refusal."""
    u0 = carry()
    ours = jax.jit(jax.grad(loss(checkpoint_scan, memory_budget="16MiB",
                                 storage=["dram", tempfile.gettempdir()])))(u0)
    assert np.asarray(ours).tobytes() == np.asarray(jax.grad(loss(jax.lax.scan))(u0)).tobytes()


@pytest.mark.parametrize("interval", ["auto", 7])
def test_every_plan_with_level2_in_ram_leaves_its_checkpointer_every_carry(interval) -> None:
    """plan_scan over budgets from 1 to 256 MiB: the checkpointer's budget holds a carry per
    segment (what it keeps them in, its least), or the budget is refused naming the bytes."""
    from asyncckpt.jax import Plan, plan_scan
    n, carry = 1000, 64 << 10
    for budget_kib in range(1024, 256 * 1024, 3 * 1024 + 7):
        budget = budget_kib << 10
        try:
            chosen, chunk, checkpointer = plan_scan(
                n, carry, 3 * carry, 1e-4, memory_budget=budget, interval=interval,
                fixed_bytes=4 * carry, level2_in_memory=True)
        except MemoryBudgetError as error:
            assert f"memory_budget of {budget} bytes" in str(error)
            continue
        segments = Plan(n, chosen, chunk, ()).segments
        assert segments * state_bytes(carry) <= checkpointer <= budget
