"""Accelerators as Level-1: states whose arrays live in device memory (CuPy arrays, torch CUDA
tensors, or the CPU stand-in's arrays) are checkpointed in device memory and streamed to
page-locked host memory on streams of their own. See docs/gpu.md."""
from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from .base import Device, Event, Stream
from .standin import StandInArray, StandInDevice

__all__ = ["Device", "Event", "Stream", "StandInArray", "StandInDevice", "device_of"]


def device_of(arrays: Sequence[Any]) -> Device | None:
    """The device holding the first of a state's ``arrays``; None for host (numpy) arrays.

    CuPy is imported only for a CuPy array or a torch CUDA tensor, torch never.
    """
    if not arrays:
        return None
    first = arrays[0]
    if isinstance(first, StandInArray) and first.owner is not None:
        return first.owner
    from .cuda import is_cuda_array  # imports neither CuPy nor torch

    if is_cuda_array(first):
        from .cuda import CupyDevice

        return CupyDevice.of(first)
    return None
