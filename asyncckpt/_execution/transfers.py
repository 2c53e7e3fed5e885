"""What the transfer engine's I/O threads do: write a staged state to Level-2 with its
checksum, and read one back into a prefetch buffer, checked against it."""
from __future__ import annotations

import time

import numpy as np

from ..errors import CorruptionError, StorageKeyError
from ..storage import Storage
from .counters import TransferCounters
from .futures import Outcome
from .link import Link
from .recovery import LinkFailure

__all__ = ["Transfers"]


class Transfers:
    """One state's trip to Level-2 and back, on an I/O thread (or inline), timed into
    ``counters``; ``verify``: checksums guard every read. Each state's checksum is taken where
    it is staged with ``verify``, and under the recompute policy (``recompute``) for a retried
    write to be checked against."""

    def __init__(self, storage: Storage, link: Link, verify: bool,
                 counters: TransferCounters, recompute: bool = False) -> None:
        self.storage, self.link, self.verify, self.counters = storage, link, verify, counters
        #: whether states are checksummed where they are staged
        self.digests = verify or recompute
        #: keys an abandoned run may have left on Level-2 (an interrupt between a write and its
        #: record): the next write of one replaces what is there
        self.stale: set[int] = set()
        #: the checksum each state was staged with, kept while its write has not succeeded: a
        #: failed ``put`` may have written into the staging buffer, which is written again
        #: only if it still matches
        self.staged: dict[int, int] = {}

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
        if digest is None and self.digests:
            digest = self.link.checksum(buffer[:size])
        if digest is not None:
            self.staged[key] = digest
        buffer = self._put(key, buffer, size, digest)
        self.staged.pop(key, None)
        self.stale.discard(key)
        self.counters.busy(True, linked + time.perf_counter() - start)
        return (0 if digest is None else digest), buffer

    def rewrite(self, key: int, buffer: np.ndarray, size: int) -> tuple[int, np.ndarray]:
        """Write u_key again from its staging buffer after a failed write, under the checksum
        it was staged with, once the buffer is seen to match it.

        Raises
        ------
        CorruptionError
            If no checksum was taken at staging, or the buffer no longer matches it (the failed
            call wrote into it): the state is not written again from it.
        """
        digest = self.staged.pop(key, None)
        self._intact(key, buffer, size, digest)
        start = time.perf_counter()
        buffer = self._put(key, buffer, size, digest)
        self.stale.discard(key)
        self.counters.busy(True, time.perf_counter() - start)
        assert digest is not None
        return digest, buffer

    def _intact(self, key: int, buffer: np.ndarray, size: int, digest: int | None) -> None:
        """Raise unless the staging buffer still holds u_key as it was staged."""
        if digest is None:
            raise CorruptionError(f"u_{key} was staged without a checksum: its staging buffer "
                                  "cannot be shown intact after a failed write")
        if self.link.checksum(buffer[:size]) != digest:
            raise CorruptionError(
                f"the staging buffer of u_{key} changed after it was staged (the failed write "
                f"to {self.storage!r} wrote into it): it is not written again")

    def _put(self, key: int, buffer: np.ndarray, size: int, digest: int | None) -> np.ndarray:
        """``put_staged`` u_key (staged with ``digest``); a key an abandoned run left behind
        is replaced, from a buffer that still matches ``digest``."""
        try:
            return self.storage.put_staged(key, buffer, size)
        except StorageKeyError:
            if key not in self.stale:
                raise
        self.storage.delete(key)
        if digest is not None:
            self._intact(key, buffer, size, digest)
        return self.storage.put_staged(key, buffer, size)

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
