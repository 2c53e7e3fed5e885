"""The error raised for an invalid schedule or schedule argument."""
from __future__ import annotations

__all__ = ["ScheduleError"]


class ScheduleError(ValueError):
    """A schedule breaks an invariant: the message names the action and the invariant."""
