"""``checkpoint_scan``: ``jax.lax.scan`` whose carries stream to host memory and disk."""
from __future__ import annotations

import math
import time
from dataclasses import dataclass
from functools import partial
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
from jax import lax

from ..planning import default_budget, engine_buffers, parse_bytes, scan_length, state_bytes
from . import wire
from .callbacks import ordered, told
from .checks import (check_carry, check_compression, check_interval, check_leaves, check_options,
                     check_returned, check_storage, engine_states, least_budget)
from .host import RUNS, HostRun

__all__ = ["Plan", "checkpoint_scan", "plan_scan"]

#: The share of the budget one segment's backward (its steps' residuals, stored all) may take;
#: the checkpointer keeps the rest for its buffers and Level-2 in DRAM.
SEGMENT_SHARE = 0.75
#: What a segment costs beyond its steps, measured on this machine's CPU: two host callbacks
#: (96 and 57 us with a 64 KiB carry), the checkpointer's step with a Level-2 transfer each way
#: (126 us) and two handoffs between threads.
SEGMENT_S = 5e-4
#: A carry's write before a run in this process has measured Level-2's (``RUNS.write_bps``):
#: a disk's rate.
PRIOR_WRITE_BPS = 1e9
#: Segments at least this many forward steps long per segment's cost (and per carry's write),
#: so that the segments cost at most about 5% of a run (a step forward, again in the backward,
#: and its backward: some 4 forward steps).
HIDE = 5.0
#: The lengths of two scans timed to price a step by their difference, a compiled call's own
#: cost left out: one scan of 32 wave steps (64 x 64) priced a step at twice its 7.4 us in a
#: run, and "auto" stored residuals in segments of 37 steps where chunks of 330 ran faster.
TIMED_STEPS = (32, 160)


@dataclass(frozen=True)
class Plan:
    """How a scan is cut and checkpointed: ``n`` steps in segments of ``interval`` (the last
    may be shorter), each segment's first carry on Level-2, its backward storing its steps'
    residuals (``chunk`` 0), or recomputing them: it keeps the first carry of every ``chunk``
    steps and runs each chunk again, its residuals stored, to back-propagate through it
    (``chunk`` 1: a carry kept per step)."""

    n: int
    interval: int
    chunk: int
    options: tuple[tuple[str, Any], ...]

    @property
    def full(self) -> int:
        """Segments of ``interval`` steps."""
        return self.n // self.interval

    @property
    def rest(self) -> int:
        """Steps of the shorter last segment (0: none)."""
        return self.n - self.full * self.interval

    @property
    def segments(self) -> int:
        return self.full + (1 if self.rest else 0)


def _nbytes(tree: Any) -> int:
    return sum(wire.leaf_bytes(leaf.shape, leaf.dtype) for leaf in jax.tree_util.tree_leaves(tree))


def _step_seconds(fn: Any, carry: Any, x: Any, consts: list[Any]) -> float:
    """A step's seconds inside a compiled scan, from scans of :data:`TIMED_STEPS` (medians of
    5 after a warm call each), on zeros of the carry's shapes."""
    def timed(length: int) -> float:
        def scan(c: Any, x: Any, *k: Any) -> Any:
            xs = jax.tree_util.tree_map(
                lambda leaf: jnp.broadcast_to(leaf, (length, *leaf.shape)), x)
            return lax.scan(lambda c, x: fn(c, x, *k), c, xs, length=length)
        compiled = jax.jit(scan)
        zeros = partial(jax.tree_util.tree_map, lambda leaf: jnp.zeros(leaf.shape, leaf.dtype))
        args = (zeros(carry), zeros(x), *zeros(consts))
        jax.block_until_ready(compiled(*args))
        seconds = []
        for _ in range(5):
            start = time.perf_counter()
            jax.block_until_ready(compiled(*args))
            seconds.append(time.perf_counter() - start)
        return float(np.median(seconds))

    short, long = TIMED_STEPS
    # evaluated now, also where an outer jax.jit is tracing the scan
    with jax.ensure_compile_time_eval():
        short_s, long_s = timed(short), timed(long)
    slope = (long_s - short_s) / (long - short)
    return slope if slope > 0 else long_s / long


