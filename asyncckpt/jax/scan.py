"""``checkpoint_scan``: ``jax.lax.scan`` whose carries stream to host memory and disk."""
from __future__ import annotations

from functools import partial
from typing import Any

import jax
import jax.numpy as jnp

from ..planning import parse_bytes, scan_length
from .checks import (check_carry, check_compression, check_interval, check_leaves, check_options,
                     check_returned, check_storage, engine_states)
from .held import fixed_bytes, step_residual_bytes
from .host import RUNS
from .scan_plan import PRIOR_WRITE_BPS, Plan, nbytes, plan_scan, step_seconds
from .sweeps import checkpointed

__all__ = ["Plan", "checkpoint_scan", "plan_scan"]


def checkpoint_scan(step: Any, carry: Any, xs: Any = None, *, length: int | None = None,
                    memory_budget: int | str | None = None, storage: Any = None,
                    interval: int | str = "auto", compression: Any = None,
                    reverse: bool = False, **options: Any) -> tuple[Any, Any]:
    """``jax.lax.scan(step, carry, xs, length)``, differentiable in bounded memory: the forward
    sweep sends every segment's first carry to asyncckpt's Level-2 (host memory within the
    budget, the disk beyond it) through host callbacks, and the backward takes them back in
    reverse order, recomputing and back-propagating one segment at a time.

    Parameters
    ----------
    step : callable
        ``step(carry, x) -> (carry, y)``, traceable by JAX; the carry it returns of the
        structure, shapes and dtypes it was given.
    carry : pytree of arrays
        The initial carry (floating leaves: it is differentiated).
    xs : pytree of arrays, optional
        Scanned along their first dimension; None with ``length``.
    length : int, optional
        The steps, where ``xs`` is None (or to check it).
    memory_budget : int or str, optional
        Bytes for one segment's backward and the checkpointer (its buffers and the carries it
        keeps in DRAM); default: a quarter of the available memory.
    storage, compression, **options
        As :class:`~asyncckpt.AsyncCheckpointer`'s: Level-2 beyond the budget (default: the
        temporary directory), a codec for the carries.
    interval : int or "auto"
        Steps per segment; "auto": see :func:`plan_scan`.
    reverse : bool
        As ``lax.scan``'s: the steps run from the last of ``xs`` to the first.

    Returns
    -------
    (final carry, stacked ys)
        As ``lax.scan`` returns them. Differentiable (``jax.grad``, ``jax.vjp``, under
        ``jax.jit``) with respect to ``carry``, ``xs`` and the arrays ``step`` closes over.
    """
    check_carry(carry)
    xs_leaves = check_leaves(xs, "xs") if xs is not None else []
    n = scan_length([tuple(leaf.shape) for leaf in xs_leaves], length, "length")
    check_interval(interval)
    check_options(options)
    in_memory = check_storage(storage)
    codec = check_compression(compression,
                              [leaf.dtype for leaf in jax.tree_util.tree_leaves(carry)])
    if reverse:
        flip = partial(jax.tree_util.tree_map, lambda leaf: jnp.flip(leaf, 0))
        final, ys = checkpoint_scan(step, carry, None if xs is None else flip(xs), length=length,
                                    memory_budget=memory_budget, storage=storage,
                                    interval=interval, compression=compression, **options)
        return final, None if ys is None else flip(ys)
    x0 = None if xs is None else jax.tree_util.tree_map(lambda leaf: leaf[0], xs)
    fn, consts = jax.closure_convert(step, carry, x0)
    returned, y0 = jax.eval_shape(fn, carry, x0, *consts)
    check_returned(carry, returned)
    carry_bytes = nbytes(carry)
    budget = None if memory_budget is None else parse_bytes("memory_budget", memory_budget)
    # the step is compiled and timed for "auto" alone
    step_s = step_seconds(fn, carry, x0, consts) if interval == "auto" else None
    chosen, chunk, checkpointer_budget = plan_scan(
        n, carry_bytes, step_residual_bytes(fn, carry, x0, consts), step_s,
        memory_budget=budget, interval=interval if interval == "auto" else min(interval, n),
        write_bps=RUNS.write_bps or PRIOR_WRITE_BPS, engine_states=engine_states(options, codec),
        fixed_bytes=fixed_bytes(carry_bytes, consts), level2_in_memory=in_memory)
    if compression is not None:
        options["compression"] = compression
    plan = Plan(n, chosen, chunk, tuple(sorted({
        **options, "storage": storage, "memory_budget": checkpointer_budget}.items())))
    RUNS.last_plan = plan
    return checkpointed(fn, plan, carry, xs, list(consts))
