"""compression=: codecs on the I/O threads, states held at their compressed size, bit-identical
gradients for lossless codecs, error within the bound for lossy ones, corruption caught."""
from __future__ import annotations

import importlib.util
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from asyncckpt import AsyncCheckpointer, CorruptionError, TransferError
from asyncckpt._tuning.auto import AutoPlanner
from asyncckpt._memory.buffers import aligned_buffer, padded
from asyncckpt.checkpoint import check_descriptor
from asyncckpt.compression import (BloscCodec, Codec, CustomCodec, ZfpCodec, make_codec,
                                   parse_compression)
from asyncckpt.errors import InvalidTypeError, InvalidValueError
from asyncckpt.storage import CompressedStorage, FileStorage, HostMemoryStorage, TieredStorage
from asyncckpt.testing import StorageTests
from workloads import (Forward, Leapfrog, Pyramid, RecurrentCell, Reverse, forward_reverse,
                       store_all_reference)

#: what each codec needs: the 'compression' extra (blosc2 for lz4, zstd and blosc; zfpy for zfp)
needs_blosc = pytest.mark.skipif(importlib.util.find_spec("blosc2") is None,
                                 reason="needs the 'compression' extra (blosc2)")
needs_zfp = pytest.mark.skipif(importlib.util.find_spec("zfpy") is None,
                               reason="needs the 'compression' extra (zfpy)")

LOSSLESS = ["lz4", "zstd", {"codec": "blosc", "cname": "zstd", "clevel": 5, "shuffle": "bit"}]


def wavefront(n: int, points: int = 4096) -> Leapfrog:
    """A wave from a pulse in the middle of a quiet grid: most of every state is zeros, as early
    in a seismic run."""
    model = Leapfrog(n, points=points)
    model.init[...] = 0
    middle = points // 2
    model.init[:, middle - 4: middle + 4] = np.hanning(8).astype(model.dtype)
    model.reset()
    return model


def tiers(kind: str, root: Path):
    return {"dram": None, "disk": root, "tmpfs": "/dev/shm", "dram+disk": ["dram", root]}[kind]


def same_bits(got: list[np.ndarray], want: list[np.ndarray]) -> bool:
    return all(a.tobytes() == b.tobytes() for a, b in zip(got, want))


@needs_blosc
@pytest.mark.parametrize("kind", ["dram", "disk", "tmpfs", "dram+disk"])
@pytest.mark.parametrize("codec", LOSSLESS, ids=["lz4", "zstd", "zstd5-bit"])
@pytest.mark.parametrize("make", [wavefront, RecurrentCell, Pyramid],
                         ids=["wavefront", "recurrent", "sizes-differ"])
def test_lossless_codecs_give_store_all_gradients_bit_for_bit(make, codec, kind: str,
                                                              tmp_path: Path) -> None:
    n = 41
    model = make(n)
    reference = store_all_reference(model)
    budget = 12 * padded(check_descriptor(model)) if kind == "dram+disk" else None
    with AsyncCheckpointer(model, Forward(model), Reverse(model), n, l1_slots=2, interval=3,
                           storage=tiers(kind, tmp_path), memory_budget=budget,
                           compression=codec) as ckp:
        for _ in range(2):
            assert same_bits(forward_reverse(model, ckp), reference)
            stats = ckp.stats
            assert stats.l2_writes == 14 and stats.bytes_written > 0
            assert stats.l2_stored_bytes > 0 and stats.compress_s > 0 and stats.decompress_s > 0
            if make is wavefront:
                assert stats.compression_ratio > 4, stats.compression_ratio


@needs_zfp
@pytest.mark.parametrize("kind", ["dram", "disk", "dram+disk"])
@pytest.mark.parametrize("tolerance", [1e-2, 1e-5])
def test_zfp_keeps_every_element_within_its_tolerance_through_every_tier(
        kind: str, tolerance: float, tmp_path: Path) -> None:
    rng = np.random.default_rng(7)
    codec = make_codec({"codec": "zfp", "tolerance": tolerance}, np.float64)
    inner = {"dram": HostMemoryStorage(), "disk": FileStorage(tmp_path),
             "dram+disk": TieredStorage([HostMemoryStorage(), FileStorage(tmp_path)], [1, None])}
    storage = CompressedStorage(inner[kind], codec)
    states = {t: np.cumsum(rng.standard_normal(5000 + 8 * t)) for t in range(3)}  # smooth
    for t, state in states.items():
        storage.put(t, state.view(np.uint8))
    for t, state in states.items():
        out = aligned_buffer(state.nbytes)[: state.nbytes]
        storage.get(t, out)
        error = np.abs(out.view(np.float64) - state)
        assert error.max() <= tolerance, (t, error.max(), tolerance)
        assert error.max() > 0  # lossy indeed: the bound is what is tested
    assert storage.compression.ratio > 1.5
    storage.close()


