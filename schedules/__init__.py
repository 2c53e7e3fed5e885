"""Checkpointing schedules as plain data: algorithms, a validator and a performance model.

Imports no array library and nothing of :mod:`asyncckpt` (H-Revolve's tables import numpy and
numba when one is first built).
"""
from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

from ._errors import CheckpointError, InvalidTypeError, InvalidValueError, ScheduleError
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
from .hrevolve import HRevolve, Level
from .multistage import AsyncMultistage, Chen, two_level_forward_steps
from .online import Decisions, EveryInterval, OnlineMultistage, Replay
from .revolve import Revolve, optimal_forward_steps
from .validate import SimulationResult, simulate

_BY_NAME: dict[str, Callable[..., Any]] = {
    "Revolve": Revolve, "AsyncMultistage": AsyncMultistage, "Chen": Chen, "HRevolve": HRevolve}


def from_config(config: Mapping[str, object]) -> Revolve | AsyncMultistage | Chen | HRevolve:
    """Rebuild a schedule from its ``get_config()`` dict (as saved with an experiment's JSON).

    Raises
    ------
    ValueError
        If ``config["name"]`` is not a schedule's name.
    TypeError
        If an argument is missing or unexpected.
    """
    name = config.get("name")
    if name not in _BY_NAME:
        raise InvalidValueError(f"config name {name!r} is not a schedule; expected one of "
                         f"{', '.join(sorted(_BY_NAME))}")
    arguments = {k: v for k, v in config.items() if k != "name"}
    levels = arguments.get("levels")
    if name == "HRevolve" and isinstance(levels, list):
        arguments["levels"] = [Level(**level) if isinstance(level, Mapping) else level
                               for level in levels]
    return _BY_NAME[str(name)](**arguments)


__all__ = [
    "Action",
    "Advance",
    "AsyncMultistage",
    "Chen",
    "CheckpointError",
    "Decisions",
    "EveryInterval",
    "EndForward",
    "EndReverse",
    "Free",
    "HRevolve",
    "InvalidTypeError",
    "InvalidValueError",
    "Level",
    "Load",
    "OnlineMultistage",
    "Prefetch",
    "Replay",
    "Reverse",
    "ScheduleError",
    "SimulationResult",
    "Store",
    "Tier",
    "Revolve",
    "from_config",
    "optimal_forward_steps",
    "simulate",
    "two_level_forward_steps",
]
