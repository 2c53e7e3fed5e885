"""The ``on_level2_error`` policy of the transfer engine: what a failed transfer does."""
from __future__ import annotations

import logging
from collections.abc import Callable

from .bounded import Stalled
from .counters import TransferCounters

__all__ = ["LinkFailure", "Recovery"]

log = logging.getLogger(__name__)


class LinkFailure(RuntimeError):
    """A state never reached its staging buffer (a device copy failed): not to be written
    again from it, whatever the policy."""


class Recovery:
    """Under "recompute" a failed write is tried once more and a state that stays unreadable is
    marked lost, for the reverse sweep to rebuild from an earlier one; under "raise" every
    failure is the caller's error.

    Parameters
    ----------
    policy : {"raise", "recompute"}
        The ``on_level2_error`` option.
    where : str
        The Level-2 backend, for log messages.
    counters : TransferCounters
        Where survived failures are counted.
    """

    def __init__(self, policy: str, where: str, counters: TransferCounters) -> None:
        self.enabled = policy == "recompute"
        self.where = where
        self.counters = counters
        #: states never (or no longer readably) on Level-2
        self.lost: set[int] = set()
        #: the failure that lost each state (the cause of the error if it cannot be rebuilt)
        self.causes: dict[int, BaseException] = {}

    def survives(self, exc: BaseException) -> bool:
        """Whether the policy lives with the failure ``exc``: under "recompute" anything but a
        stall (its thread is abandoned: the device would stall again) or a state that never
        reached its staging buffer."""
        return self.enabled and not isinstance(exc, (Stalled, LinkFailure))

    def write_failed(self, key: int, exc: BaseException,
                     write_again: Callable[[], None]) -> BaseException | None:
        """After a failed write of u_key: write it once more (``write_again``), and failing
        again, mark it lost. Returns the error to raise (only u_0's: nothing earlier can
        rebuild it, or a stall's), else None."""
        self.counters.failures += 1
        log.warning("Level-2 write of u_%d on %s failed (%r): writing it again", key,
                    self.where, exc)
        try:
            write_again()
        except Exception as again:  # noqa: BLE001 - recompute policy: the state is lost
            if key == 0 or isinstance(again, Stalled):
                return again
            log.warning("Level-2 write of u_%d failed again (%r): it will be recomputed", key,
                        again)
            self.lost.add(key)
            self.causes[key] = again
        return None

    def read_failed(self, key: int, exc: BaseException, context: str = "") -> None:
        """A read of u_key failed: it is lost (counted once)."""
        if key in self.lost:
            return
        log.warning("Level-2 read of u_%d on %s failed (%r)%s: it will be recomputed", key,
                    self.where, exc, context)
        self.counters.failures += 1
        self.lost.add(key)
        self.causes[key] = exc

    def delete_failed(self, key: int, exc: BaseException) -> bool:
        """Whether a failed delete of u_key is survived (logged) rather than raised."""
        if self.survives(exc):
            log.warning("Level-2 delete of u_%d on %s failed (%r)", key, self.where, exc)
            return True
        return False