@needs_zfp
def test_zfp_gradients_approach_store_alls_as_the_tolerance_shrinks() -> None:
    n = 30
    model = RecurrentCell(n, batch=8, hidden=16)
    reference = store_all_reference(model)
    errors = []
    for tolerance in (1e-3, 1e-7, 1e-11):
        with AsyncCheckpointer(model, Forward(model), Reverse(model), n, l1_slots=2, interval=4,
                               compression={"codec": "zfp", "tolerance": tolerance}) as ckp:
            got = forward_reverse(model, ckp)
        errors.append(max(np.linalg.norm(a - b) / np.linalg.norm(b)
                          for a, b in zip(got, reference)))
    assert errors[0] > errors[1] > errors[2] > 0, errors
    assert errors[2] < 1e-6, errors


@needs_blosc
def test_a_budget_holds_more_compressed_states_in_dram_and_never_more_bytes(
        tmp_path: Path) -> None:
    """Room in DRAM for 4 full states: compressed, every Level-2 state of the run fits there,
    and what the DRAM tier holds stays within its byte limit."""
    n = 60
    model = wavefront(n)
    state = padded(check_descriptor(model))
    # slots, staging and prefetch, the codec's I/O thread's buffer and work buffers, DRAM
    budget = (2 + 4 + 4 + 4) * state
    reference = store_all_reference(model)
    held: list[int] = []

    class Watch(Forward):
        """Records what the DRAM tier holds after every forward call."""

        def apply(self, *, t_start: int, t_end: int) -> None:
            super().apply(t_start=t_start, t_end=t_end)
            held.append(ckp.storage.tiers[0].nbytes_held)

    with AsyncCheckpointer(model, Watch(model), Reverse(model), n, l1_slots=2, interval=4,
                           storage=["dram", tmp_path], memory_budget=budget,
                           compression="lz4") as ckp:
        assert ckp.plan.capacities[0] == 4
        assert same_bits(forward_reverse(model, ckp), reference)
        writes = [tier["writes"] for tier in ckp.stats.l2_tiers]
        assert writes == [15, 0], writes  # 15 states where 4 uncompressed ones fit
        assert max(held) <= 4 * state, (max(held), 4 * state)


@needs_blosc
@pytest.mark.parametrize(("options", "codec_buffers"), [
    ({}, 4), ({"io_threads": 2}, 8), ({"on_level2_error": "recompute"}, 8),
    ({"transfers": "inline"}, 4)])
def test_the_budget_counts_the_codecs_buffers(options: dict, codec_buffers: int,
                                              tmp_path: Path) -> None:
    """Each thread that runs the codec holds a buffer for a compressed state and the codec's
    work buffers (3): the I/O threads, and under "recompute" the thread of the
    caller's calls too (its retries and rereads); inline, that thread alone."""
    model = wavefront(20)
    state = padded(check_descriptor(model))
    kwargs = dict(l1_slots=2, interval=4, storage=["dram", tmp_path],
                  memory_budget=(12 + codec_buffers) * state, **options)
    with AsyncCheckpointer(model, Forward(model), Reverse(model), 20, **kwargs) as plain:
        assert plain.plan.capacities[0] == 6 + codec_buffers
    with AsyncCheckpointer(model, Forward(model), Reverse(model), 20, compression="lz4",
                           **kwargs) as compressed:
        assert compressed.plan.capacities[0] == 6


@needs_blosc
@pytest.mark.parametrize("damage", ["flip", "truncate"])
def test_a_damaged_compressed_record_is_a_corruption_error(damage: str) -> None:
    inner = HostMemoryStorage()
    storage = CompressedStorage(inner, make_codec("zstd", np.float32))
    state = np.zeros(50_000, np.float32)
    state[100:200] = np.arange(100)
    storage.put(1, state.view(np.uint8))
    kept = inner.buffers()[0]
    if damage == "flip":
        kept[40] ^= 0xFF
    else:
        kept[:] = 0
    with pytest.raises(CorruptionError, match=r"CompressedStorage.get\(1\): checksum mismatch"):
        storage.get(1, np.empty(state.nbytes, np.uint8))
    storage.close()


