"""Memory tiers on NUMA nodes: Level-1 bound by ``l1_node``, a Level-2 tier ``"numa:N"``, read
back from the kernel's own account (/proc/self/numa_maps) in the middle of a run; nodes the
machine lacks refused naming those it has; tiers of different measured rates priced apart."""
from __future__ import annotations

import os
import time
from pathlib import Path

import numpy as np
import pytest

from asyncckpt import AsyncCheckpointer, HostMemoryStorage, InvalidValueError
from asyncckpt._memory.numa import check_node, hwloc_tiers, memory_nodes
from asyncckpt.cli import main
from asyncckpt.storage import WrapperStorage
from asyncckpt.testing import StorageTests
from schedules.costs import Costs, Level2Tier
from schedules.model import choose_interval
from workloads import Forward, Leapfrog, Reverse, forward_reverse, store_all_reference

pytestmark = pytest.mark.timeout(60)

NODE = memory_nodes()[0]  # node 0 on a machine of one node


def _libnuma_loads() -> bool:
    try:
        check_node(NODE, "the tests")
    except InvalidValueError:
        return False
    return True


#: tests that bind memory: they need libnuma, which the machines this project runs on have
binds = pytest.mark.skipif(not _libnuma_loads(), reason="libnuma (libnuma.so.1) is missing")


def mappings() -> list[tuple[int, int, str, int]]:
    """Every mapping of this process: (start, end, its NUMA policy, bytes resident on
    :data:`NODE`), from /proc/self/maps (the ranges) and /proc/self/numa_maps (the rest)."""
    ranges = {}
    with open("/proc/self/maps") as maps:
        for line in maps:
            start, end = (int(half, 16) for half in line.split()[0].split("-"))
            ranges[start] = end
    found = []
    with open("/proc/self/numa_maps") as numa_maps:
        for line in numa_maps:
            start, policy, *fields = line.split()
            items = dict(field.split("=", 1) for field in fields if "=" in field)
            page = int(items.get("kernelpagesize_kB", "4")) * 1024
            resident = int(items.get(f"N{NODE}", "0")) * page
            found.append((int(start, 16), ranges.get(int(start, 16), 0), policy, resident))
    return found


def placement(buffers: list[np.ndarray]) -> list[tuple[set[str], int, int]]:
    """For each buffer: the policies of the mappings it lies in, the bytes those hold on
    :data:`NODE`, and its own bytes."""
    table = mappings()
    placed = []
    for buffer in buffers:
        first, last = buffer.ctypes.data, buffer.ctypes.data + buffer.nbytes
        covering = [(policy, resident) for start, end, policy, resident in table
                    if start < last and end > first]
        placed.append(({policy for policy, _ in covering},
                       sum(resident for _, resident in covering), buffer.nbytes))
    return placed


class Snapshot(Forward):
    """The forward operator, which at step ``at`` of the forward sweep reads where the
    checkpointer's buffers are: Level-1 slots (held and free), staging and prefetch buffers,
    and the states Level-2 holds."""

    def __init__(self, model, at: int) -> None:
        super().__init__(model)
        self.at, self.ckp, self.seen = at, None, None

    def apply(self, *, t_start: int, t_end: int) -> None:
        if t_start <= self.at < t_end and self.seen is None:
            parts = self.ckp._parts
            level1 = list(parts.level1.held.values()) + list(parts.level1._free)
            engine = parts.engine.buffers.free_staging + parts.engine.buffers.free_prefetch
            self.seen = {"level1": placement(level1), "engine": placement(engine),
                         "level2": placement(self.ckp.storage.buffers())}
        super().apply(t_start=t_start, t_end=t_end)


def run_and_look(l1_node: int | None, storage: str) -> tuple[dict, bool]:
    model = Leapfrog(60, points=1 << 14)  # states of 128 KiB
    reference = store_all_reference(model)
    forward = Snapshot(model, at=45)
    with AsyncCheckpointer(model, forward, Reverse(model), model.n, l1_slots=3, interval=10,
                           storage=storage, l1_node=l1_node) as ckp:
        forward.ckp = ckp
        gradients = forward_reverse(model, ckp)
    exact = all(np.array_equal(g, r) for g, r in zip(gradients, reference))
    return forward.seen, exact


