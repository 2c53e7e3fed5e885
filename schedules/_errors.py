"""The base of asyncckpt's errors, and the one schedules raise.

The base lives here, beside the schedules that cannot import the runtime, so that one
``except CheckpointError`` catches every error of both packages.
"""
from __future__ import annotations

__all__ = ["CheckpointError", "ScheduleError"]


class CheckpointError(Exception):
    """Base of the errors of asyncckpt and its schedules."""


class ScheduleError(CheckpointError, ValueError):
    """A schedule breaks an invariant: the message names the action and the invariant."""