class Undecodable(Codec):
    """Stores what it is given, reversed, and cannot read it back."""

    name = "undecodable"

    def encode(self, data: np.ndarray) -> bytes:
        return data[::-1].tobytes()[: data.nbytes // 2]

    def decode(self, packed: np.ndarray, out: np.ndarray) -> None:
        raise ValueError("not a frame")


def test_a_record_that_fails_to_decompress_is_a_corruption_error_on_the_callers_thread() -> None:
    model = RecurrentCell(12)
    level2 = HostMemoryStorage()  # a user's backend: not probed before the run
    ckp = AsyncCheckpointer(model, Forward(model), Reverse(model), 12, l1_slots=1, interval=4,
                            storage=level2, compression=Undecodable())
    with ckp, pytest.raises(TransferError) as caught:
        forward_reverse(model, ckp)
    assert isinstance(caught.value.__cause__, CorruptionError)
    assert "could not decompress" in str(caught.value)
    level2.close()


class FailsOnce(Codec):
    """zlib, whose second read fails to decompress (the first read is of u_n's interval, not
    u_0, which the recompute policy cannot rebuild)."""

    name = "fails-once"

    def __init__(self) -> None:
        self.decodes = 0

    def encode(self, data: np.ndarray) -> bytes:
        import zlib

        return zlib.compress(data)

    def decode(self, packed: np.ndarray, out: np.ndarray) -> None:
        import zlib

        self.decodes += 1
        if self.decodes == 2:
            raise ValueError("not a frame")
        out[:] = np.frombuffer(zlib.decompress(packed), np.uint8)


def test_a_corrupted_read_is_recomputed_under_the_recompute_policy() -> None:
    n = 24
    model = wavefront(n)
    reference = store_all_reference(model)
    level2 = HostMemoryStorage()
    with AsyncCheckpointer(model, Forward(model), Reverse(model), n, l1_slots=1, interval=4,
                           storage=level2, compression=FailsOnce(),
                           on_level2_error="recompute") as ckp:
        assert same_bits(forward_reverse(model, ckp), reference)
        stats = ckp.stats
        assert stats.l2_failures == 1 and stats.l2_reads == stats.l2_writes + 1  # read again
    level2.close()


@needs_blosc
def test_incompressible_states_are_stored_as_they_are() -> None:
    model = RecurrentCell(20, batch=16, hidden=32)  # random doubles: no codec shrinks them
    with AsyncCheckpointer(model, Forward(model), Reverse(model), 20, l1_slots=1, interval=2,
                           compression={"codec": "blosc", "shuffle": None}) as ckp:
        assert same_bits(forward_reverse(model, ckp), store_all_reference(model))
        assert ckp.stats.l2_stored_bytes == ckp.stats.bytes_written


def test_a_custom_pair_runs_like_pyrevolves() -> None:
    import zlib

    model = wavefront(30)
    codec = make_codec({"codec": "custom", "compressor": lambda a: zlib.compress(a.tobytes()),
                        "decompressor": lambda b: np.frombuffer(zlib.decompress(b), np.float32)},
                       np.float32)
    assert isinstance(codec, CustomCodec) and not codec.lossless
    with AsyncCheckpointer(model, Forward(model), Reverse(model), 30, l1_slots=2, interval=3,
                           compression=codec) as ckp:
        assert same_bits(forward_reverse(model, ckp), store_all_reference(model))
        assert ckp.stats.compression_ratio > 4


@pytest.mark.parametrize("spec, message", [
    ("gzip", "compression must be None, 'auto', 'blosc', 'lz4', 'zstd'"),
    ("zfp", "lossy and needs its bound"),
    ({"codec": "snappy"}, "codec must be 'blosc', 'zfp' or 'custom', got 'snappy'"),
    ({"codec": "blosc", "clevel": 12}, r"clevel must be an int in \[0, 9\], got 12"),
    ({"codec": "blosc", "cname": "brotli"}, "cname must be one of"),
    ({"codec": "blosc", "shuffle": "word"}, "shuffle must be 'byte', 'bit' or None"),
    ({"codec": "blosc", "level": 3}, "unexpected keyword argument 'level'"),
    ({"codec": "zfp"}, "exactly one of tolerance, rate or precision"),
    ({"codec": "zfp", "tolerance": 1e-3, "rate": 8}, "exactly one of"),
    ({"codec": "zfp", "tolerance": -1.0}, "tolerance must be a positive number, got -1.0"),
    ({"codec": "zfp", "precision": 0}, r"precision must be an int in \[1, 64\]"),
])
def test_bad_compression_specs_are_refused_by_name(spec: object, message: str) -> None:
    with pytest.raises(InvalidValueError, match=message):
        make_codec(spec, np.float32)


def test_lossy_codecs_need_float_states_and_specs_a_known_type() -> None:
    with pytest.raises(InvalidValueError, match="float32 or float64 states; .* dtype is int32"):
        make_codec({"codec": "zfp", "tolerance": 1e-3}, np.int32)
    with pytest.raises(InvalidTypeError, match="compression must be None, a str, a dict or a "
                                               "Codec, got int"):
        make_codec(3, np.float32)
    with pytest.raises(InvalidTypeError, match="callable compressor"):
        make_codec({"codec": "custom", "compressor": 1, "decompressor": 2}, np.float32)


def test_a_missing_codec_package_names_the_extra_to_install() -> None:
    """In a process where blosc2 and zfpy cannot be imported."""
    code = (
        "import sys\n"
        "sys.modules['blosc2'] = None\n"
        "sys.modules['zfpy'] = None\n"
        "from asyncckpt.compression import make_codec, MissingCodecError\n"
        "for spec in ('lz4', {'codec': 'zfp', 'tolerance': 1e-3}):\n"
        "    try:\n"
        "        make_codec(spec, 'float32')\n"
        "    except MissingCodecError as exc:\n"
        "        assert isinstance(exc, ImportError)\n"
        "        print(exc)\n"
        "import asyncckpt\n"
        "print('blosc2' in sys.modules and sys.modules['blosc2'] is not None)\n")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         check=True).stdout.splitlines()
    assert "needs the blosc2 package" in out[0] and "asyncckpt[compression]" in out[0]
    assert "needs the zfpy package" in out[1] and "asyncckpt[compression]" in out[1]
    assert out[2] == "False"