@binds
def test_level1_and_the_numa_tier_are_bound_to_their_node_in_the_middle_of_a_run():
    seen, exact = run_and_look(NODE, f"numa:{NODE}")
    assert exact, "gradients differ from the store-all reference"
    assert len(seen["level2"]) >= 4, seen  # states 0, 10, 20, 30, 40 were stored by step 45
    assert seen["level1"] and seen["engine"], seen
    for room, placed in seen.items():
        for policies, resident, nbytes in placed:
            assert policies == {f"bind:{NODE}"}, (room, policies)
            assert resident >= nbytes, (room, resident, nbytes)  # its pages on the node


@binds
@pytest.mark.parametrize("l1_node, storage", [(None, "dram"), (NODE, "dram"),
                                              (None, f"numa:{NODE}")],
                         ids=["neither", "level1", "level2"])
def test_only_what_names_a_node_is_bound(l1_node, storage):
    # the check above can fail: without a node, buffers follow the default policy; and a
    # staging buffer Level-2 adopts is exchanged only for one of its own node, so that
    # Level-1 bound and DRAM Level-2 (or the reverse) each keep their memory where it was put
    seen, exact = run_and_look(l1_node, storage)
    assert exact
    bound = {"level1": l1_node is not None, "engine": l1_node is not None,
             "level2": storage != "dram"}
    for room, placed in seen.items():
        assert placed, room
        for policies, _, _ in placed:
            assert any(p.startswith("bind") for p in policies) == bound[room], (room, policies)


@pytest.mark.parametrize("options", [{"l1_node": 3}, {"storage": "numa:3"},
                                     {"storage": ["numa:3", "dram"]}],
                         ids=["l1_node", "tier", "tiers"])
def test_an_absent_node_is_refused_naming_the_nodes_there_are(options):
    model = Leapfrog(8)
    absent = max(memory_nodes()) + 3
    options = {key: (value.replace("3", str(absent)) if isinstance(value, str)
                     else [v.replace("3", str(absent)) for v in value] if isinstance(value, list)
                     else absent) for key, value in options.items()}
    with pytest.raises(InvalidValueError) as error:
        AsyncCheckpointer(model, Forward(model), Reverse(model), model.n, l1_slots=2, **options)
    message = str(error.value)
    assert f"no NUMA node {absent}" in message
    assert f"its nodes: {', '.join(map(str, memory_nodes()))}" in message


def test_a_numa_tier_that_is_no_number_is_refused():
    model = Leapfrog(8)
    with pytest.raises(InvalidValueError, match="'numa:fast'.*'numa:N'"):
        AsyncCheckpointer(model, Forward(model), Reverse(model), model.n, l1_slots=2,
                          storage="numa:fast")


class Slowed(WrapperStorage):
    """A node's memory made slower: every put and get waits ``delay`` seconds first (a far
    node, a CXL expander)."""

    def __init__(self, inner, delay: float) -> None:
        super().__init__(inner)
        self.delay = delay

    def put(self, key, buf):
        time.sleep(self.delay)
        super().put(key, buf)

    def get(self, key, out):
        time.sleep(self.delay)
        super().get(key, out)


@binds
def test_the_model_prices_a_fast_and_a_slow_node_apart():
    model = Leapfrog(200, points=1 << 12)
    fast, slow = HostMemoryStorage(NODE), Slowed(HostMemoryStorage(NODE), delay=0.02)
    try:
        with AsyncCheckpointer(model, Forward(model), Reverse(model), model.n, l1_slots=4,
                               storage=[fast, slow]) as ckp:
            (fast_w, fast_r), (slow_w, slow_r) = ckp.tier_costs
            # each tier measured on its own: the slow one by at least its delay
            assert slow_w >= 0.02 > fast_w and slow_r >= 0.02 > fast_r, ckp.tier_costs
            forward_reverse(model, ckp)  # the compute costs, measured on a run
            costs = ckp.costs
            # what "auto" prices with carries each tier's own rates (the fast one's as the run
            # taught)
            (fast_w, fast_r), (slow_w, slow_r) = costs.tier_costs
            assert slow_w >= 0.02 > fast_w and slow_r >= 0.02 > fast_r, costs.tier_costs
            compute = Costs(tf=costs.tf, tb=costs.tb or costs.tf, tc=costs.tc or 0.0,
                            tcall=costs.tcall or 0.0)

            def price(tier_costs) -> float:
                tiers = [Level2Tier(capacity, tw, tr)
                         for capacity, (tw, tr) in zip([2, None], tier_costs)]
                return choose_interval(model.n, 4, compute, tiers=tiers).prediction.total_s
            # the slow node priced apart from one as fast as the first
            assert price(costs.tier_costs) > price([costs.tier_costs[0]] * 2)
    finally:
        fast.close()
        slow.close()


