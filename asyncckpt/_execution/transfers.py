"""What the transfer engine's I/O threads do: write a staged state to Level-2 with its
checksum, and read one back into a prefetch buffer, checked against it."""
from __future__ import annotations

import logging
import time
from collections.abc import Iterable

import numpy as np

from ..errors import CorruptionError, StorageKeyError
from ..storage import Storage
from .bounded import BoundedCalls, Stalled
from .counters import TransferCounters
from .futures import Outcome
from .link import Link
from .recovery import LinkFailure

__all__ = ["Transfers"]

log = logging.getLogger(__name__)


class Transfers:
    """One state's trip to Level-2 and back, on an I/O thread (or inline), timed into
    ``counters``; ``verify``: checksums guard every read. Each state's checksum is taken where
    it is staged with ``verify``, and under the recompute policy (``recompute``) for a retried
    write to be checked against.

    Every write and every delete of the engine goes through here, and so does the record of
    what may be on Level-2 that no run accounts for: a key is forgotten only once a delete of
    it succeeds or finds it gone, never because a call was made."""

    def __init__(self, storage: Storage, link: Link, verify: bool,
                 counters: TransferCounters, recompute: bool = False) -> None:
        self.storage, self.link, self.verify, self.counters = storage, link, verify, counters
        #: whether states are checksummed where they are staged
        self.digests = verify or recompute
        #: the checksum each state was staged with, kept while its write has not succeeded: a
        #: failed ``put`` may have written into the staging buffer, which is written again
        #: only if it still matches
        self.staged: dict[int, int] = {}
        #: keys that may be on Level-2 though no run accounts for them (a failed delete's, a
        #: failed write's, an abandoned run's): :meth:`sweep` deletes them, and a write of one
        #: replaces what is there
        self.stale: set[int] = set()
        #: keys whose write was abandoned still running: it may land at any time, so a delete
        #: that finds one gone does not forget it
        self.landing: set[int] = set()
        #: runs abandoned so far: a write handed over before the latest never replaces a key
        self.epoch = 0

    def write(self, key: int, buffer: np.ndarray, size: int, ticket: object = None,
              epoch: int | None = None) -> tuple[int, np.ndarray]:
        """Write u_key (its first ``size`` bytes) from a staging buffer, once the link's
        ``ticket`` says it is there; return its checksum and the buffer to stage into next (the
        same one, unless the backend adopted it and gave a spare in exchange). ``epoch``: the
        :attr:`epoch` it was handed over in (None: now)."""
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
        buffer = self._put(key, buffer, size, digest, epoch)
        self.staged.pop(key, None)
        # a stale key stays so until deleted: this may be an abandoned write landing late
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
        buffer = self._put(key, buffer, size, digest, None)
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

    def _put(self, key: int, buffer: np.ndarray, size: int, digest: int | None,
             epoch: int | None) -> np.ndarray:
        """Store the staged u_key (staged with ``digest``), replacing a copy no run accounts
        for (unless this write's own run was abandoned since it was handed over: what is
        stored is a later run's) from a buffer that still matches ``digest``. A put that fails
        leaves the key stale: it may have stored some of the state."""
        try:
            return self.storage.put_staged(key, buffer, size)
        except StorageKeyError:
            if ((key not in self.stale and key not in self.landing)
                    or epoch not in (None, self.epoch)):
                raise
        except BaseException:
            self.stale.add(key)
            raise
        try:
            self.delete(key)
        except StorageKeyError:
            pass  # what refused the put is gone by now
        if digest is not None:
            self._intact(key, buffer, size, digest)
        try:
            return self.storage.put_staged(key, buffer, size)
        except BaseException:
            self.stale.add(key)
            raise

    def delete(self, key: int) -> None:
        """Delete u_key from Level-2. A delete that fails leaves the key stale, for the next
        :meth:`sweep` (or write of it) to delete; :class:`StorageKeyError` says it is gone."""
        try:
            self.storage.delete(key)
        except StorageKeyError:
            self.stale.discard(key)
            raise
        except BaseException:
            self.stale.add(key)
            raise
        self.stale.discard(key)
        self.landing.discard(key)

    def delete_within(self, key: int, calls: BoundedCalls, until: float | None = None) -> None:
        """:meth:`delete` within the deadline of ``calls`` (and by ``until``); one that stalls
        leaves the key stale: it may yet delete it, or not."""
        if calls.inline:  # own memory: nothing to bound, and no call to name
            self.delete(key)
            return
        try:
            calls.call(f"delete of u_{key}", self.delete, key, until=until)
        except Stalled:
            self.stale.add(key)
            raise

    def abandon(self, keys: Iterable[int], in_flight: Iterable[int]) -> None:
        """A run is abandoned: every key it may have written (``keys``) is stale, those whose
        write is still running (``in_flight``) may land later; :meth:`sweep` deletes them."""
        self.epoch += 1
        self.stale.update(keys)
        self.landing.update(in_flight)

    def sweep(self, calls: BoundedCalls, until: float | None = None) -> Stalled | None:
        """Delete every stale key (before a run, and when one is abandoned), each within the
        deadline of ``calls`` (and by ``until``), so that what the next run writes finds
        Level-2 as a fresh checkpointer's would; one whose delete fails stays stale, logged,
        for the next sweep or write of it. The first delete that stalls ends the sweep (the
        device is stalled: one deadline in all, not one per key) and is returned."""
        for key in sorted(self.stale | self.landing):
            try:
                self.delete_within(key, calls, until)
            except StorageKeyError:
                pass
            except Exception as exc:  # noqa: BLE001 - tried again before the next run
                self.stale.add(key)
                log.warning("could not delete u_%d from %r (%r): it is tried again before the "
                            "next run", key, self.storage, exc)
                if isinstance(exc, Stalled):
                    return exc
        return None

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
        got = (arrived if arrived is not None else self.link.checksum(out)) if check else digest
        if got != digest:  # only the checksum of what was written is kept: not which bytes
            raise CorruptionError(
                f"Level-2 read of u_{key} from {self.storage!r}: checksum mismatch: the "
                f"{out.nbytes} bytes read hash to {got:#x}, what was written to {digest:#x} "
                f"(a corrupted or short read: one changed bit or more)"
            )
        self.counters.busy(False, host + linked)