def test_importing_asyncckpt_imports_no_codec_package() -> None:
    code = ("import sys, asyncckpt, asyncckpt.compat\n"
            "print(any(m in sys.modules for m in ('blosc2', 'zfpy')))\n")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         check=True).stdout.strip()
    assert out == "False"


@pytest.mark.parametrize("text, spec", [
    pytest.param("lz4", "lz4", marks=needs_blosc),
    pytest.param("zfp:tolerance=1e-6", {"codec": "zfp", "tolerance": 1e-6}, marks=needs_zfp),
    pytest.param("blosc:cname=zstd,clevel=3,shuffle=bit",
                 {"codec": "blosc", "cname": "zstd", "clevel": 3, "shuffle": "bit"},
                 marks=needs_blosc),
    pytest.param("blosc:shuffle=none", {"codec": "blosc", "shuffle": None}, marks=needs_blosc),
])
def test_compression_parses_from_text(text: str, spec: object) -> None:
    assert parse_compression("ASYNCCKPT_COMPRESSION", text) == spec
    assert make_codec(spec, np.float32) is not None


@needs_blosc
@needs_zfp
def test_codec_configs_rebuild_the_codec() -> None:
    for codec in (make_codec("zstd", np.float64),
                  make_codec({"codec": "zfp", "rate": 8.0}, np.float32)):
        again = make_codec(codec.get_config())
        assert type(again) is type(codec) and again.get_config() == codec.get_config()
    assert isinstance(make_codec("lz4", np.float64), BloscCodec)
    assert make_codec("lz4", np.float64).typesize == 8
    assert isinstance(make_codec({"codec": "zfp", "precision": 20}, np.float64), ZfpCodec)


@needs_blosc
class TestCompressedDram(StorageTests):
    def make_storage(self, tmp_path: Path) -> CompressedStorage:
        return CompressedStorage(HostMemoryStorage(), make_codec("lz4", np.uint8))