@binds
@pytest.mark.parametrize("storage", ["{}", ["{}", "TMP"]], ids=["alone", "tiers"])
def test_a_numa_tier_counts_in_the_memory_budget_as_dram_does(storage, tmp_path):
    def spelled(memory: str):
        return (memory if isinstance(storage, str)
                else [memory if tier == "{}" else str(tmp_path) for tier in storage])

    plans = {}
    for memory in ("dram", f"numa:{NODE}"):
        model = Leapfrog(100, points=1 << 12)
        nbytes = model.size * model.dtype.itemsize
        with AsyncCheckpointer(model, Forward(model), Reverse(model), model.n, interval=10,
                               memory_budget=24 * nbytes, storage=spelled(memory)) as ckp:
            assert exact_run(model, ckp)
            plans[memory] = ckp.plan
    dram, numa = plans["dram"], plans[f"numa:{NODE}"]
    assert numa.interval == dram.interval == 10
    assert numa.capacities == dram.capacities and numa.capacities[0] is not None  # bounded
    assert numa.l1_slots == dram.l1_slots
    assert numa.level2[0] == f"HostMemoryStorage(node={NODE})"
    assert numa.level2[1:] == dram.level2[1:]


def exact_run(model, ckp) -> bool:
    reference = store_all_reference(model)
    return all(np.array_equal(g, r) for g, r in zip(forward_reverse(model, ckp), reference))


@binds
def test_the_default_bound_keeps_the_numa_tier_and_spills_beyond_it(monkeypatch):
    model = Leapfrog(100, points=1 << 12)
    nbytes = model.size * model.dtype.itemsize
    monkeypatch.setenv("ASYNCCKPT_MEMORY_BUDGET", str(24 * nbytes))
    with AsyncCheckpointer(model, Forward(model), Reverse(model), model.n, l1_slots=4,
                           interval=10, storage=f"numa:{NODE}") as ckp:
        assert exact_run(model, ckp)
        first, spill = ckp.plan.level2
    assert first == f"HostMemoryStorage(node={NODE})" and spill.startswith("FileStorage(")


@binds
def test_nodes_prints_each_node_with_its_size_and_measured_rates(capsys):
    assert main(["nodes", "--mib", "1", "--repeats", "2"]) == 0
    out = capsys.readouterr().out
    rows = [line.split() for line in out.splitlines()[2:2 + len(memory_nodes())]]
    assert [int(row[0]) for row in rows] == memory_nodes()
    for row in rows:
        size, free, available, write, read = map(float, row[1:6])
        assert size >= available >= free > 0 and write > 0 and read > 0, row


#: what hwloc 2.13's ``lstopo --of xml`` says of a Xeon Max node in flat mode (abridged)
XEON_MAX_XML = """<?xml version="1.0" encoding="UTF-8"?>
<topology version="3.0">
  <object type="Machine" os_index="0">
    <object type="Package" os_index="0">
      <object type="NUMANode" os_index="0" local_memory="134217728000" subtype="DRAM">
        <info name="MemoryTier" value="1"/>
      </object>
      <object type="NUMANode" os_index="2" local_memory="68719476736" subtype="HBM">
        <info name="MemoryTier" value="0"/>
      </object>
    </object>
  </object>
</topology>
"""


def test_hwloc_tier_names_are_read_from_lstopo(tmp_path: Path, monkeypatch):
    assert hwloc_tiers(str(tmp_path / "no-lstopo")) == {}  # absent: no names, no error
    lstopo = tmp_path / "lstopo-no-graphics"
    (tmp_path / "topology.xml").write_text(XEON_MAX_XML)
    lstopo.write_text(f"#!/bin/sh\ncat {tmp_path / 'topology.xml'}\n")
    lstopo.chmod(0o755)
    monkeypatch.setenv("PATH", f"{tmp_path}{os.pathsep}{os.environ['PATH']}")
    assert hwloc_tiers() == {0: "DRAM tier 1", 2: "HBM tier 0"}


