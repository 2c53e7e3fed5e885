"""Which reverse protocol a run uses: taped (pyrevolve's: each reverse call directly after a
forward call ending at t + 1) or taping-free (each reverse call with u_t live, one forward step
fewer per reverse step), decided from what the reverse operator provably reads, never guessed."""
from __future__ import annotations

import logging
from typing import Any

from ..errors import InvalidTypeError
from .environment import Environment
from .reverse_protocol import Protocol

__all__ = ["Protocol", "choose_protocol", "decide_taping", "is_devito"]

log = logging.getLogger(__name__)


def decide_taping(taping: object, checkpoint: Any, fwd_operator: Any, rev_operator: Any,
                  environment: Environment | None = None) -> Protocol:
    """The protocol, as :func:`choose_protocol` decides it, logged at INFO."""
    protocol = choose_protocol(taping, *map(_unwrapped, (checkpoint, fwd_operator, rev_operator)),
                               environment=environment)
    log.info("%s: %s", "taping" if protocol.taping else "taping-free", protocol.reason)
    return protocol


def choose_protocol(taping: object, checkpoint: Any, fwd_operator: Any, rev_operator: Any,
                    *, environment: Environment | None = None) -> Protocol:
    """The protocol: ``taping`` where it is True or False, else ``$ASYNCCKPT_TAPING`` where
    ``environment`` (default: the variables as they are now) sets it, else taping-free exactly
    where the reverse operator provably reads only what a restored state holds: declared by
    the reverse operator (``needs_taping = False``), or read from a Devito operator's
    expressions; taped otherwise. Wrappers that name what they
    wrap in ``__wrapped__`` (as :func:`functools.wraps` does) are read through.

    Raises
    ------
    InvalidTypeError
        ``taping`` or ``needs_taping`` neither a bool nor None.
    """
    if taping is not None and not isinstance(taping, bool):
        raise InvalidTypeError(f"taping must be True, False or None (decide), got {taping!r}")
    if taping is not None:
        return Protocol(taping, f"taping={taping} was given")
    environment = Environment.read() if environment is None else environment
    forced = environment.taping
    if forced is not None:
        return Protocol(forced, f"ASYNCCKPT_TAPING={environment.taping_text}")
    declared = getattr(rev_operator, "needs_taping", None)
    if declared is not None:
        if not isinstance(declared, bool):
            raise InvalidTypeError(f"{type(rev_operator).__name__}.needs_taping must be True or "
                                   f"False, got {declared!r}")
        return Protocol(declared, f"the reverse operator declares needs_taping = {declared}")
    if is_devito(checkpoint, fwd_operator, rev_operator):
        from .devito_reads import devito_protocol

        return devito_protocol(checkpoint, fwd_operator, rev_operator)
    return Protocol(True, f"the reverse operator ({type(rev_operator).__name__}) declares no "
                          "needs_taping and is not a Devito operator whose reads can be read")


def is_devito(checkpoint: Any, fwd_operator: Any, rev_operator: Any) -> bool:
    """Devito's ``CheckpointOperator`` pair around ``devito.Operator``s and a checkpoint of
    its fields (``DevitoCheckpoint``), known by duck type (devito is not imported here)."""
    ops = [getattr(op, "op", None) for op in (fwd_operator, rev_operator)]
    return (all(type(op).__module__.startswith("devito") for op in ops)
            and all(hasattr(op, "start_offset") for op in (fwd_operator, rev_operator))
            and isinstance(getattr(checkpoint, "objects", None), (list, tuple)))


def _unwrapped(obj: Any) -> Any:
    """What ``obj`` wraps, through the ``__wrapped__`` its instances set (as
    :func:`functools.wraps` and compat's wrappers do): never through a ``__getattr__`` that
    answers any name, at most 8 deep."""
    for _ in range(8):
        inner = getattr(obj, "__dict__", {}).get("__wrapped__")
        if inner is None:
            break
        obj = inner
    return obj
