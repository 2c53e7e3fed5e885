"""What the transfer engine holds whenever a run uses Level-2, in state buffers: its staging
and prefetch buffers, and what the threads that run a codec keep (:mod:`.budget` charges them
to the memory budget; the adapters size theirs with :func:`engine_buffers`)."""
from __future__ import annotations

from schedules import AsyncMultistage

from ..compression import Codec

__all__ = ["DEFAULT_STAGING_BUFFERS", "codec_buffers", "codec_threads", "engine_buffers"]


#: Level-2 writes that may be in flight before the forward sweep waits, by default.
DEFAULT_STAGING_BUFFERS = 2


def codec_threads(io_threads: int = 1, transfers: str = "auto",
                  on_level2_error: str = "raise") -> int:
    """Threads that may run a codec: the I/O threads, and the thread that makes the caller's
    Level-2 calls (``BoundedCalls``), which runs every transfer where they are inline and,
    under ``on_level2_error="recompute"``, the retries of writes and rereads."""
    if transfers == "inline":
        return 1
    return io_threads + (1 if on_level2_error == "recompute" else 0)


def codec_buffers(codec: Codec | None, threads: int) -> int:
    """State buffers ``threads`` threads running ``codec`` hold (see :func:`codec_threads`):
    each its buffer for a compressed state and the codec's
    :attr:`~asyncckpt.compression.Codec.work_buffers`, which the C heap of a thread keeps for
    the process's life once the codec ran there (glibc trims no thread's heap below twice the
    largest block it freed). None: no codec, 0."""
    return 0 if codec is None else threads * (1 + codec.work_buffers)


def engine_buffers(staging_buffers: int = DEFAULT_STAGING_BUFFERS, io_threads: int = 1,
                   codec: Codec | None = None, threads: int | None = None) -> int:
    """State buffers the transfer engine holds whenever Level-2 is used: ``staging_buffers``
    for writes in flight, the reverse sweep's prefetch buffers and, with a ``codec``, the
    :func:`codec_buffers` of the ``threads`` that run it (default ``io_threads``)."""
    return (staging_buffers + AsyncMultistage.prefetch_slots
            + codec_buffers(codec, io_threads if threads is None else threads))
