"""The device path on a real CUDA device through CuPy (and torch tensors, where torch is
installed): skipped unless CuPy sees a device. The same path runs in CI on the CPU stand-in
(test_device.py)."""
from __future__ import annotations

import numpy as np
import pytest

from asyncckpt import AsyncCheckpointer
from asyncckpt.devices.base import word_digest
from asyncckpt.storage import PinnedMemoryStorage
from device_workloads import assert_level2_corruption_caught, digest_on

cupy = pytest.importorskip("cupy")
try:
    DEVICES = cupy.cuda.runtime.getDeviceCount()
except Exception:  # noqa: BLE001 - no driver, no device
    DEVICES = 0
pytestmark = pytest.mark.skipif(DEVICES == 0, reason="CuPy sees no CUDA device")


class Ops:
    """The few array operations the wave needs, for CuPy or torch."""

    def __init__(self, kind: str) -> None:
        self.kind = kind
        if kind == "torch":
            import torch

            self.torch = torch

    def array(self, values: np.ndarray):
        if self.kind == "torch":
            return self.torch.as_tensor(values, device="cuda")
        return cupy.asarray(values)

    def roll(self, x, shift: int):
        return self.torch.roll(x, shift) if self.kind == "torch" else cupy.roll(x, shift)

    def copy(self, x):
        return x.clone() if self.kind == "torch" else x.copy()

    def host(self, x) -> np.ndarray:
        return x.cpu().numpy().copy() if self.kind == "torch" else cupy.asnumpy(x)

    def synchronize(self) -> None:
        if self.kind == "torch":
            self.torch.cuda.synchronize()
        else:
            cupy.cuda.Device().synchronize()


class Wave:
    """Leapfrog wave of tests/workloads.py on the device: u_t = (u^t, u^{t-1}) in a circular
    buffer of three levels; valid with and without taping."""

    def __init__(self, ops: Ops, n: int, points: int = 4096) -> None:
        rng = np.random.default_rng(1)
        self.ops, self.n, self.k, self.coef = ops, n, 0.05, 0.2
        self.levels = ops.array(np.zeros((3, points), np.float32))
        self.init = ops.array(rng.standard_normal((2, points)).astype(np.float32) * 0.5)
        self.size, self.points = 2 * points, points
        self.dtype = np.dtype(np.float32)
        self.reset()

    def get_data(self, t: int) -> list:
        return [self.levels[t % 3], self.levels[(t - 1) % 3]]

    get_data_location = get_data

    def reset(self) -> None:
        self.levels[...] = 0
        self.levels[0] = self.init[0]
        self.levels[2] = self.init[1]
        self.reset_adjoint()

    def reset_adjoint(self) -> None:
        ones = np.ones(self.points, np.float32)
        self.adj_cur = self.ops.array(ones)
        self.adj_prev = self.ops.array(0 * ones)
        self.grad_k = self.ops.array(np.zeros((), np.float32))

    def lap(self, u):
        return self.ops.roll(u, 1) - 2 * u + self.ops.roll(u, -1)

    def step(self, t: int) -> None:
        cur, prev = self.levels[t % 3], self.levels[(t - 1) % 3]
        self.levels[(t + 1) % 3] = 2 * cur - prev + self.coef * self.lap(cur) - self.k * cur ** 3

    def adjoint(self, t: int) -> None:
        u_t, a = self.levels[t % 3], self.adj_cur
        self.grad_k = self.grad_k - (a * u_t ** 3).sum()
        new = self.adj_prev + 2 * a + self.coef * self.lap(a) - 3 * self.k * u_t ** 2 * a
        self.adj_prev, self.adj_cur = -a, new

    def gradients(self) -> list[np.ndarray]:
        self.ops.synchronize()
        return [self.ops.host(x) for x in (self.adj_cur, self.adj_prev, self.grad_k)]


class Fwd:
    def __init__(self, w: Wave) -> None:
        self.w = w

    def apply(self, *, t_start: int, t_end: int) -> None:
        for t in range(t_start, t_end):
            self.w.step(t)


class Rev:
    def __init__(self, w: Wave) -> None:
        self.w = w

    def apply(self, *, t_start: int, t_end: int) -> None:
        self.w.adjoint(t_start)


def store_all(w: Wave) -> list[np.ndarray]:
    """Every state kept on the device, each reverse step after its taping step."""
    w.reset()
    states = []
    for t in range(w.n):
        states.append([w.ops.copy(a) for a in w.get_data(t)])
        w.step(t)
    for t in range(w.n - 1, -1, -1):
        for dst, src in zip(w.get_data(t), states[t]):
            dst[...] = src
        w.step(t)
        w.adjoint(t)
    return w.gradients()


def run(w: Wave, **kwargs) -> tuple[list[np.ndarray], AsyncCheckpointer]:
    with AsyncCheckpointer(w, Fwd(w), Rev(w), w.n, **kwargs) as ckp:
        w.reset()
        ckp.apply_forward()
        w.reset_adjoint()
        ckp.apply_reverse()
        return w.gradients(), ckp


