"""Level-2 that keeps states compressed: a codec in front of another backend, on the I/O
threads."""
from __future__ import annotations

import threading
import time
from dataclasses import dataclass, fields, replace
from typing import Any

import numpy as np
import xxhash

from .._memory.buffers import aligned_buffer, padded
from ..errors import CorruptionError, InvalidTypeError, StorageKeyError
from .base import Storage, WrapperStorage

__all__ = ["CompressedStorage", "CompressionCounters"]


@dataclass(frozen=True)
class CompressionCounters:
    """What a :class:`CompressedStorage` did: states written, their bytes before and after
    compression (a state the codec cannot shrink, or was not asked to, is stored as it is and
    counted at its size), and of them the states the codec ran on (``encoded``, with their
    bytes before and after) and read back (``decoded``), and the seconds it spent on them,
    checksums of the stored bytes included."""

    states: int = 0
    raw_bytes: int = 0
    stored_bytes: int = 0
    compress_s: float = 0.0
    decompress_s: float = 0.0
    encoded: int = 0
    encoded_raw_bytes: int = 0
    encoded_stored_bytes: int = 0
    decoded: int = 0

    def __sub__(self, other: "CompressionCounters") -> "CompressionCounters":
        return CompressionCounters(*(getattr(self, name.name) - getattr(other, name.name)
                                     for name in fields(self)))

    @property
    def ratio(self) -> float:
        """Bytes before over bytes stored (1.0 before any write)."""
        return self.raw_bytes / self.stored_bytes if self.stored_bytes else 1.0


#: compressed states are stored in sizes of whole sixteenths of the state, so that a DRAM
#: backend's freed buffers fit the next states, as they fit states of one size
SIZE_CLASSES = 16


@dataclass(frozen=True)
class _Record:
    nbytes: int  # bytes stored on the inner backend (its size class)
    packed: int  # bytes of the codec's output in them; 0: the state is stored as it is
    digest: int  # xxh3 of the stored bytes
    encoded: bool  # whether the codec ran on the state (counted as its work when read)