@needs_blosc
class TestCompressedTiers(StorageTests):
    def make_storage(self, tmp_path: Path) -> CompressedStorage:
        return CompressedStorage(TieredStorage([HostMemoryStorage(), FileStorage(tmp_path)],
                                               [2, None]), make_codec("zstd", np.uint8))


@pytest.mark.parametrize("params, lossless", [
    ({"scheme": None}, None),
    pytest.param({"scheme": "blosc", "chunk_size": 1000000}, True, marks=needs_blosc),
    pytest.param({"scheme": "zfp", "tolerance": 1e-9, "parallel": True}, False, marks=needs_zfp),
])
def test_compat_takes_pyrevolves_compression_params(params: dict, lossless: bool | None) -> None:
    from asyncckpt.compat import Revolver

    n = 30
    model = wavefront(n)
    reference = store_all_reference(model)
    # an interval, so that states go to Level-2: "auto" may keep them all in Level-1 slots
    with Revolver(model, Forward(model), Reverse(model), 3, n, interval=3,
                  compression_params=params) as revolver:
        got = forward_reverse(model, revolver)
        storage = revolver.checkpointer.storage
        if lossless is None:
            assert storage.compression is None
        else:
            counters = storage.compression
            assert counters.encoded == n // 3 and \
                counters.encoded_raw_bytes > 2 * counters.encoded_stored_bytes, counters
            assert storage.codec.lossless is lossless
    if lossless is not False:
        assert same_bits(got, reference)
    else:
        for a, b in zip(got, reference):
            assert np.linalg.norm(a - b) <= 1e-5 * np.linalg.norm(b)


@needs_blosc
def test_compat_takes_pyrevolves_custom_pair_and_the_environment(monkeypatch) -> None:
    import zlib

    from asyncckpt.compat import CompressedObject, Revolver

    calls = []

    def compressor(params, array):
        calls.append(params)
        return CompressedObject(zlib.compress(array.tobytes()), shape=array.shape,
                                dtype=array.dtype)

    def decompressor(params, obj):
        return np.frombuffer(zlib.decompress(obj.data), obj.dtype).reshape(obj.shape)

    n = 24
    model = wavefront(n)
    reference = store_all_reference(model)
    params = {"scheme": "custom", "compressor": compressor, "decompressor": decompressor,
              "level": 1}
    with Revolver(model, Forward(model), Reverse(model), 2, n, interval=3,
                  compression_params=params) as revolver:
        assert same_bits(forward_reverse(model, revolver), reference)
        assert len(calls) == n // 3 and calls[0] == {"level": 1}
    monkeypatch.setenv("ASYNCCKPT_COMPRESSION", "blosc:cname=zstd")
    with Revolver(model, Forward(model), Reverse(model), 2, n) as revolver:
        assert same_bits(forward_reverse(model, revolver), reference)
        assert revolver.checkpointer.storage.codec.cname == "zstd"
    with pytest.raises(InvalidValueError, match="scheme must be None, 'blosc', 'zfp' or "
                                                "'custom', got 'lzma'"):
        Revolver(model, Forward(model), Reverse(model), 2, n,
                 compression_params={"scheme": "lzma"})


