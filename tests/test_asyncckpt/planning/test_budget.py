"""memory_budget and tiered Level-2: exact adjoints whatever the split, the budget refused when
it cannot work, and held in a real process."""
from __future__ import annotations

import errno
import importlib.util
import json
import os
import subprocess
import sys
import threading
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from asyncckpt import (AsyncCheckpointer, FileStorage, HostMemoryStorage, MemoryBudgetError,
                       StorageFullError, TransferError, WrapperStorage)
from asyncckpt._memory.buffers import padded
from asyncckpt._planning.options import parse_bytes
from asyncckpt.checkpoint import check_descriptor
from asyncckpt.storage import TieredStorage
from schedules import simulate
from budgeted import run_in_process
from workloads import (Forward, Leapfrog, RecurrentCell, Reverse, forward_reverse,
                       store_all_reference)

MODELS = {"recurrent": RecurrentCell, "leapfrog": Leapfrog}


def assert_bit_identical(got, want) -> None:
    assert all(a.tobytes() == b.tobytes() for a, b in zip(got, want, strict=True))


def tiers_for(kind: str, root: Path):
    return {"dram": None, "dram+disk": ["dram", root], "dram+tmpfs": ["DRAM", "/dev/shm"],
            "objects": [HostMemoryStorage(), FileStorage(root)], "disk": root}[kind]


def test_auto_runs_revolve_in_fixed_slots_where_the_tiers_hold_no_state() -> None:
    """Found by the test below in CI: one fixed slot and the engine's four buffers take the
    whole budget, so the DRAM tier and the tmpfs (RAM, counted in the budget) hold nothing;
    "auto" runs Revolve in the slot alone instead of failing to price an interval."""
    n = 3
    model = Leapfrog(n)
    reference = store_all_reference(model)
    buffer = padded(check_descriptor(model))
    with AsyncCheckpointer(model, Forward(model), Reverse(model), n, l1_slots=1,
                           storage=["DRAM", "/dev/shm"], memory_budget=5 * buffer) as ckp:
        for _ in range(2):
            for a, b in zip(forward_reverse(model, ckp), reference):
                assert a.tobytes() == b.tobytes()
            assert ckp.stats.interval == 0 and ckp.stats.l2_writes == 0