def same(got: list[np.ndarray], want: list[np.ndarray]) -> bool:
    return all(g.tobytes() == w.tobytes() for g, w in zip(got, want))


@pytest.mark.parametrize("interval", [1, 7, "auto", "adaptive"])
@pytest.mark.parametrize("taping", [True, False])
def test_cupy_adjoint_is_bitwise_store_all(interval, taping, tmp_path):
    w = Wave(Ops("cupy"), 120)
    want = store_all(w)
    for storage in (None, [PinnedMemoryStorage(), str(tmp_path)]):
        got, ckp = run(w, l1_slots=3, interval=interval, taping=taping, storage=storage)
        assert same(got, want), (interval, taping, storage)
        assert ckp.stats.device.startswith("cuda")
        if isinstance(storage, list):
            storage[0].close()


def test_torch_tensors_through_dlpack():
    torch = pytest.importorskip("torch")
    if not torch.cuda.is_available():
        pytest.skip("torch sees no CUDA device")
    w = Wave(Ops("torch"), 90)
    w.dtype = torch.float32  # a torch dtype works as the descriptor's dtype too
    want = store_all(w)
    got, ckp = run(w, l1_slots=2, interval=5)
    assert same(got, want)
    got, _ = run(w, l1_slots=2, interval="auto", taping=False)
    assert same(got, want)


def test_device_memory_is_flat_in_n():
    pool = cupy.get_default_memory_pool()
    held, used = {}, {}
    for n in (100, 2000):
        w = Wave(Ops("cupy"), n, points=1 << 18)
        run(w, l1_slots=4, interval=10)  # warm the pool
        base = pool.used_bytes()
        _, ckp = run(w, l1_slots=4, interval=10)
        held[n], used[n] = ckp.stats.device_bytes, pool.used_bytes() - base
        del w, ckp  # its operators hold the wave's arrays: free them before the next base
    assert held[100] == held[2000] > 0
    assert used[100] == used[2000]


def test_no_host_synchronisation_per_store():
    """Each step queues 20 ms of device work; the host calls the last forward step long
    before the device has run the second: no store waited for the device. (A store costs the
    host about 0.5 ms of calls, so shorter steps would let the device catch up.)"""
    spin = cupy.RawKernel(r'''
    extern "C" __global__ void spin(long long cycles) {
        long long start = clock64();
        while (clock64() - start < cycles) {}
    }''', "spin")
    rate = cupy.cuda.Device().attributes["ClockRate"] * 1e3  # Hz
    w = Wave(Ops("cupy"), 24)
    seen = {}

    class Slow(Fwd):
        def apply(self, *, t_start, t_end):
            for t in range(t_start, t_end):
                spin((1,), (1,), (np.int64(20e-3 * rate),))
                w.step(t)
                if t == 1:
                    seen["first"] = cupy.cuda.Event()
                    seen["first"].record()
                if t == w.n - 1:
                    seen["done_at_last_call"] = seen["first"].done

    with AsyncCheckpointer(w, Slow(w), Rev(w), w.n, l1_slots=2, interval=1,
                           staging_buffers=w.n) as ckp:
        w.reset()
        cupy.cuda.Device().synchronize()
        ckp.apply_forward()
        assert ckp.stats.l2_writes == w.n - 1  # at I = 1, u_{n-1} stays in Level-1
        w.reset_adjoint()
        ckp.apply_reverse()
    assert seen["done_at_last_call"] is False


def test_level2_is_page_locked():
    w = Wave(Ops("cupy"), 40)
    with AsyncCheckpointer(w, Fwd(w), Rev(w), 40, l1_slots=2, interval=4) as ckp:
        w.reset()
        ckp.apply_forward()
        assert isinstance(ckp.storage, PinnedMemoryStorage)
        assert all(ckp.device.is_pinned(b) for b in ckp.storage.buffers())
        ckp.apply_reverse()


@pytest.mark.parametrize("nbytes", [0, 1, 3, 4, 7, 4096, (1 << 22) + 5])
def test_cupy_digest_is_word_digest(nbytes):
    from asyncckpt.devices.cuda import CupyDevice

    device = CupyDevice()
    data = np.random.default_rng(nbytes).integers(0, 256, nbytes, dtype=np.uint8)
    buffer = cupy.asarray(np.concatenate([data, np.full(64, 255, np.uint8)]))
    assert digest_on(device, buffer, nbytes) == word_digest(data)


def test_a_byte_changed_on_level2_is_caught():
    w = Wave(Ops("cupy"), 40)
    with AsyncCheckpointer(w, Fwd(w), Rev(w), 40, l1_slots=2, interval=4) as ckp:
        w.reset()
        ckp.apply_forward()
        assert_level2_corruption_caught(ckp, w.reset_adjoint)