@needs_blosc
def test_states_of_many_compressed_sizes_leave_no_more_dram_than_was_stored_at_once() -> None:
    """A wave filling its grid: every state compresses to another size. Two runs of storing
    20 and deleting them: the DRAM held never exceeds what the 20 stored took."""
    inner = HostMemoryStorage()
    storage = CompressedStorage(inner, make_codec("lz4", np.float32))
    n = 1 << 16
    states = []
    for t in range(20):
        state = np.zeros(n, np.float32)
        state[: (t + 1) * n // 20] = np.sin(np.arange((t + 1) * n // 20, dtype=np.float32))
        states.append(state)
    peaks = []
    for _ in range(2):
        for t, state in enumerate(states):
            storage.put(t, state.view(np.uint8))
        peaks.append(inner.nbytes_held)
        for t in range(20):
            out = np.empty(n * 4, np.uint8)
            storage.get(t, out)
            assert out.tobytes() == states[t].tobytes()
            storage.delete(t)
        assert inner.nbytes_held <= peaks[-1]
    assert peaks[1] <= peaks[0] < 20 * n * 4
    storage.close()


class SlowDisk(FileStorage):
    """Files on a device of ``bytes_per_s``, each transfer taking the time its bytes need there
    (a network file system, an old disk): where compressing pays."""

    def __init__(self, directory: Path, *, bytes_per_s: float) -> None:
        super().__init__(directory)
        self.bytes_per_s = bytes_per_s

    def put(self, key: int, buf: np.ndarray) -> None:
        time.sleep(buf.nbytes / self.bytes_per_s)
        super().put(key, buf)

    def get(self, key: int, out: np.ndarray) -> None:
        super().get(key, out)
        time.sleep(out.nbytes / self.bytes_per_s)


def auto_runs(model: Any, storage: Any, runs: int) -> list[Any]:
    reference = store_all_reference(model)
    stats = []
    with AsyncCheckpointer(model, Forward(model), Reverse(model), model.n, l1_slots=2,
                           interval="auto", storage=storage, compression="auto") as ckp:
        for _ in range(runs):
            assert same_bits(forward_reverse(model, ckp), reference)
            stats.append(ckp.stats)
    return stats


@needs_blosc
def test_auto_compresses_once_it_has_seen_states_shrink_and_level2_is_slow(
        tmp_path: Path) -> None:
    # 512 KiB states, nearly all zeros, to a device of 10 MB/s: 52 ms per state uncompressed
    # (at 20 MB/s one second run in 40 stayed uncompressed at interval 30, predicted 0.55 s,
    # where compressed runs took 0.36 to 0.51 s: a margin the noise of the first run crossed)
    first, second = auto_runs(wavefront(120, points=1 << 16), SlowDisk(tmp_path,
                                                                       bytes_per_s=10e6), 2)
    # the first run samples the codec on every 8th state and stores the rest as they are
    assert first.calibration["compressed"] is False
    assert 0 < first.encoded_states < first.l2_writes
    assert first.encoded_states == -(-first.l2_writes // 8)  # the 1st, 9th, ...
    assert second.calibration["compressed"] is True
    assert second.encoded_states == second.l2_writes == second.decoded_states
    assert second.compression_ratio > 8
    assert second.calibration["codec"]["stored"] < 0.2


@needs_blosc
def test_auto_declines_where_states_do_not_shrink_and_level2_is_dram() -> None:
    runs = auto_runs(Leapfrog(60, points=1 << 15), None, 3)
    for stats in runs:
        assert stats.calibration["compressed"] is False
        assert 0 < stats.encoded_states < stats.l2_writes  # still sampled, for the next plan
    assert runs[-1].calibration["codec"]["stored"] > 0.9


@needs_blosc
def test_auto_samples_a_long_run_it_declines_on_a_few_states_spread_over_it() -> None:
    # each sample costs a compression beside the compute: a run that moves many states
    # samples about SAMPLES_PER_RUN of them, not every SAMPLE_EVERY-th
    for stats in auto_runs(Leapfrog(2000, points=1 << 12), None, 2):
        assert stats.calibration["compressed"] is False
        assert stats.l2_writes > 8 * AutoPlanner.SAMPLES_PER_RUN
        assert 0 < stats.encoded_states <= AutoPlanner.SAMPLES_PER_RUN + 1


def test_auto_compression_needs_the_models_interval() -> None:
    model = Leapfrog(10)
    with pytest.raises(InvalidValueError, match="compression='auto' .* needs interval='auto' or "
                                                "'adaptive', got interval=3"):
        AsyncCheckpointer(model, Forward(model), Reverse(model), 10, l1_slots=2, interval=3,
                          compression="auto")


@needs_blosc
@needs_blosc
def test_a_compressed_storage_can_run_its_codec_on_every_kth_state() -> None:
    storage = CompressedStorage(HostMemoryStorage(), make_codec("lz4", np.float32))
    storage.compress_every = 3
    state = np.zeros(1 << 16, np.uint8)
    for key in range(8):  # the codec runs on puts 1, 4 and 7
        storage.put(key, state)
    done = storage.compression
    assert (done.states, done.encoded) == (8, 3)
    assert done.stored_bytes == 5 * state.nbytes + done.encoded_stored_bytes
    out = np.ones_like(state)
    for key in range(8):
        storage.get(key, out)
        assert not out.any()
    assert storage.compression.decoded == 3
    storage.compress_every = 3  # the count starts anew: the next put is sampled
    storage.put(8, state)
    assert storage.compression.encoded == 4
    storage.compress_every = 0
    storage.put(9, state)
    assert storage.compression.encoded == 4
    storage.close()
