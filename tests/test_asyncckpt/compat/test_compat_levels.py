"""pyrevolve's wider surface in asyncckpt.compat: the leveled revolvers (Revolve in one storage,
H-Revolve over memory and disk), the storages, compression schemes, the profiler, and the switch
that runs a program written for pyrevolve unedited."""
from __future__ import annotations

import os
import subprocess
import sys
import textwrap

import numpy as np
import pytest

from asyncckpt.compat import (BytesStorage, DiskRevolver, DiskStorage, MemoryRevolver,
                              MultiLevelRevolver, NumpyStorage, Profiler, SingleLevelRevolver)
from asyncckpt.compat.compression import (CompressedObject, compressors, compressors_available,
                                          decompressors, init_compression)
from asyncckpt.errors import InvalidValueError, UsageError
from schedules import HRevolve, Level, Revolve, Store, Tier
from workloads import Forward, Leapfrog, RecurrentCell, Reverse, store_all_reference

pyrevolve = pytest.importorskip("pyrevolve")


class Counted:
    """A checkpoint that counts its get_data and get_data_location calls."""

    def __init__(self, model) -> None:
        self.model, self.saves, self.loads = model, 0, 0
        self.size, self.dtype = model.size, model.dtype

    def get_data(self, t):
        self.saves += 1
        return self.model.get_data(t)

    def get_data_location(self, t):
        self.loads += 1
        return self.model.get_data_location(t)


def run(make, model, n: int):
    model.reset()
    model.trace.calls.clear()
    checkpoint = Counted(model)
    revolver = make(checkpoint, Forward(model), Reverse(model))
    revolver.apply_forward()
    model.reset_adjoint()
    revolver.apply_reverse()
    model.trace.check_protocol(n)
    revolver.close()
    return revolver, checkpoint, model.gradients()


def assert_exact(ours, reference) -> None:
    assert len(ours) == len(reference)
    for a, b in zip(ours, reference):
        assert a.tobytes() == b.tobytes()


@pytest.mark.parametrize("n, slots", [(1, 1), (10, 2), (37, 3), (100, 6), (40, 45)])
@pytest.mark.parametrize("where", ["memory", "disk-single", "disk-many", "blosc", "none-scheme"])
def test_single_level_is_revolve_where_pyrevolve_stores(tmp_path, n, slots, where) -> None:
    model = RecurrentCell(n)
    reference = store_all_reference(model)
    options = {"memory": {}, "disk-single": {"diskstorage": True, "filedir": str(tmp_path)},
               "disk-many": {"diskstorage": True, "filedir": str(tmp_path), "singlefile": False},
               "blosc": {"compression_params": {"scheme": "blosc"}},
               "none-scheme": {"compression_params": {"scheme": None}}}[where]
    if where == "blosc" and "blosc" not in compressors_available:
        pytest.skip("blosc2 is not installed")
    revolver, checkpoint, grads = run(
        lambda c, f, r: SingleLevelRevolver(c, f, r, slots, n, **options), model, n)
    assert_exact(grads, reference)
    stores = sum(1 for a in Revolve(n, slots) if isinstance(a, Store))
    assert checkpoint.saves == stores  # one get_data per state stored, as pyrevolve
    assert checkpoint.loads >= checkpoint.saves or n == 1  # n = 1 never reads u_0 back
    kind = {"memory": NumpyStorage, "none-scheme": NumpyStorage, "blosc": BytesStorage}
    assert isinstance(revolver.storage_list[0], kind.get(where, DiskStorage))
    assert os.listdir(tmp_path) == []  # close() removed the disk storage's directory


def test_memory_and_disk_revolvers_store_as_pyrevolve_in_the_forward_sweep(tmp_path) -> None:
    n, slots = 30, 4
    model = Leapfrog(n)
    reference = store_all_reference(model)
    for cls, options in ((MemoryRevolver, {}), (DiskRevolver, {"filedir": str(tmp_path)}),
                         (pyrevolve.MemoryRevolver, {})):
        model.reset()
        checkpoint = Counted(model)
        forward = Forward(model)
        revolver = cls(checkpoint, forward, Reverse(model), slots, n, **options)
        revolver.apply_forward()
        # Revolve's forward sweep stores one state per slot, pyrevolve's and ours
        assert checkpoint.saves == slots and checkpoint.loads == 0
        model.reset_adjoint()
        revolver.apply_reverse()
        assert_exact(model.gradients(), reference)


