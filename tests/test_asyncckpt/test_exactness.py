"""Exactness from the source: a state's checksum is taken where it is staged and every later
copy (a retried write included) is checked against it; arrays that cannot be copied as bytes
or written back are refused at construction; a forward step that does not replay (rebound
arrays, hidden state) is caught before a gradient returns."""
from __future__ import annotations

import errno
from pathlib import Path

import numpy as np
import pytest

from asyncckpt import (ArrayCheckpoint, AsyncCheckpointer, FileStorage, HostMemoryStorage,
                       TieredStorage, TransferError)
from asyncckpt.errors import InvalidTypeError, InvalidValueError, UsageError
from asyncckpt.compat import Revolver
from schedules import Advance, EndForward
from workloads import (Forward, Leapfrog, RecurrentCell, Trace, Reverse, forward_reverse,
                       store_all_reference)

pytestmark = pytest.mark.timeout(60)

N, INTERVAL, SLOTS = 40, 4, 2


class DamageThenRaise:
    """A backend whose ``put`` number ``at`` (1-based) writes into its input and then raises."""

    def __init__(self, *args, at: int = 3, **kwargs) -> None:
        super().__init__(*args, **kwargs)
        self.at, self.puts = at, 0

    def put(self, key: int, buf: np.ndarray) -> None:
        self.puts += 1
        if self.puts == self.at:
            buf[: buf.nbytes // 2] ^= 0x5A
            raise OSError(errno.EIO, "Input/output error after a partial write")
        super().put(key, buf)


class DamagingMemory(DamageThenRaise, HostMemoryStorage):
    """DRAM Level-2 whose third put damages its input and fails."""


class DamagingFile(DamageThenRaise, FileStorage):
    """File Level-2 whose third put damages its input and fails."""


def _storages(disk: Path) -> dict:
    return {
        "memory": lambda at: DamagingMemory(at=at),
        "file": lambda at: DamagingFile(disk, at=at),
        "tiers": lambda at: TieredStorage([HostMemoryStorage(), DamagingFile(disk, at=at)],
                                          capacities=[3, None]),
    }


def _driver(model, storage, compat: bool, **options):
    if compat:
        return Revolver(model, Forward(model), Reverse(model), SLOTS, N, storage=storage,
                        interval=INTERVAL, **options)
    return AsyncCheckpointer(model, Forward(model), Reverse(model), N, l1_slots=SLOTS,
                             interval=INTERVAL, storage=storage, **options)


@pytest.mark.parametrize("where", ["memory", "file", "tiers", "compat"])
@pytest.mark.parametrize("at", [1, 3])
@pytest.mark.parametrize("verify", [True, False])
def test_a_put_that_damages_its_buffer_then_fails_is_never_stored_under_a_good_checksum(
        disk_dir: Path, where: str, at: int, verify: bool) -> None:
    model = RecurrentCell(N)
    reference = store_all_reference(model)
    storage = _storages(disk_dir)["memory" if where == "compat" else where](at)
    with _driver(model, storage, where == "compat", verify=verify,
                 on_level2_error="recompute") as ckp:
        try:
            got = forward_reverse(model, ckp)
        except TransferError:
            assert at == 1 and where != "tiers"  # u_0: nothing earlier can rebuild it
            return
        finally:
            ckp.close()
            storage.close()
        assert (ckp.checkpointer if where == "compat" else ckp).stats.l2_failures >= 1
    for mine, want in zip(got, reference):
        assert mine.tobytes() == want.tobytes()


class _Still:
    """Operators that count their calls (and, forward, add one to the state in place)."""

    updates_in_place = True

    def __init__(self, arrays=()) -> None:
        self.arrays, self.calls = arrays, 0

    def apply(self, *, t_start: int, t_end: int) -> None:
        self.calls += 1
        for array in self.arrays:
            array[...] = array + 1


class _Descriptor:
    def __init__(self, stored, restored) -> None:
        self.stored, self.restored = stored, restored
        self.size, self.dtype = sum(a.size for a in stored), stored[0].dtype

    def get_data(self, t):
        return self.stored

    def get_data_location(self, t):
        return self.restored


def _read_only(array: np.ndarray) -> np.ndarray:
    array.flags.writeable = False
    return array


UNCOPYABLE = {
    "object": (lambda: [np.array([1.0, 2.0], dtype=object), np.zeros(1, dtype=object)], None,
               InvalidTypeError, r"dtype object .*cannot be copied as bytes"),
    "object among floats": (lambda: [np.zeros(3), np.array([1.0, 2.0], dtype=object)], None,
                            InvalidTypeError, r"get_data\(0\)\[1\] has dtype object"),
    "read-only get_data": (lambda: [np.zeros(4), _read_only(np.zeros(4))], None,
                           InvalidValueError, r"get_data\(0\)\[1\] is read-only"),
    "read-only location": (lambda: [np.zeros(4)], lambda: [_read_only(np.zeros(4))],
                           InvalidValueError, r"get_data_location\(\d+\)\[0\] is read-only"),
}


@pytest.mark.parametrize("case", UNCOPYABLE)
@pytest.mark.parametrize("in_place", [False, True])
def test_arrays_that_cannot_be_copied_as_bytes_or_written_back_are_refused_at_construction(
        case: str, in_place: bool) -> None:
    stored, restored, error, message = UNCOPYABLE[case]
    arrays = stored()
    descriptor = _Descriptor(arrays, arrays if restored is None else restored())
    fwd, rev = _Still(arrays), _Still()
    fwd.updates_in_place = in_place
    with pytest.raises(error, match=message):
        AsyncCheckpointer(descriptor, fwd, rev, 10, l1_slots=2, interval=3)
    assert fwd.calls == rev.calls == 0
    # pyrevolve's Revolver calls the descriptor as pyrevolve does: built on first use, it
    # checks u_0's arrays before any operator call, and locations at their first load
    with pytest.raises(error, match=message), Revolver(descriptor, fwd, rev, 2, 10,
                                                      interval=3) as revolver:
        revolver.apply_forward()
        assert restored is not None and fwd.calls > 0
        revolver.apply_reverse()
    assert fwd.calls == rev.calls == 0 or restored is not None


def test_an_array_checkpoint_refuses_object_and_read_only_arrays() -> None:
    with pytest.raises(InvalidTypeError, match=r"arrays\[0\] has dtype object"):
        ArrayCheckpoint([np.array([1, "a"], dtype=object)])
    with pytest.raises(InvalidValueError, match=r"arrays\[1\] is read-only"):
        ArrayCheckpoint([np.zeros(2), _read_only(np.zeros(2))])


class Rebinding:
    """a' = 0.9 a + 0.1 b * c, b' = b + 0.05 a^2, with c a coefficient array that never changes;
    from step ``rebind_from`` on, the step binds ``self.b`` to a new array instead of writing
    into it (None: never), and the adjoint reads ``self.b``."""

    def __init__(self, n: int, arrays: int, rebind_from: int | None) -> None:
        rng = np.random.default_rng(7)
        self.n, self.rebind_from = n, rebind_from
        self.a0, self.b0 = rng.standard_normal(6) * 0.5, rng.standard_normal(6) * 0.5
        self.c = rng.standard_normal(6)
        self.a, self.b = self.a0.copy(), self.b0.copy()
        self.held = [self.a, self.b, self.c][:arrays]  # what the descriptor hands out
        self.trace, self.scratch = Trace(), None
        self.reset_adjoint()

    size = property(lambda self: sum(x.size for x in self.held))
    dtype = property(lambda self: self.a.dtype)

    def get_data(self, t: int) -> list[np.ndarray]:
        return self.held

    get_data_location = get_data

    def reset(self) -> None:
        self.held[0][...], self.held[1][...] = self.a0, self.b0
        self.a, self.b = self.held[0], self.held[1]
        self.reset_adjoint()

    def reset_adjoint(self) -> None:
        self.lam_a, self.lam_b = np.ones(6), np.ones(6)

    def step(self, t: int) -> None:
        a_in, b_in = self.a.copy(), self.b.copy()
        self.a[...] = 0.9 * a_in + 0.1 * b_in * self.c
        if self.rebind_from is not None and t >= self.rebind_from:
            self.b = b_in + 0.05 * a_in * a_in
        else:
            self.b[...] = b_in + 0.05 * a_in * a_in
        self.scratch = t, a_in, b_in

    def adjoint(self, t: int) -> None:
        step, a_in, b_in = self.scratch
        assert step == t
        lam_a = 0.9 * self.lam_a + 0.1 * a_in * self.lam_b
        self.lam_b = 0.1 * self.c * self.lam_a + self.lam_b
        self.lam_a = lam_a

    def gradients(self) -> list[np.ndarray]:
        return [self.lam_a.copy(), self.lam_b.copy()]


@pytest.mark.parametrize("arrays", [2, 3])
@pytest.mark.parametrize("rebind_from", [0, 12, 25])
@pytest.mark.parametrize("interval", [1, 4, "adaptive"])
def test_an_operator_that_rebinds_one_array_of_the_state_is_caught_before_a_gradient(
        arrays: int, rebind_from: int, interval) -> None:
    model = Rebinding(N, arrays, rebind_from)
    fwd = Forward(model)
    fwd.updates_in_place = rebind_from > 0  # as the torch and JAX adapters declare
    with AsyncCheckpointer(model, fwd, Reverse(model), N, l1_slots=SLOTS,
                           interval=interval) as ckp:
        # "adaptive" may stretch its intervals to one (a loaded machine): u_{n-1} is
        # compared there
        with pytest.raises(UsageError, match="do not replay|exactly as they were"):
            forward_reverse(model, ckp)


#: plans whose reverse sweep recomputes no state the forward sweep stored, with the steps
#: from which the operator rebinds: a run of one interval, the last interval of several
#: (36 to 39 with interval 4) and Revolve in Level-1 alone
UNSTORED = [(N, 0), (N, 25), (N, 38), (4, 37), (4, 39), (0, 0), (0, 25), (0, 39)]


@pytest.mark.parametrize("arrays", [2, 3])
@pytest.mark.parametrize("interval, rebind_from", UNSTORED)
def test_a_rebound_array_is_caught_where_the_reverse_recomputes_no_stored_state(
        arrays: int, interval: int, rebind_from: int) -> None:
    """The forward sweep checksums u_{n-1} between two calls of its last advance, and the
    reverse sweep compares its recomputation of u_{n-1} with it: a rebound array is a
    UsageError in one-interval runs, the last interval and Level-1 alone too (each gave a
    wrong gradient and no error)."""
    model = Rebinding(N, arrays, rebind_from)
    fwd = Forward(model)
    fwd.updates_in_place = True  # the in-place watch off: the replay check alone
    with AsyncCheckpointer(model, fwd, Reverse(model), N, l1_slots=SLOTS,
                           interval=interval) as ckp:
        with pytest.raises(UsageError, match="do not replay"):
            forward_reverse(model, ckp)
        assert ckp._parts.interpreter.replay.compared == 1


@pytest.mark.parametrize("interval", [N, 4, 0])
@pytest.mark.parametrize("taping", [True, False])
def test_the_last_advance_is_split_only_with_taping(interval: int, taping: bool) -> None:
    """The check costs one more forward call per run (u_{n-1} between two calls of the last
    advance) and one checksum in each sweep, with the exact gradient; a run without taping
    (Leapfrog's) recomputes no state the forward sweep went through between its calls, and
    is called as its schedule says."""
    model = Rebinding(N, 2, None) if taping else Leapfrog(N)
    reference = store_all_reference(model)
    # Level-2 in DRAM, where every write has landed when the reverse sweep compares
    with AsyncCheckpointer(model, Forward(model), Reverse(model), N, l1_slots=SLOTS,
                           interval=interval, taping=taping, keep_trace=True,
                           storage="dram") as ckp:
        got = forward_reverse(model, ckp)
        compared = ckp._parts.interpreter.replay.compared
        actions = ckp.trace
    for mine, want in zip(got, reference):
        assert mine.tobytes() == want.tobytes()
    calls = [("fwd", a.start, a.end) for a in actions if isinstance(a, Advance)]
    last = sum(isinstance(a, Advance) for a in actions[:actions.index(EndForward())]) - 1
    if taping:  # the forward sweep's last call, made two
        calls[last:last + 1] = [("fwd", calls[last][1], N - 1), ("fwd", N - 1, N)]
    assert [call for call in model.trace.calls if call[0] == "fwd"] == calls
    # with taping, the starts of the intervals but the first, and u_{n-1}
    assert compared == (0 if not taping else 1 if interval in (N, 0) else N // interval)


@pytest.mark.parametrize("arrays", [2, 3])
@pytest.mark.parametrize("interval", [1, 4, "auto", 0])
@pytest.mark.parametrize("in_place", [False, True])
def test_a_state_with_an_array_that_never_changes_is_exact_and_not_refused(
        arrays: int, interval, in_place: bool) -> None:
    model = Rebinding(N, arrays, None)
    reference = store_all_reference(model)
    fwd = Forward(model)
    fwd.updates_in_place = in_place
    with AsyncCheckpointer(model, fwd, Reverse(model), N, l1_slots=SLOTS,
                           interval=interval) as ckp:
        for _ in range(2):  # a second run compares with its own forward sweep's checksums
            got = forward_reverse(model, ckp)
            for mine, want in zip(got, reference):
                assert mine.tobytes() == want.tobytes()
        assert ckp._parts.interpreter.replay.compared > 0  # Level-1 alone too
