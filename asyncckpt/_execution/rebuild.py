"""A lost Level-2 state rebuilt in the live arrays during the reverse sweep, where the
``on_level2_error="recompute"`` policy (:mod:`~asyncckpt._execution.recovery`) marked it lost:
read once more, else recomputed from the nearest earlier state that can still be read."""
from __future__ import annotations

import time
from typing import TYPE_CHECKING

from ..errors import TransferError
from ..stats import Stats

if TYPE_CHECKING:
    from .interpreter import Interpreter

__all__ = ["recompute_lost"]


def recompute_lost(interpreter: Interpreter, step: int, stats: Stats) -> None:
    """Rebuild the lost u_step in the live state (and its prefetch buffer): read it once more,
    else advance from the nearest earlier Level-2 state that can still be read.

    Raises
    ------
    TransferError
        If no earlier state can be read, chained from the failure that lost u_step.
    """
    engine, arrays = interpreter.engine, interpreter.arrays
    if engine.reread(step, arrays(step, into=True)):
        return
    for start in engine.stored_before(step):
        if engine.fetch(start, arrays(start, into=True), via=step):
            clock = time.perf_counter()
            interpreter.fwd_operator.apply(t_start=start, t_end=step)
            stats.forward_compute_s += time.perf_counter() - clock
            stats.forward_steps += step - start
            stats.recovery_steps += step - start
            state = arrays(step, into=False)
            interpreter.replay.check(state, start, step, engine.digests.get(step))
            engine.recovered(step, state)
            return
    raise TransferError(f"u_{step} is lost on Level-2 {engine.storage!r} and no earlier "
                        "checkpoint can be read to recompute it") \
        from engine.recovery.causes.get(step)
