"""What a differentiated ``checkpoint_scan`` holds beside its checkpointer, charged to the one
memory budget its plan is made against.

XLA compiles the scan's forward and backward into one program whose temporaries it assigns
once: a segment's residuals (per step, or per chunk where the segment recomputes them) and, what
any plan holds, the fetched carry, the carry's cotangent in and out and the closed-over arrays'
cotangents (the running sum into and out of a segment's backward, a step's part). On the host
the front end holds the checkpointer's live arrays and one carry in flight through a callback
(the argument JAX copies to the host device on the forward sweep, the copy handed back on the
backward). These figures match XLA's buffer assignment
(``Compiled.memory_analysis().temp_size_in_bytes``) of scans of 0.5 to 2 MiB carries within a
carry (tests/test_asyncckpt/jax/test_jax_memory.py).
"""
from __future__ import annotations

from typing import Any

import jax
import numpy as np
from jax.extend.core import Literal

from .wire import leaf_bytes

__all__ = ["HOST_CARRIES", "XLA_CARRIES", "CONST_COTANGENTS", "step_residual_bytes",
           "fixed_bytes"]

#: Carries XLA holds in a segment's backward whatever the plan (the fetched first carry and the
#: carry's cotangent, whose input and output buffers XLA shares).
XLA_CARRIES = 2
#: Cotangents XLA holds per closed-over floating array: the running sum a segment's backward is
#: handed, the one it hands on and a step's part.
CONST_COTANGENTS = 3
#: Carries the front end holds on the host: the checkpointer's live arrays and one in flight
#: through a callback (JAX copies a callback's argument to the host device; the backward's
#: callback hands XLA a copy of the restored carry).
HOST_CARRIES = 2


def _bytes(avals: Any) -> int:
    return sum(leaf_bytes(tuple(aval.shape), aval.dtype) for aval in avals)


def step_residual_bytes(fn: Any, carry: Any, x: Any, consts: list[Any]) -> int:
    """The bytes a step's backward keeps per step: its residuals, less the closed-over arrays
    it keeps as they are (``lax.scan`` keeps those once, not per step)."""
    def residuals(c: Any, x: Any, *k: Any) -> list[Any]:
        return jax.tree_util.tree_leaves(jax.vjp(lambda c, *k: fn(c, x, *k), c, *k)[1])

    closed = jax.make_jaxpr(residuals)(carry, x, *consts)
    # the trailing invars are the closed-over arrays; an outvar that is one of them is kept as is
    given = set(closed.jaxpr.invars[len(closed.jaxpr.invars) - len(consts):]) if consts else set()
    return _bytes(var.aval for var in closed.jaxpr.outvars
                  if isinstance(var, Literal) or var not in given)


def fixed_bytes(carry_bytes: int, consts: list[Any]) -> int:
    """What the scan holds whatever its plan, beside its checkpointer and a segment's
    residuals: :data:`XLA_CARRIES` and :data:`HOST_CARRIES` carries of ``carry_bytes`` and
    :data:`CONST_COTANGENTS` cotangents of each floating closed-over array."""
    differentiated = [k for k in consts if np.issubdtype(np.dtype(k.dtype), np.inexact)]
    return ((XLA_CARRIES + HOST_CARRIES) * carry_bytes
            + CONST_COTANGENTS * _bytes(differentiated))