class CompressedStorage(WrapperStorage):
    """Level-2 that compresses each state on its way to ``inner`` and decompresses it on the
    way back, on the thread that calls ``put`` and ``get`` (the transfer engine's I/O threads).

    ``inner`` holds each state at its compressed size, so a memory budget's DRAM tier counts
    compressed bytes and holds more states; a state the codec cannot shrink is stored as it
    is. Compressed sizes are rounded up to whole sixteenths of the state, so that a DRAM
    backend reuses the buffers that freed states leave. Every read is checked against a
    checksum of the stored bytes, and a record that fails it, or fails to decompress, is a
    :class:`~asyncckpt.CorruptionError`. Around a
    :class:`~asyncckpt.storage.TieredStorage` it places compressed states on its tiers, and
    shows them to the runtime (:attr:`~asyncckpt.storage.Storage.tiers`, their capacities and
    counters) as its own.

    Each thread that calls ``put`` or ``get`` keeps one page-aligned buffer as large as the
    largest compressed state it moved (so that writes to a file can bypass the page cache).

    :attr:`compress_every` says which states the codec runs on: 1 (the default) every one, k
    every k-th (the others stored as they are, checksummed alike: ``compression="auto"``
    samples the codec's cost and ratio so), 0 none.

    Parameters
    ----------
    inner : Storage
        Where the compressed states go.
    codec : asyncckpt.compression.Codec
        How (see ``asyncckpt.compression.make_codec``).
    close_inner : bool
        Whether :meth:`close` closes ``inner`` (default True).
    """

    def __init__(self, inner: Storage, codec: Any, *, close_inner: bool = True) -> None:
        from ..compression import Codec

        super().__init__(inner)
        if not isinstance(codec, Codec):
            raise InvalidTypeError(f"CompressedStorage needs an asyncckpt.compression.Codec, got "
                            f"{type(codec).__name__}")
        self.codec = codec
        self.close_inner = close_inner
        self._lock = threading.Lock()
        self._records: dict[int, _Record] = {}
        self._counters = CompressionCounters()
        self._scratch = threading.local()
        self._puts = 0
        self._every = 1

    def __repr__(self) -> str:
        return f"CompressedStorage({self.inner!r}, {self.codec!r})"

    @property
    def compression(self) -> CompressionCounters:
        """Counts and seconds since this backend was made."""
        with self._lock:
            return self._counters

    def _count(self, **more: float) -> None:
        with self._lock:
            now = self._counters
            self._counters = replace(now, **{k: getattr(now, k) + v for k, v in more.items()})

    def _aligned(self, nbytes: int) -> np.ndarray:
        scratch = getattr(self._scratch, "buffer", None)
        if scratch is None or scratch.nbytes < nbytes:
            scratch = self._scratch.buffer = aligned_buffer(padded(nbytes))
        return scratch[:nbytes]

    @property
    def compress_every(self) -> int:
        """1: the codec runs on every state; k: on the first put from now and every k-th after
        it; 0: on none."""
        return self._every

    @compress_every.setter
    def compress_every(self, every: int) -> None:
        with self._lock:
            self._every, self._puts = every, 0

    def _encodes_next(self) -> bool:
        with self._lock:
            every, self._puts = self._every, self._puts + 1
            return every > 0 and (self._puts - 1) % every == 0

    def put(self, key: int, buf: np.ndarray) -> None:
        start = time.perf_counter()
        run_codec = self._encodes_next()
        encoded = self.codec.encode(buf) if run_codec else None
        packed = 0 if encoded is None else len(memoryview(encoded).cast("B"))
        granule = -(-max(1, buf.nbytes // SIZE_CLASSES) // 64) * 64
        size = -(-packed // granule) * granule
        if encoded is not None and 0 < size < buf.nbytes:
            stored = self._aligned(size)
            np.copyto(stored[:packed], np.frombuffer(encoded, np.uint8))
            stored[packed:] = 0
        else:
            stored, packed = buf, 0
        del encoded  # the codec's output, copied: not held beside the inner put's buffer
        digest = xxhash.xxh3_64_intdigest(stored.data)
        spent = time.perf_counter() - start
        self.inner.put(key, stored)
        with self._lock:
            self._records[key] = _Record(stored.nbytes, packed, digest, run_codec)
        if run_codec:
            self._count(states=1, raw_bytes=buf.nbytes, stored_bytes=stored.nbytes,
                        compress_s=spent, encoded=1, encoded_raw_bytes=buf.nbytes,
                        encoded_stored_bytes=stored.nbytes)
        else:
            self._count(states=1, raw_bytes=buf.nbytes, stored_bytes=stored.nbytes)

    def adopt(self, key: int, buffer: np.ndarray, nbytes: int) -> np.ndarray:
        self.put(key, buffer[:nbytes])
        return buffer

    def get(self, key: int, out: np.ndarray) -> None:
        with self._lock:
            record = self._records.get(key)
        if record is None:
            raise StorageKeyError(f"CompressedStorage.get({key}): key not stored")
        stored = self._aligned(record.nbytes) if record.packed else out
        self.inner.get(key, stored)
        start = time.perf_counter()
        if xxhash.xxh3_64_intdigest(stored.data) != record.digest:
            raise CorruptionError(f"CompressedStorage.get({key}): checksum mismatch in the "
                                  f"{record.nbytes} stored bytes on {self.inner!r}")
        if record.packed:
            try:
                self.codec.decode(stored[:record.packed], out)
            except Exception as exc:
                raise CorruptionError(f"CompressedStorage.get({key}): {self.codec!r} could not "
                                      f"decompress the stored bytes: {exc}") from exc
        if record.encoded:
            self._count(decompress_s=time.perf_counter() - start, decoded=1)

    def delete(self, key: int) -> None:
        """Delete ``key`` from the inner backend (where a failed put may have left it without a
        record here too), then forget its record."""
        try:
            self.inner.delete(key)
        except StorageKeyError as exc:
            with self._lock:
                self._records.pop(key, None)
            raise StorageKeyError(f"CompressedStorage.delete({key}): key not stored") from exc
        with self._lock:
            self._records.pop(key, None)

    def __contains__(self, key: object) -> bool:
        with self._lock:
            return key in self._records

    def close(self) -> None:
        with self._lock:
            self._records.clear()
        if self.close_inner:
            self.inner.close()
