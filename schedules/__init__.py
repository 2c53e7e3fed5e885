"""Checkpointing schedules as plain data: algorithms, a validator and a performance model.

Imports no array library and nothing of :mod:`asyncckpt`.
"""
from __future__ import annotations

from ._errors import ScheduleError
from .actions import (
    Action,
    Advance,
    EndForward,
    EndReverse,
    Free,
    Load,
    Prefetch,
    Reverse,
    Store,
    Tier,
)
from .multistage import AsyncMultistage, Chen, two_level_forward_steps
from .revolve import Revolve, optimal_forward_steps
from .validate import SimulationResult, simulate

__all__ = [
    "Action",
    "Advance",
    "AsyncMultistage",
    "Chen",
    "EndForward",
    "EndReverse",
    "Free",
    "Load",
    "Prefetch",
    "Reverse",
    "ScheduleError",
    "SimulationResult",
    "Store",
    "Tier",
    "Revolve",
    "optimal_forward_steps",
    "simulate",
    "two_level_forward_steps",
]