@binds
def test_the_torch_scan_takes_l1_node_and_a_numa_tier():
    torch = pytest.importorskip("torch")
    from asyncckpt.torch import checkpoint_scan

    w = torch.tensor(0.9, dtype=torch.float64, requires_grad=True)

    def step(h, x):
        return torch.tanh(h * w + x), None

    xs = torch.linspace(-1, 1, 40 * 3, dtype=torch.float64).reshape(40, 3)
    grads = []
    for options in ({}, {"l1_node": NODE, "storage": f"numa:{NODE}"}):
        final, _ = checkpoint_scan(step, torch.zeros(3, dtype=torch.float64), xs, l1_slots=2,
                                   interval=4, **options)
        (grad,) = torch.autograd.grad(final.sum(), [w])
        grads.append(grad.numpy().tobytes())
    assert grads[0] == grads[1]
    with pytest.raises(InvalidValueError, match=f"its nodes: {NODE}"):
        checkpoint_scan(step, torch.zeros(3, dtype=torch.float64), xs, l1_slots=2,
                        l1_node=max(memory_nodes()) + 3)


@binds
def test_the_jax_scan_takes_l1_node_and_a_numa_tier():
    # jax.numpy, not jax: without JAX, tests/test_asyncckpt/jax imports as a namespace "jax"
    pytest.importorskip("jax.numpy")
    jax = pytest.importorskip("jax")
    import jax.numpy as jnp

    from asyncckpt.jax import checkpoint_scan

    def loss(u0, **options):
        final, _ = checkpoint_scan(lambda u, _: (jnp.tanh(1.1 * u), None), u0, length=60,
                                   interval=6, **options)
        return jnp.sum(final ** 2)

    u0 = jnp.linspace(-1.0, 1.0, 256)
    plain = jax.grad(loss)(u0)
    bound = jax.grad(lambda u: loss(u, l1_node=NODE, storage=f"numa:{NODE}"))(u0)
    assert np.asarray(plain).tobytes() == np.asarray(bound).tobytes()
    with pytest.raises(InvalidValueError, match=f"no NUMA node {max(memory_nodes()) + 3}"):
        jax.grad(lambda u: loss(u, l1_node=max(memory_nodes()) + 3))(u0)  # while tracing


def test_a_missing_libnuma_is_refused_naming_the_nodes_there_are():
    from asyncckpt._memory import numa

    with pytest.raises(InvalidValueError) as error:
        numa._libnuma("libnuma-absent.so.9")
    message = str(error.value)
    assert "needs libnuma (libnuma-absent.so.9)" in message
    assert f"nodes with memory: {', '.join(map(str, memory_nodes()))}" in message


@binds
def test_a_level1_larger_than_its_node_is_refused_before_any_fault(tmp_path):
    from asyncckpt import MemoryBudgetError
    from asyncckpt._memory.numa import node_memory

    model = Leapfrog(10, points=1 << 14)
    nbytes = model.size * model.dtype.itemsize  # 128 KiB: whole pages
    slots = node_memory(NODE).total // nbytes + 1  # more than the node holds
    with pytest.raises(MemoryBudgetError, match=f"on NUMA node {NODE} \\(l1_node={NODE}\\)"):
        AsyncCheckpointer(model, Forward(model), Reverse(model), 10**12, l1_slots=slots,
                          interval=0, memory_budget=2 * slots * nbytes, l1_node=NODE)
    # "auto" may give the whole budget to slots: a budget the node cannot hold is refused
    # unless the slots are fixed
    options = dict(memory_budget=slots * nbytes, storage=str(tmp_path), l1_node=NODE)
    with pytest.raises(MemoryBudgetError, match="fix l1_slots"):
        AsyncCheckpointer(model, Forward(model), Reverse(model), 100, **options)
    AsyncCheckpointer(model, Forward(model), Reverse(model), 100, l1_slots=4, **options).close()


@binds
class TestNumaTier(StorageTests):
    """The shipped conformance suite on a node's memory."""

    def make_storage(self, tmp_path: Path) -> HostMemoryStorage:
        return HostMemoryStorage(NODE)

    def test_its_config_rebuilds_it_on_its_node(self, tmp_path: Path) -> None:
        from asyncckpt.storage import from_config

        storage = self.make_storage(tmp_path)
        assert storage.get_config() == {"name": "HostMemoryStorage", "node": NODE}
        rebuilt = from_config(storage.get_config())
        assert rebuilt.node == NODE and repr(rebuilt) == f"HostMemoryStorage(node={NODE})"
        storage.close()
        rebuilt.close()
