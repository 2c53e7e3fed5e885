"""The workloads of workloads.py with their states in a device's memory and their steps queued
on its current stream, as GPU code launches kernels: on the CPU stand-in with an asynchronous
default stream, a step runs on the stream's thread, later than the call that launched it.

Their arithmetic is the host workloads', so the host store-all reference is their reference
bit for bit.
"""
from __future__ import annotations

import numpy as np
import pytest

from asyncckpt.devices import StandInDevice
from workloads import Leapfrog, Pyramid, RecurrentCell


class _OnDevice:
    """Queues ``step`` and ``adjoint`` on the device's current stream; host reads wait for it."""

    device: StandInDevice

    def step(self, t: int) -> None:
        self.device.launch(super().step, t)  # type: ignore[misc]

    def adjoint(self, t: int) -> None:
        self.device.launch(super().adjoint, t)  # type: ignore[misc]

    def reset(self) -> None:
        self.device.synchronize()
        super().reset()  # type: ignore[misc]

    def reset_adjoint(self) -> None:
        if hasattr(self, "device"):
            self.device.synchronize()
        super().reset_adjoint()  # type: ignore[misc]

    def gradients(self) -> list[np.ndarray]:
        self.device.synchronize()
        return [np.asarray(g).view(np.ndarray).copy()
                for g in super().gradients()]  # type: ignore[misc]


class DeviceLeapfrog(_OnDevice, Leapfrog):
    """Leapfrog with its three time levels on the device (valid with and without taping)."""

    def __init__(self, device: StandInDevice, n: int, **kwargs) -> None:
        self.device, self.options = device, kwargs
        super().__init__(n, **kwargs)
        self.levels = device.array(self.levels)
        self.reset()


class DeviceRecurrentCell(_OnDevice, RecurrentCell):
    """RecurrentCell with h and c on the device (taping only: its reverse reads scratch)."""

    def __init__(self, device: StandInDevice, n: int, **kwargs) -> None:
        self.device, self.options = device, kwargs
        super().__init__(n, **kwargs)
        self.h, self.c = device.array(self.h), device.array(self.c)


class DevicePyramid(_OnDevice, Pyramid):
    """Pyramid (states of different sizes) with its state buffer on the device."""

    def __init__(self, device: StandInDevice, n: int, **kwargs) -> None:
        self.device, self.options = device, kwargs
        super().__init__(n, **kwargs)
        self.u = device.array(self.u)


def digest_on(device, buffer, nbytes: int) -> int:
    """The digest ``device`` computes of the first ``nbytes`` of its ``buffer``, read back."""
    out = device.pinned(8).view(np.uint64)
    stream = device.new_stream()
    device.digest(buffer, nbytes, device.empty(8), out, stream)
    stream.synchronize()
    return int(out[0])


def assert_level2_corruption_caught(ckp, reset_adjoint) -> None:
    """After ``ckp``'s forward sweep: flip one byte of a state held in (pinned DRAM) Level-2 and
    check that the reverse sweep stops with a checksum mismatch on the caller's thread."""
    from asyncckpt import TransferError

    storage = ckp.storage
    stored = [t for t in range(ckp.n_timesteps) if t in storage]
    key = stored[len(stored) // 2]
    state = np.zeros(ckp.nbytes, dtype=np.uint8)
    storage.get(key, state)
    state[100] ^= 1
    storage.delete(key)
    storage.put(key, state)
    reset_adjoint()
    with pytest.raises(TransferError) as caught:
        ckp.apply_reverse()
    assert "checksum mismatch" in str(caught.value) + str(caught.value.__cause__)