@pytest.mark.parametrize("n", [1, 2, 9, 40])
@pytest.mark.parametrize("memory, disk, costs", [
    (1, 3, (0, 0, 2, 2)), (2, 10, (1, 1, 5, 5)), (0, 5, (0, 0, 1, 1)), (3, 0, (0, 0, 0, 0))])
def test_multi_level_runs_hrevolve_over_memory_and_disk(tmp_path, n, memory, disk, costs) -> None:
    mwd, mrd, dwd, drd = costs
    model = RecurrentCell(n)
    reference = store_all_reference(model)
    storages = []

    def make(c, f, r):
        storages[:] = [NumpyStorage(c.size, memory, c.dtype, wd=mwd, rd=mrd),
                       DiskStorage(c.size, disk, c.dtype, filedir=str(tmp_path), wd=dwd, rd=drd)]
        return MultiLevelRevolver(c, f, r, n, storage_list=storages, uf=1, ub=2)

    revolver, checkpoint, grads = run(make, model, n)
    assert_exact(grads, reference)
    expected = HRevolve(n, [Level(memory, mwd, mrd), Level(disk, dwd, drd)], reverse_cost=2)
    assert revolver.makespan == expected.makespan
    disk_stores = sum(1 for a in expected if isinstance(a, Store) and a.tier is Tier.L2)
    assert checkpoint.saves == sum(1 for a in expected if isinstance(a, Store))
    assert revolver.storage_ckps(0) == revolver.storage_ckps(1) == []
    assert revolver.ratio >= 0
    if memory == 0 and n > 1:  # one step is reversed from the live u_0, with no store
        assert disk_stores == checkpoint.saves > 0


def test_multi_level_refuses_what_it_cannot_run(tmp_path) -> None:
    model = RecurrentCell(5)
    c = Counted(model)
    storages = [NumpyStorage(c.size, 1, c.dtype)] * 3
    with pytest.raises(InvalidValueError, match="one or two storages, got 3"):
        MultiLevelRevolver(c, Forward(model), Reverse(model), 5, storage_list=storages)
    with pytest.raises(InvalidValueError, match="got None"):
        MultiLevelRevolver(c, Forward(model), Reverse(model), 5, storage_list=None)
    with pytest.raises(InvalidValueError, match="at least one slot"):
        MultiLevelRevolver(c, Forward(model), Reverse(model), 5,
                           storage_list=[NumpyStorage(c.size, 0, c.dtype)])
    revolver = SingleLevelRevolver(c, Forward(model), Reverse(model), 2, 5)
    with pytest.raises(UsageError, match="apply_forward"):
        revolver.apply_reverse()


@pytest.mark.parametrize("kind", ["numpy", "disk", "disk-many", "bytes"])
def test_storages_save_load_and_stack(tmp_path, kind) -> None:
    a, b = np.arange(25.0).reshape(5, 5), np.ones((3, 3))
    size = a.size + b.size
    make = {"numpy": lambda: NumpyStorage(size, 2, np.float64),
            "disk": lambda: DiskStorage(size, 2, np.float64, filedir=str(tmp_path)),
            "disk-many": lambda: DiskStorage(size, 2, np.float64, filedir=str(tmp_path),
                                             singlefile=False),
            "bytes": lambda: BytesStorage(size, 2, np.float64, init_compression({}))}[kind]
    storage = make()
    out_a, out_b = np.empty_like(a), np.empty_like(b)
    storage.save(1, [a + 1, b + 1])
    storage.save(0, [a, b])
    storage.load(1, [out_a, out_b])
    assert np.array_equal(out_a, a + 1) and np.array_equal(out_b, b + 1)
    storage.push([a * 2, b * 2])
    storage.push([a * 3, b * 3])
    assert storage.isFull()
    with pytest.raises(InvalidValueError, match="full stack"):
        storage.push([a, b])
    storage.pop([out_a, out_b])
    assert np.array_equal(out_a, a * 3)
    storage.peek([out_a, out_b])
    assert np.array_equal(out_b, b * 2)
    storage.pop([out_a, out_b])
    assert storage.isEmpty()
    with pytest.raises(InvalidValueError, match="empty stack"):
        storage.pop([out_a, out_b])
    with pytest.raises(InvalidValueError, match="do(es)? not fit"):
        storage.save(0, [a, b, b])
    with pytest.raises(InvalidValueError, match="outside its 2 slots"):
        storage.save(2, [a])
    if kind.startswith("disk"):
        storage.removeDatdir()
        assert os.listdir(tmp_path) == []


