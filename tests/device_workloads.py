"""The workloads of workloads.py with their states in a device's memory and their steps queued
on its current stream, as GPU code launches kernels: on the CPU stand-in with an asynchronous
default stream, a step runs on the stream's thread, later than the call that launched it.

Their arithmetic is the host workloads', so the host store-all reference is their reference
bit for bit.
"""
from __future__ import annotations

import numpy as np

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