@settings(max_examples=50, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(data=st.data())
def test_budgeted_adjoints_equal_store_all_bit_for_bit(data: st.DataObject, tmp_path: Path) -> None:
    """Random budgets (from one state to all of them), tier lists, intervals and slots: the
    gradients equal store-all's, the schedule run passes the validator, and
    Level-1 and the DRAM tier together never hold more buffers than the budget."""
    model_name = data.draw(st.sampled_from(sorted(MODELS)), label="model")
    n = data.draw(st.integers(1, 50), label="n")
    model = MODELS[model_name](n)
    buffer = padded(check_descriptor(model))
    buffers = data.draw(st.integers(1, n + 6), label="budget in buffers")
    interval = data.draw(st.one_of(st.just("auto"), st.integers(1, n)), label="interval")
    kind = data.draw(st.sampled_from(["dram", "dram+disk", "dram+tmpfs", "objects", "disk"]),
                     label="tiers")
    fixed = data.draw(st.one_of(st.none(), st.integers(1, 4)), label="l1_slots")
    # lz4 where the 'compression' extra is installed (CI installs it)
    codecs = [None] + (["lz4"] if importlib.util.find_spec("blosc2") is not None else [])
    compression = data.draw(st.sampled_from(codecs), label="compression")
    storage = tiers_for(kind, tmp_path)
    reference = store_all_reference(model)
    try:
        ckp = AsyncCheckpointer(model, Forward(model), Reverse(model), n, l1_slots=fixed,
                                interval=interval, storage=storage,
                                memory_budget=buffers * buffer, compression=compression)
    except (ValueError, MemoryBudgetError) as refused:
        # refused only where the budget cannot hold what was asked for (a codec by name whose
        # buffers leave Level-2 no room included)
        assert ("l1_slots=" in str(refused) or "hold" in str(refused)
                or "Level-2 has no room" in str(refused)), refused
        return
    with ckp:
        for _ in range(2):
            got = forward_reverse(model, ckp)
            for a, b in zip(got, reference):
                assert a.tobytes() == b.tobytes()
            counts = simulate(ckp.schedule)
            assert ckp.stats.l2_writes == counts.l2_writes
            held = ckp.stats.l1_peak_slots
            if not ckp.in_level1 and ckp.stats.interval:  # Level-1 alone holds no engine buffers
                held += 4 + (compression is not None)  # staging, prefetch, the codec's buffer
                tiers = ckp.storage.tiers or []
                dram = [i for i, t in enumerate(tiers) if isinstance(t, HostMemoryStorage)]
                if dram:
                    held += _byte_limits(ckp.storage)[dram[0]] // buffer
            assert held <= buffers, (held, buffers)
            if interval == "auto" and fixed is None and ckp.stats.interval:
                # slots beyond an interval's length would do nothing but take the DRAM tier's
                assert ckp.stats.l1_slots <= ckp.stats.interval, ckp.stats


def _byte_limits(storage) -> list:
    """The byte limits of a tiered Level-2, compressed or not."""
    inner = getattr(storage, "inner", storage)
    assert isinstance(inner, TieredStorage)
    return inner.byte_limits


def test_a_budget_too_small_for_dram_level2_spills_everything(tmp_path: Path) -> None:
    """Room for the slots and the engine's buffers only: every Level-2 state goes to disk."""
    n = 40
    model = RecurrentCell(n)
    budget = 6 * padded(check_descriptor(model))  # 4 engine buffers + 2 slots, nothing for DRAM Level-2
    with AsyncCheckpointer(model, Forward(model), Reverse(model), n, l1_slots=2, interval=4,
                           storage=["dram", tmp_path], memory_budget=budget) as ckp:
        got = forward_reverse(model, ckp)
        assert isinstance(ckp.storage, TieredStorage)
        assert ckp.storage.byte_limits[0] == 0 and ckp.storage.writes[0] == 0
        assert ckp.storage.writes[1] == ckp.stats.l2_writes == 10
    for a, b in zip(got, store_all_reference(model)):
        assert a.tobytes() == b.tobytes()


def test_the_default_tiers_are_dram_then_the_temporary_directory() -> None:
    import tempfile

    n = 200
    model = RecurrentCell(n)
    with AsyncCheckpointer(model, Forward(model), Reverse(model), n, interval=2,
                           memory_budget=40 * padded(check_descriptor(model))) as ckp:
        assert isinstance(ckp.storage, TieredStorage)
        assert isinstance(ckp.storage.tiers[0], HostMemoryStorage)
        assert isinstance(ckp.storage.tiers[1], FileStorage)
        assert ckp.storage.tiers[1].path == Path(tempfile.gettempdir())
        assert ckp.l1_slots == 2
        assert ckp.storage.byte_limits[0] == (40 - 4 - 2) * padded(check_descriptor(model))
        forward_reverse(model, ckp)
        assert ckp.storage.writes == [34, 66]


def test_everything_fits_in_the_budget_runs_store_all_in_level1() -> None:
    n = 30
    model = RecurrentCell(n)
    with AsyncCheckpointer(model, Forward(model), Reverse(model), n,
                           memory_budget="1 GiB") as ckp:
        assert ckp.in_level1 and ckp.l1_slots == n - 1
        forward_reverse(model, ckp)
        assert ckp.stats.l2_writes == 0 and ckp.stats.forward_steps == 2 * n - 1


@pytest.mark.parametrize(("budget", "message"), [
    (0, "memory_budget must be a positive size in bytes, got 0"),
    (-1, "memory_budget must be a positive size in bytes, got -1"),
    ("lots", "memory_budget must be a number of bytes, or a size such as '512MiB'"),
    ("12 parsecs", "got '12 parsecs'"),
    (100, "memory_budget of 100 bytes is too small for one state of"),
    (2.5, "memory_budget must be an int"),
])
def test_bad_budgets_are_refused(budget: object, message: str) -> None:
    model = RecurrentCell(10)
    with pytest.raises((ValueError, TypeError), match=message):
        AsyncCheckpointer(model, Forward(model), Reverse(model), 10, memory_budget=budget)


def test_slots_beyond_the_budget_and_neither_given_are_refused() -> None:
    model = RecurrentCell(50)
    with pytest.raises(ValueError, match="give l1_slots .* or both; got neither"):
        AsyncCheckpointer(model, Forward(model), Reverse(model), 50)
    with pytest.raises(ValueError, match="l1_slots=8 does not fit in memory_budget"):
        AsyncCheckpointer(model, Forward(model), Reverse(model), 50, l1_slots=8, interval=5,
                          memory_budget=10 * padded(check_descriptor(model)))
    with pytest.raises(MemoryBudgetError, match="interval 2 keeps 25 states on Level-2"):
        AsyncCheckpointer(model, Forward(model), Reverse(model), 50, l1_slots=2, interval=2,
                          storage="dram", memory_budget=10 * padded(check_descriptor(model)))


@pytest.mark.parametrize(("text", "nbytes"), [
    ("512MiB", 512 * 2**20), ("8GB", 8 * 10**9), ("1.5 GiB", 3 * 2**29), ("4096", 4096),
    (" 2 kib ", 2048), (1 << 20, 1 << 20),
])
def test_budget_sizes_parse(text: object, nbytes: int) -> None:
    assert parse_bytes("memory_budget", text) == nbytes


def budgeted_run(n: int, mib: int, env: dict | None = None, **options) -> dict:
    """The report of :func:`budgeted.run_in_process` of ``n`` states of ``mib`` MiB."""
    done = run_in_process(n, mib * 2**20, env, **options)
    assert done.returncode == 0, done.stderr
    return json.loads(done.stdout.strip().splitlines()[-1])


@pytest.mark.parametrize("n, mib, budget_mib, interval", [
    (200, 2, 48, 1), (60, 8, 48, 10), (60, 8, 48, "auto")])
def test_a_fresh_process_stays_within_its_budget(n: int, mib: int, budget_mib: int,
                                                 interval: int | str, disk_dir: Path) -> None:
    """n states of ``mib`` MiB under a budget of six to 24 states: the peak resident memory
    grows by no more than the budget (plus 4 MiB for the interpreter's own allocations). With
    8 MiB states it grew by 56 MiB under 48: the probe of the DRAM tier left it a spare
    buffer its limit of no states never let go."""
    budget = budget_mib * 2**20
    report = budgeted_run(n, mib, interval=interval, storage=["dram", str(disk_dir)],
                          memory_budget=budget)
    assert report["writes"][1] > 0, report  # it did spill to disk
    growth = report["peak"] - report["base"]
    assert growth <= budget + 4 * 2**20, (growth / 2**20, report)


_PLANS_THAT_CHANGE = """
import json, sys
import numpy as np
from asyncckpt import ArrayCheckpoint, AsyncCheckpointer
from experiments.lstm.worker import peak_rss_bytes, reset_peak_rss

n, budget, disk = 80, 12 * 2**21, sys.argv[1]
state = np.zeros(2**21 // 8)
adjoint, scratch = np.zeros_like(state), np.zeros_like(state)
for array in (state, adjoint, scratch):
    array.fill(0.0)

class Forward:
    def apply(self, *, t_start, t_end):
        for _ in range(t_start, t_end):
            np.sin(state, out=state)

class Reverse:
    def apply(self, *, t_start, t_end):
        np.add(adjoint, np.cos(state, out=scratch), out=adjoint)

reset_peak_rss()
base, plans = peak_rss_bytes(), []
with AsyncCheckpointer(ArrayCheckpoint([state]), Forward(), Reverse(), n, interval="auto",
                       storage=["dram", disk], memory_budget=budget) as ckp:
    # Level-2 priced cheap, then ruinous (Revolve in Level-1 alone), then cheap again
    for cost in (1e-6, 10.0, 1e-6):
        ckp.costs = ckp.costs.replace(tf=1e-3, tf_busy=1e-3, tb=2e-3, tb_busy=2e-3, tcall=0.0,
                                      tcall_busy=0.0, tx=0.0, tq=0.0, tw=cost, tr=cost,
                                      tier_costs=((cost, cost), (cost, cost)))
        state[:] = 0.5
        ckp.apply_forward()
        ckp.apply_reverse()
        plans.append([ckp.stats.interval, ckp.stats.l1_slots, ckp.stats.l1_bytes])
print(json.dumps({"base": base, "peak": peak_rss_bytes(), "plans": plans}))
"""


def test_a_process_whose_plan_changes_between_runs_stays_within_its_budget(
        disk_dir: Path) -> None:
    """Plans of one checkpointer change between runs (an interval, Revolve in Level-1 alone,
    an interval again): Revolve gets every buffer of the budget as a slot, and the slots, the
    engine's buffers and the DRAM tier of one run never add to another's: the peak resident
    memory grows by no more than the budget (24 MiB, plus 4 MiB for the interpreter's own;
    before, 46 MiB: the fault probe's buffers and one plan's stayed beside the next's; and
    Revolve had 8 slots, the budget less the engine's 4)."""
    from conftest import ROOT as root
    done = subprocess.run([sys.executable, "-c", _PLANS_THAT_CHANGE, str(disk_dir)],
                          capture_output=True, text=True, cwd=root, timeout=120)
    assert done.returncode == 0, done.stderr
    report = json.loads(done.stdout.strip().splitlines()[-1])
    first, alone, again = report["plans"]
    assert first[0] > 0 and again[0] > 0, report
    assert alone == [0, 12, 12 * 2**21], report  # every buffer of the budget a slot
    growth = report["peak"] - report["base"]
    assert growth <= 12 * 2**21 + 4 * 2**20, (growth / 2**20, report)


def test_an_interval_plan_leaves_the_slots_it_cannot_use_to_the_dram_tier(tmp_path: Path) -> None:
    # a probe that finds the disk tier cheaper than DRAM (a page cache answering both) once made
    # "auto" keep 389 slots for I = 2, which uses 2, and send 198 states to the disk instead of
    # DRAM: the same schedule, priced a little lower only because the disk looked cheaper
    n = 200
    model = Leapfrog(n)
    buffer = padded(check_descriptor(model))
    reference = store_all_reference(model)
    with AsyncCheckpointer(model, Forward(model), Reverse(model), n, interval="auto",
                           storage=["dram", tmp_path], memory_budget=40 * buffer) as ckp:
        assert ckp.costs is not None
        ckp.costs = ckp.costs.replace(tf=1e-3, tb=3e-3, tcall=0.0, fault_s=None,
                                      tier_costs=((2e-3, 2e-3), (1e-4, 1e-4)))  # DRAM, "cheap" disk
        for got, want in zip(forward_reverse(model, ckp), reference):
            assert got.tobytes() == want.tobytes()
        stats = ckp.stats
    assert stats.interval > 0 and stats.l1_slots <= stats.interval, (stats.interval,
                                                                      stats.l1_slots)
    assert stats.l2_tiers[0]["writes"] >= min(40 - 4 - stats.l1_slots, stats.l2_writes)


class CountingWrapper(WrapperStorage):
    """A user's wrapper around any backend: counts the writes it is given, changes nothing."""

    def __init__(self, inner) -> None:
        super().__init__(inner)
        self.puts = 0
        self.lock = threading.Lock()

    def put(self, key: int, buf) -> None:
        with self.lock:
            self.puts += 1
        super().put(key, buf)


def test_a_wrapper_around_dram_is_bounded_by_the_budget_as_dram(tmp_path: Path) -> None:
    """The budget asks a backend whether it holds process memory instead of reading its class:
    a wrapper around DRAM that the runtime has never heard of is still counted, and the states
    beyond its share go to the disk tier (unbounded, all 100 stayed in DRAM)."""
    n = 200
    model = Leapfrog(n)
    buffer = padded(check_descriptor(model))
    reference = store_all_reference(model)
    dram = CountingWrapper(HostMemoryStorage())
    assert dram.holds_process_memory
    with AsyncCheckpointer(model, Forward(model), Reverse(model), n, l1_slots=4, interval=2,
                           storage=[dram, tmp_path], memory_budget=40 * buffer) as ckp:
        probes = dram.puts  # the construction's probes of each tier's speed
        model.reset()
        ckp.apply_forward()
        assert ckp.l1_bytes + dram.nbytes_held <= 40 * buffer
        assert ckp.plan.capacities[0] == 40 - 4 - 4  # beside 4 slots and 4 engine buffers
        model.reset_adjoint()
        ckp.apply_reverse()
        for got, want in zip(model.gradients(), reference):
            assert got.tobytes() == want.tobytes()
        tiers = ckp.stats.l2_tiers
    assert tiers[0]["writes"] == 40 - 4 - 4 and tiers[1]["writes"] == 100 - tiers[0]["writes"]
    assert dram.puts - probes == tiers[0]["writes"]  # every write went through its put


def test_a_subclass_that_overrides_put_sees_every_write() -> None:
    """HostMemoryStorage keeps a staging buffer as the stored copy without calling put: a
    subclass's put must still see every write, so a failing one reaches the caller."""

    class Full(HostMemoryStorage):
        def put(self, key: int, buf) -> None:
            raise OSError(errno.ENOSPC, "No space left on device")

    class Counting(HostMemoryStorage):
        puts = 0

        def put(self, key: int, buf) -> None:
            Counting.puts += 1
            super().put(key, buf)

    n = 50
    model = Leapfrog(n)
    with AsyncCheckpointer(model, Forward(model), Reverse(model), n, l1_slots=2, interval=5,
                           storage=Full()) as ckp:
        model.reset()
        with pytest.raises(TransferError) as info:
            ckp.apply_forward()
    assert isinstance(info.value.__cause__, OSError)
    reference = store_all_reference(model)
    with AsyncCheckpointer(model, Forward(model), Reverse(model), n, l1_slots=2, interval=5,
                           storage=Counting()) as ckp:
        for got, want in zip(forward_reverse(model, ckp), reference):
            assert got.tobytes() == want.tobytes()
        assert Counting.puts == ckp.stats.l2_writes == 10


def test_the_disk_tier_is_priced_no_lower_than_its_probe_of_states_in_a_row(disk_dir) -> None:
    """The probe wrote a burst of states to the disk tier in a row: what a run that loaded it
    less measures does not lower its price below that; the DRAM tier's may fall."""
    n = 60
    model = Leapfrog(n)
    state = padded(check_descriptor(model))
    with AsyncCheckpointer(model, Forward(model), Reverse(model), n,
                           memory_budget=12 * state, storage=["dram", disk_dir]) as ckp:
        costs = ckp.costs
        assert costs is not None and costs.tier_costs is not None
        probed = costs.tier_costs[1]
        for _ in range(2):
            forward_reverse(model, ckp)
            disk = ckp.costs.tier_costs[1]
            assert disk[0] >= probed[0] and disk[1] >= probed[1]


def test_interval_zero_runs_revolve_in_the_budgets_slots_alone() -> None:
    n = 30
    model = Leapfrog(n)
    reference = store_all_reference(model)
    state = padded(check_descriptor(model))
    with AsyncCheckpointer(model, Forward(model), Reverse(model), n, interval=0,
                           memory_budget=5 * state) as ckp:
        got = forward_reverse(model, ckp)
        assert ckp.l1_slots == 5 and ckp.interval == 0
        assert ckp.stats.l2_writes == 0 and ckp.stats.l1_peak_slots == 5
    assert all(a.tobytes() == b.tobytes() for a, b in zip(got, reference))
    with pytest.raises(ValueError, match=r"interval=0 \(Revolve in Level-1 alone\) needs "
                                         "n_timesteps"):
        AsyncCheckpointer(model, Forward(model), Reverse(model), None, interval=0, l1_slots=2)


@pytest.fixture
def ram_dir():
    """A directory on tmpfs (/dev/shm), removed after the test."""
    import shutil
    import tempfile

    from asyncckpt.storage.kept import ram_backed
    if not Path("/dev/shm").is_dir() or not ram_backed(os.path.realpath("/dev/shm")):
        pytest.skip("no tmpfs at /dev/shm")
    path = Path(tempfile.mkdtemp(dir="/dev/shm", prefix="asyncckpt-test-"))
    yield path
    shutil.rmtree(path, ignore_errors=True)


def test_a_directory_on_tmpfs_is_memory_the_budget_counts(ram_dir: Path, disk_dir: Path) -> None:
    """Level-2 in a tmpfs directory is RAM: under a budget it holds what the budget leaves
    beside the slots and the engine (it held every state beyond the budget: 2.1 GB under
    64 MiB), and beside a DRAM tier it holds nothing; a fixed interval that needs more is
    refused, saying why."""
    n = 200
    model = Leapfrog(n)
    buffer = padded(check_descriptor(model))
    reference = store_all_reference(model)
    with AsyncCheckpointer(model, Forward(model), Reverse(model), n, l1_slots=2, interval=20,
                           storage=ram_dir, memory_budget=20 * buffer) as ckp:
        assert ckp.storage.holds_process_memory
        assert ckp.plan.capacities == (20 - 2 - 4,)
        assert_bit_identical(forward_reverse(model, ckp), reference)
        assert ckp.l1_bytes + ckp.storage.nbytes_held <= 20 * buffer
    with pytest.raises(MemoryBudgetError, match="tmpfs directories included"):
        AsyncCheckpointer(model, Forward(model), Reverse(model), n, l1_slots=2, interval=2,
                          storage=ram_dir, memory_budget=20 * buffer)
    with AsyncCheckpointer(model, Forward(model), Reverse(model), n, l1_slots=2, interval=2,
                           storage=["dram", ram_dir, disk_dir],
                           memory_budget=20 * buffer) as ckp:
        assert ckp.plan.capacities == (20 - 2 - 4, 0, None)
        assert_bit_identical(forward_reverse(model, ckp), reference)
        tiers = ckp.stats.l2_tiers
    assert tiers[1]["writes"] == 0 and tiers[2]["writes"] > 0
    # auto keeps to the budget too, its probe's state in the file included (it stayed there:
    # Revolve in the budget's 20 slots ran beside it, 21 states in RAM)
    with AsyncCheckpointer(model, Forward(model), Reverse(model), n, storage=ram_dir,
                           memory_budget=20 * buffer) as ckp:
        model.reset()
        ckp.apply_forward()
        assert ckp.l1_bytes + ckp.storage.nbytes_held <= 20 * buffer
        model.reset_adjoint()
        ckp.apply_reverse()
        assert_bit_identical(model.gradients(), reference)
        assert ckp.storage.nbytes_held == 0  # an empty file in RAM holds nothing


@pytest.mark.parametrize("interval", ["1", "auto"])
def test_storage_none_without_a_budget_is_bounded_by_the_default(interval: str,
                                                                 disk_dir: Path) -> None:
    """storage=None with l1_slots and no memory_budget: 200 states of 2 MiB (400 MiB) with the
    default bound set to 24 MiB ($ASYNCCKPT_MEMORY_BUDGET): host DRAM holds what the bound
    leaves, the rest goes to the temporary directory, and the peak resident memory grows by
    no more than the bound + 1% + 4 MiB (before, 409 MiB with interval 1: every state in
    DRAM); the adjoint is the same as with everything in DRAM."""
    bound = 24 * 2**20
    given = int(interval) if interval.isdigit() else interval
    bounded, unbounded = [budgeted_run(200, 2, env, l1_slots=2, interval=given)  # storage=None
                          for env in ({"ASYNCCKPT_MEMORY_BUDGET": str(bound),
                                       "TMPDIR": str(disk_dir)}, {})]
    assert bounded["tiers"] == ["HostMemoryStorage", "FileStorage"], bounded
    assert bounded["writes"][1] > 0, bounded  # it did spill to the temporary directory
    growth = bounded["peak"] - bounded["base"]
    assert growth <= 1.01 * bound + 4 * 2**20, (growth / 2**20, bounded)
    assert bounded["adjoint"] == unbounded["adjoint"]


def test_dram_named_where_every_state_fits_the_default_bound_stays_untiered() -> None:
    """Below the default bound a run could not reach it: ``storage="dram"`` stays one DRAM
    backend, whose tiny transfers run inline; a run of unknown length could, so it is tiered.
    ``storage=None`` with ``l1_slots`` alone keeps no state in DRAM (a tier of no room): the
    slots and the engine's buffers are all that stays resident."""
    model = RecurrentCell(50)
    with AsyncCheckpointer(model, Forward(model), Reverse(model), 50, l1_slots=2,
                           interval=5, storage="dram") as ckp:
        assert isinstance(ckp.storage, HostMemoryStorage)
        assert ckp.plan.transfers == "inline"
        assert_bit_identical(forward_reverse(model, ckp), store_all_reference(model))
    for n in (50, None):
        with AsyncCheckpointer(model, Forward(model), Reverse(model), n, l1_slots=2,
                               interval=5, storage="dram" if n is None else None) as ckp:
            assert [type(tier) for tier in ckp.storage.tiers] == [HostMemoryStorage,
                                                                  FileStorage]
            assert ckp.plan.capacities[1] is None
            assert (ckp.plan.capacities[0] == 0) == (n is not None), ckp.plan


def test_plans_fit_the_room_of_a_small_device(small_tmpfs: Path) -> None:
    """States of 1 MiB, n = 200, Level-2 a 20 MiB tmpfs: "auto" plans within the device's room
    (it refused with StorageFullError, "writes 200 states", where a fixed interval of 10 runs),
    and a fixed interval that does not fit is refused naming the least one that does."""
    n = 200
    model = RecurrentCell(n, batch=256, hidden=256)
    assert check_descriptor(model) == 2**20
    reference = store_all_reference(model)
    with AsyncCheckpointer(model, Forward(model), Reverse(model), n, l1_slots=4,
                           storage=small_tmpfs) as ckp:
        assert_bit_identical(forward_reverse(model, ckp), reference)
        room = ckp.storage.room_for(2**20)
        assert 0 < ckp.stats.l2_writes <= room <= 20
    least = -(-n // room)
    with pytest.raises(StorageFullError, match=f"interval 1 writes 200 states .* room for {room}: "
                                               f"interval {least} is the least that fits"):
        AsyncCheckpointer(model, Forward(model), Reverse(model), n, l1_slots=4, interval=1,
                          storage=small_tmpfs)
    with AsyncCheckpointer(model, Forward(model), Reverse(model), n, l1_slots=4,
                           interval=least, storage=small_tmpfs) as ckp:
        assert_bit_identical(forward_reverse(model, ckp), reference)