def plan_scan(n: int, carry_bytes: int, residual_bytes: int, step_s: float | None, *,
              memory_budget: int | None, interval: int | str = "auto",
              write_bps: float = PRIOR_WRITE_BPS,
              engine_states: int | None = None) -> tuple[int, int, int]:
    """The interval, the chunk of a segment's recomputation (``Plan.chunk``; 0: none) and
    the checkpointer's memory budget, for ``n`` steps whose carry takes ``carry_bytes``, whose
    backward keeps ``residual_bytes`` a step and whose forward takes ``step_s`` (needed for
    "auto" alone).

    "auto": segments long enough that their cost (``SEGMENT_S``) and a carry's write
    take ``HIDE`` times less than their steps, and at least sqrt(n) steps (as many carries
    on Level-2 as steps in a segment), within what ``SEGMENT_SHARE`` of the budget holds of
    the segment's backward. Where the budget cuts segments shorter than that storing their
    steps' residuals, or holds no step's residuals at all, segments recompute them (a forward
    step more per step) where that costs less than the shorter segments: in chunks of about
    sqrt(interval x carry / residuals) steps, whose first carries a segment keeps, each
    chunk's residuals stored while it is back-propagated, which holds segments of as many
    steps as the share's square over four carries' and residuals' bytes (a carry a step
    holds a share over two carries). A given interval recomputes where its steps' residuals
    do not fit that share. The checkpointer gets the rest of the budget, and at least a carry
    more than ``engine_states`` (its transfer buffers; default ``engine_buffers()``'s): a
    budget below that is refused (``asyncckpt.jax.checks.least_budget``).
    """
    budget = default_budget(carry_bytes) if memory_budget is None else memory_budget
    share = int(SEGMENT_SHARE * budget)
    stored, kept = residual_bytes + carry_bytes, 2 * carry_bytes

    def memory(length: int, chunk: int) -> int:
        # a backward holds one step's residuals whatever the plan: chunks hold the rest
        return length * stored if chunk == 0 else \
            -(-length // chunk) * kept + (chunk - 1) * stored

    def recomputing(length: int) -> int:
        """The chunk that keeps a segment of ``length`` steps in the least memory."""
        guess = max(1, min(length, round(math.sqrt(length * kept / max(stored, 1)))))
        return min({max(1, guess - 1), guess, min(length, guess + 1)},
                   key=lambda chunk: (memory(length, chunk), chunk))

    if isinstance(interval, int):
        chosen = interval
        chunk = 0 if interval * stored <= share else recomputing(interval)
    else:
        if step_s is None:
            raise ValueError("plan_scan needs the step's seconds for interval='auto'")
        step_s = max(step_s, 1e-9)
        segment_s = SEGMENT_S + carry_bytes / write_bps
        wanted = min(n, max(math.isqrt(n), math.ceil(HIDE * segment_s / step_s)))
        # the longest segment whose recomputing backward fits (memory grows with length)
        low, high = 1, wanted
        while low < high:
            middle = (low + high + 1) // 2
            low, high = (middle, high) if memory(middle, recomputing(middle)) <= share \
                else (low, middle - 1)
        options = [(n * step_s + math.ceil(n / low) * segment_s, low, recomputing(low))]
        if stored <= share:
            length = min(wanted, share // stored)
            options.append((math.ceil(n / length) * segment_s, length, 0))
        _, chosen, chunk = min(options)
    # the checkpointer's transfer buffers and its live state, at the least
    least = least_budget(budget, carry_bytes,
                         engine_buffers() if engine_states is None else engine_states)
    return chosen, chunk, max(budget - memory(chosen, chunk), least)


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
    check_storage(storage)
    check_compression(compression, [leaf.dtype for leaf in jax.tree_util.tree_leaves(carry)])
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
    # what a step's backward keeps: the residuals of its cotangents in the carry and the
    # closed-over arrays
    residuals = jax.eval_shape(
        lambda c, x, *k: jax.tree_util.tree_leaves(
            jax.vjp(lambda c, *k: fn(c, x, *k), c, *k)[1]),
        carry, x0, *consts)
    budget = None if memory_budget is None else parse_bytes("memory_budget", memory_budget)
    # the step is compiled and timed for "auto" alone
    step_s = _step_seconds(fn, carry, x0, consts) if interval == "auto" else None
    chosen, chunk, checkpointer_budget = plan_scan(
        n, _nbytes(carry), _nbytes(residuals), step_s, memory_budget=budget,
        interval=interval if interval == "auto" else min(interval, n),
        write_bps=RUNS.write_bps or PRIOR_WRITE_BPS,
        engine_states=engine_states(options, compression))
    if compression is not None:
        options["compression"] = compression
    plan = Plan(n, chosen, chunk, tuple(sorted({
        **options, "storage": storage, "memory_budget": checkpointer_budget}.items())))
    RUNS.last_plan = plan
    return _checkpointed(fn, plan, carry, xs, list(consts))


def _segments(tree: Any, plan: Plan) -> tuple[Any, Any]:
    """``tree``'s leaves (steps first) as the full segments, (full, interval, ...), and the
    rest, (rest, ...)."""
    cut = plan.full * plan.interval
    main = jax.tree_util.tree_map(
        lambda leaf: leaf[:cut].reshape(plan.full, plan.interval, *leaf.shape[1:]), tree)
    rest = jax.tree_util.tree_map(lambda leaf: leaf[cut:], tree)
    return main, rest


def _joined(main: Any, rest: Any, plan: Plan) -> Any:
    """The inverse of :func:`_segments`."""
    def join(a: Any, b: Any) -> Any:
        parts = [] if plan.full == 0 else [a.reshape(plan.full * plan.interval, *a.shape[2:])]
        return jnp.concatenate(parts + ([b] if plan.rest else []))
    if plan.full == 0:
        return rest
    if plan.rest == 0:
        return jax.tree_util.tree_map(lambda a: a.reshape(-1, *a.shape[2:]), main)
    return jax.tree_util.tree_map(join, main, rest)


def _body(fn: Any, consts: list[Any]) -> Any:
    return lambda c, x: fn(c, x, *consts)


def _recomputing(body: Any, c: Any, xs: Any, length: int, chunk: int) -> Any:
    """``lax.scan(body, c, xs, length)`` whose backward recomputes its residuals in chunks of
    ``chunk`` steps (``Plan.chunk``; 0: stores them all; 1: a carry kept per step)."""
    if chunk == 1:
        return lax.scan(jax.checkpoint(body), c, xs, length=length)
    if chunk == 0 or length <= chunk:
        return lax.scan(body, c, xs, length=length)
    # chunks as a plan's segments: the full ones, then a shorter rest of plain steps
    pieces = Plan(length, chunk, 0, ())
    xs_main, xs_rest = _segments(xs, pieces) if xs is not None else (None, None)
    c, ys_main = lax.scan(jax.checkpoint(lambda c, x: lax.scan(body, c, x, length=chunk)),
                          c, xs_main, length=pieces.full)
    ys_rest = None
    if pieces.rest:
        c, ys_rest = lax.scan(body, c, xs_rest, length=pieces.rest)
    return c, None if ys_main is None else _joined(ys_main, ys_rest, pieces)


@partial(jax.custom_vjp, nondiff_argnums=(0, 1))
def _checkpointed(fn: Any, plan: Plan, carry: Any, xs: Any, consts: list[Any]) -> Any:
    return lax.scan(_body(fn, consts), carry, xs, length=plan.n)


def _open(plan: Plan, shapes: tuple[tuple[int, ...], ...], dtypes: tuple[str, ...],
          _carry: Any) -> Any:
    """A run for one differentiated call; its key (``_carry`` only ties the call to the loop
    iteration it belongs to)."""
    key = RUNS.open(lambda: HostRun(shapes, dtypes, plan.segments, dict(plan.options)))
    return np.int32(key)


def _put(shapes: tuple[tuple[int, ...], ...], dtypes: tuple[str, ...], packed: Any) -> Any:
    """Hand a segment's first carry to its run; the run's key back (what the next put and the
    backward read)."""
    key, segment, leaves = wire.unpack(packed, shapes, dtypes)
    try:
        RUNS[key].put(segment, leaves)
    except BaseException as failure:
        RUNS.fail(key, failure)
        raise
    return np.int32(key)


def _get(treedef: Any, ids: Any) -> Any:
    key, segment = (int(value) for value in np.asarray(ids))
    try:
        leaves = RUNS[key].get(segment)
        if segment == 0:
            RUNS.close(key)
        return jax.tree_util.tree_unflatten(treedef, leaves)
    except BaseException as failure:
        RUNS.fail(key, failure)
        raise


def _forward(fn: Any, plan: Plan, carry: Any, xs: Any, consts: list[Any]) -> Any:
    leaves = jax.tree_util.tree_leaves(carry)
    layout = (tuple(tuple(leaf.shape) for leaf in leaves),
              tuple(str(leaf.dtype) for leaf in leaves))
    # the key and every put depend on the carry, and each put on the one before it: inside
    # a differentiated outer scan, JAX hoists out of the loop what depends on no loop value
    # (an open taking nothing ran once for every iteration) and drops effects whose results
    # nothing reads (the puts were gone, the backward found no carries)
    key = ordered(partial(_open, plan, *layout), jax.ShapeDtypeStruct((), jnp.int32),
                  jnp.ravel(leaves[0])[:1])
    body = _body(fn, consts)
    xs_main, xs_rest = _segments(xs, plan) if xs is not None else (None, None)

    def put(key: Any, s: Any, c: Any) -> Any:
        return ordered(partial(_put, *layout), jax.ShapeDtypeStruct((), jnp.int32),
                       wire.pack(key, s, jax.tree_util.tree_leaves(c)))

    def segment(carried: Any, inputs: Any) -> Any:
        (c, key), (s, xseg) = carried, inputs
        key = put(key, s, c)
        c, yseg = lax.scan(body, c, xseg, length=plan.interval)
        return (c, key), yseg

    c, ys_main, ys_rest = carry, None, None
    if plan.full:
        (c, key), ys_main = lax.scan(segment, (c, key), (jnp.arange(plan.full), xs_main))
    if plan.rest:
        key = put(key, plan.full, c)
        c, ys_rest = lax.scan(body, c, xs_rest, length=plan.rest)
    ys = _joined(ys_main, ys_rest, plan) if (ys_main if plan.full else ys_rest) is not None \
        else None
    return (c, ys), (key, xs, consts)


def _backward(fn: Any, plan: Plan, saved: Any, cts: Any) -> Any:
    key, xs, consts = saved
    ct_final, ct_ys = cts
    carry_struct = jax.tree_util.tree_map(lambda a: jax.ShapeDtypeStruct(a.shape, a.dtype),
                                          ct_final)
    treedef = jax.tree_util.tree_structure(ct_final)

    def reverse_segment(c_s: Any, xseg: Any, length: int, ct_c: Any, ct_k: Any,
                        ct_yseg: Any) -> Any:
        # the segment's steps again (every residual kept, or in chunks) and its backward; the
        # closed-over arrays' cotangents of the segment are added to those of the segments
        # after it (the plain scan adds each step's one by one: a few ulps apart)
        def run(c: Any, k: list[Any], xseg: Any) -> Any:
            return _recomputing(_body(fn, k), c, xseg, length, plan.chunk)
        _, vjp = jax.vjp(run, c_s, consts, xseg)
        ct_c, ct_k_segment, ct_xseg = vjp((ct_c, ct_yseg))
        ct_k = jax.tree_util.tree_map(jnp.add, ct_k, ct_k_segment)
        return ct_c, ct_k, ct_xseg

    def fetch(s: Any) -> Any:
        return ordered(partial(_get, treedef), carry_struct, wire.ids(key, s))

    xs_main, xs_rest = _segments(xs, plan) if xs is not None else (None, None)
    ct_main, ct_rest = _segments(ct_ys, plan) if ct_ys is not None else (None, None)
    ct_c, ct_k = ct_final, jax.tree_util.tree_map(jnp.zeros_like, consts)
    ct_x_main = ct_x_rest = None
    if plan.rest:
        ct_c, ct_k, ct_x_rest = reverse_segment(fetch(plan.full), xs_rest, plan.rest, ct_c,
                                                ct_k, ct_rest)
    if plan.full:
        def back(acc: Any, inputs: Any) -> Any:
            s, xseg, ct_yseg = inputs
            ct_c, ct_k, ct_xseg = reverse_segment(fetch(s), xseg, plan.interval, acc[0], acc[1],
                                                  ct_yseg)
            return (ct_c, ct_k), ct_xseg
        (ct_c, ct_k), ct_x_main = lax.scan(back, (ct_c, ct_k),
                                           (jnp.arange(plan.full), xs_main, ct_main),
                                           reverse=True)
    ct_xs = None if xs is None else _joined(ct_x_main, ct_x_rest, plan)
    return ct_c, ct_xs, ct_k


_checkpointed.defvjp(told(_forward), told(_backward))
