"""What the transfer engine's I/O threads do: write a staged state to Level-2 with its
checksum, and read one back into a prefetch buffer, checked against it."""
from __future__ import annotations

import logging
import time

import numpy as np

from ..errors import CorruptionError, StorageKeyError
from ..storage import Storage
from .bounded import BoundedCalls
from .counters import TransferCounters
from .futures import Outcome
from .link import Link
from .recovery import LinkFailure

__all__ = ["Transfers"]

log = logging.getLogger(__name__)


class Transfers:
    """One state's trip to Level-2 and back, on an I/O thread (or inline), timed into
    ``counters``; ``verify``: checksums guard every state."""

    def __init__(self, storage: Storage, link: Link, verify: bool,
                 counters: TransferCounters) -> None:
        self.storage, self.link, self.verify, self.counters = storage, link, verify, counters
        #: keys an abandoned run may have left on Level-2 (an interrupt between a write and its
        #: record): the next write of one replaces what is there
        self.stale: set[int] = set()

    def forget(self, key: int, calls: BoundedCalls, until: float) -> None:
        """Delete u_key, of an abandoned run, from Level-2 if it is there (through ``calls``, by
        ``until``); else the next write of it replaces what its write may still leave."""
        try:
            if calls.call(f"lookup of u_{key}", self.storage.__contains__, key, until=until):
                calls.call(f"delete of u_{key}", self.storage.delete, key, until=until)
                return
        except Exception:  # noqa: BLE001 - best effort on an abandoned run
            log.warning("could not delete u_%d from %r", key, self.storage, exc_info=True)
        self.stale.add(key)

    def write(self, key: int, buffer: np.ndarray, size: int,
              ticket: object = None) -> tuple[int, np.ndarray]:
        """Write u_key (its first ``size`` bytes) from a staging buffer, once the link's
        ``ticket`` says it is there; return its checksum and the buffer to stage into next (the
        same one, unless the backend adopted it and gave a spare in exchange)."""
        linked, digest = 0.0, None
        if ticket is not None:
            try:
                linked, digest = self.link.sent(ticket)
            except Exception as exc:  # the staging buffer holds nothing to write again
                raise LinkFailure(f"the copy of u_{key} out of Level-1 failed: {exc!r}") \
                    from exc
        start = time.perf_counter()
        view = buffer[:size]
        if digest is None:
            digest = self.link.checksum(view) if self.verify else 0
        try:
            buffer = self.storage.put_staged(key, buffer, size)
        except StorageKeyError:
            if key not in self.stale:
                raise
            self.storage.delete(key)
            buffer = self.storage.put_staged(key, buffer, size)
        self.stale.discard(key)
        self.counters.busy(True, linked + time.perf_counter() - start)
        return digest, buffer

    def read(self, key: int, buffer: np.ndarray, size: int, digest: int | None,
             written: Outcome | None) -> None:
        """Read u_key (``size`` bytes) into a prefetch buffer and make it ready for a load."""
        if written is not None:
            digest = written.result()[0]
        out = buffer[:size]
        start = time.perf_counter()
        self.storage.get(key, out)
        host = time.perf_counter() - start
        check = self.verify and digest is not None
        linked, arrived = self.link.receive(buffer, size, check)
        if check and (arrived if arrived is not None else self.link.checksum(out)) != digest:
            raise CorruptionError(
                f"Level-2 read of u_{key} from {self.storage!r}: checksum mismatch "
                f"({out.nbytes} bytes differ from what was written)"
            )
        self.counters.busy(False, host + linked)