def test_storage_load_of_a_key_never_saved() -> None:
    with pytest.raises(InvalidValueError, match="never saved"):
        NumpyStorage(4, 2, np.float32).load(1, [np.empty(4, np.float32)])


@pytest.mark.parametrize("scheme", compressors_available)
def test_compression_schemes_round_trip(scheme) -> None:
    values = np.linspace(0, 1, 1000).reshape(10, 100)
    compress, decompress = init_compression({"scheme": scheme})
    packed = compress(values)
    assert isinstance(packed, CompressedObject)
    restored = decompress(packed)
    if scheme == "zfp":
        assert np.max(np.abs(restored - values)) <= 1e-7
    else:
        assert restored.tobytes() == values.tobytes()
    assert set(compressors) == set(decompressors) >= set(compressors_available)


def test_custom_and_bad_compression_params() -> None:
    calls = []

    def squeeze(params, data):
        calls.append(params["level"])
        return compressors[None](params, data)

    compress, decompress = init_compression(
        {"scheme": "custom", "compressor": squeeze, "decompressor": decompressors[None],
         "level": 3})
    values = np.arange(6.0)
    assert np.array_equal(decompress(compress(values)), values) and calls == [3]
    with pytest.raises(InvalidValueError, match="'lzma'"):
        init_compression({"scheme": "lzma"})
    with pytest.raises(InvalidValueError, match="callable"):
        init_compression({"scheme": "custom"})


def test_profiler_counts_each_action() -> None:
    n = 20
    model = RecurrentCell(n)
    profiler = Profiler()
    run(lambda c, f, r: MemoryRevolver(c, f, r, 3, n, profiler=profiler), model, n)
    assert profiler.counts["reverse"]["reverse"] == n
    assert set(profiler.get_dict()) >= {"forward_advance_timing", "forward_takeshot_counts"}
    assert "reverse" in profiler.summary()


PROGRAM = textwrap.dedent("""
    import numpy as np
    import pyrevolve
    from pyrevolve import MultiLevelRevolver, Revolver, NumpyStorage, DiskStorage
    from pyrevolve.compression import init_compression
    import workloads

    n = 25
    model = workloads.RecurrentCell(n)
    reference = workloads.store_all_reference(model)
    for name in ("multi", "revolver"):
        model.reset()
        c = model
        if name == "multi":
            storages = [NumpyStorage(c.size, 2, c.dtype), DiskStorage(c.size, 4, c.dtype, wd=2, rd=2)]
            rev = MultiLevelRevolver(c, workloads.Forward(model), workloads.Reverse(model), n,
                                     storage_list=storages)
        else:
            rev = Revolver(c, workloads.Forward(model), workloads.Reverse(model), 3, n)
        rev.apply_forward()
        model.reset_adjoint()
        rev.apply_reverse()
        assert all(a.tobytes() == b.tobytes() for a, b in zip(model.gradients(), reference))
    print(pyrevolve.__name__, type(rev).__module__)
""")


def test_an_unedited_pyrevolve_program_runs_on_asyncckpt(tmp_path) -> None:
    program = tmp_path / "program.py"
    program.write_text(PROGRAM)
    from conftest import TESTS
    tests = str(TESTS)
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([tests, os.environ.get("PYTHONPATH", "")])}
    done = subprocess.run([sys.executable, "-m", "asyncckpt.compat", str(program)], cwd=tmp_path,
                          env=env, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr
    assert done.stdout.split() == ["asyncckpt.compat", "asyncckpt.compat._revolver"]
    assert os.listdir(tmp_path) == ["program.py"]  # the disk storage left nothing behind
    usage = subprocess.run([sys.executable, "-m", "asyncckpt.compat"], capture_output=True,
                           text=True, timeout=60)
    assert usage.returncode == 2 and "usage" in usage.stderr


def test_install_and_uninstall() -> None:
    import asyncckpt.compat as compat

    before = sys.modules.get("pyrevolve")
    with pytest.warns(RuntimeWarning, match="after pyrevolve was imported"):
        assert compat.install() is compat
    try:
        import pyrevolve as switched
        from pyrevolve.storage import DiskStorage as Switched

        assert switched is compat and Switched is DiskStorage
    finally:
        compat.uninstall()
    assert sys.modules.get("pyrevolve") is before
