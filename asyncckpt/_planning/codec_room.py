"""Whether a codec's buffers fit in the memory plan beside Level-2: set aside where they do,
declined (``compression="auto"``) or refused (a codec asked for by name) where they would
leave Level-2 no room and turn the run into Revolve in Level-1 alone."""
from __future__ import annotations

import dataclasses
import logging
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from .._memory.buffers import padded
from ..errors import CheckpointError, InvalidValueError
from .host_bound import bound_source
from .transfer_buffers import codec_buffers, codec_threads

if TYPE_CHECKING:
    from .budget import MemoryPlan

__all__ = ["codec_beside_level2", "fit_codec"]

log = logging.getLogger(__name__)


def fit_codec(plain: "MemoryPlan", options: Any,
              remake: Callable[[int], "MemoryPlan"]) -> "MemoryPlan":
    """The plan with ``options.codec``'s :func:`codec_buffers` set aside (``remake`` makes it
    from their count), where ``plain``, the plan without them, uses Level-2 (else no codec
    runs and ``plain`` is the plan). Where they leave Level-2 no room, ``compression="auto"``
    is declined: ``plain`` with ``codec_declined`` saying why, and a log line.

    Raises
    ------
    InvalidValueError
        Where a codec asked for by name leaves Level-2 no room, naming the bytes.
    """
    try:
        if plain.split(options.l1_slots, options.interval)[1]:
            return plain
    except CheckpointError:
        return plain  # refused without them already: the refusal names what was asked
    codec = codec_buffers(options.codec, codec_threads(
        options.io_threads, options.transfers, options.on_level2_error))
    refusal: CheckpointError | None = None
    try:
        coded = remake(codec)
        if not coded.split(options.l1_slots, options.interval)[1]:
            return coded
    except CheckpointError as exc:
        refusal = exc
    why = codec_beside_level2(plain, options, codec)
    if not options.compress_auto:
        raise InvalidValueError(f"compression={options.codec!r}: {why}; give a larger "
                                "memory_budget, fewer io_threads, or no compression"
                                ) from refusal
    log.info("compression='auto' declined: %s; states are stored uncompressed", why)
    return dataclasses.replace(plain, codec_declined=why)


def codec_beside_level2(plain: "MemoryPlan", options: Any, codec: int) -> str:
    """Why ``codec`` state buffers do not fit beside Level-2 in ``plain`` (the plan without
    them): the bytes they, the engine's buffers and the slots need, and the limit's."""
    size = padded(plain.nbytes)
    slots = options.l1_slots or 1
    need = (codec + plain.engine_buffers + slots) * size
    if options.memory_budget is not None and plain.on_host:
        limit = f"memory_budget={options.memory_budget} bytes"
    elif options.host_memory_budget is not None:
        limit = f"host_memory_budget={options.host_memory_budget} bytes"
    else:
        limit = (f"the default bound of {plain.default_bound} bytes "
                 f"({bound_source(plain.environment)})")
    return (f"its {codec} buffers of {size} bytes ({codec * size} bytes) beside "
            f"{plain.engine_buffers} staging and prefetch buffers and {slots} Level-1 "
            f"slot{'s' if slots != 1 else ''} need {need} bytes, more than {limit}, so Level-2 "
            "has no room")
