"""The forward and backward sweeps of ``checkpoint_scan``, as one ``jax.custom_vjp``
(:func:`checkpointed`): the forward sends each segment's first carry to a host run through
ordered callbacks; the backward takes them back in reverse order, recomputing and
back-propagating one segment at a time."""
from __future__ import annotations

from functools import partial
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
from jax import lax

from . import wire
from .callbacks import ordered, told
from .host import RUNS, HostRun
from .scan_plan import Plan

__all__ = ["checkpointed"]


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


def _summed(consts: list[Any]) -> list[int]:
    """The closed-over arrays whose cotangents are summed: the floating ones."""
    return [i for i, k in enumerate(consts) if jnp.issubdtype(k.dtype, jnp.inexact)]


def _summing(fn: Any, consts: list[Any]) -> Any:
    """The step as a scan body over ``(carry, sums)``: ``sums`` (one per floating closed-over
    array) passes through the step, and its cotangent gets the step's cotangents of those
    arrays added. Carried through a segment's backward from the later segments' running sum,
    it adds them one step at a time from the last, as ``lax.scan``'s backward does. The step
    itself passes ``sums`` on: of a carry the body passed on unchanged JAX would make a
    constant, its cotangent summed apart from zero. The step uses the arrays themselves, so
    JAX keeps what it saves of them once, not per step."""
    index = _summed(consts)

    @jax.custom_vjp
    def step(c: Any, x: Any, sums: list[Any], k: list[Any]) -> Any:
        c, y = fn(c, x, *k)
        return c, y, sums

    def forward(c: Any, x: Any, sums: list[Any], k: list[Any]) -> Any:
        (c, y), vjp = jax.vjp(lambda c, x, *k: fn(c, x, *k), c, x, *k)
        return (c, y, sums), vjp

    def backward(vjp: Any, cts: Any) -> Any:
        ct_c, ct_y, ct_sums = cts
        ct_c, ct_x, *ct_k = vjp((ct_c, ct_y))
        return (ct_c, ct_x, [total + ct_k[i] for i, total in zip(index, ct_sums)],
                list(ct_k))

    step.defvjp(forward, backward)

    def body(carried: Any, x: Any) -> Any:
        c, y, sums = step(carried[0], x, carried[1], list(consts))
        return (c, sums), y
    return body


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
def checkpointed(fn: Any, plan: Plan, carry: Any, xs: Any, consts: list[Any]) -> Any:
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
        c, key = carried
        s, xseg = inputs
        key = put(key, s, c)
        c, yseg = lax.scan(body, c, xseg, length=plan.interval)
        return (c, key), yseg

    c = carry
    ys_main = None
    ys_rest = None
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
    index = _summed(consts)

    def reverse_segment(c_s: Any, xseg: Any, length: int, ct_c: Any, ct_k: Any,
                        ct_yseg: Any) -> Any:
        # the segment's steps again (every residual kept, or in chunks) and its backward, which
        # adds each step's cotangents of the closed-over arrays to the running sum of the later
        # segments' it is handed, one step at a time from the last (lax.scan's order, bit for
        # bit; a segment's own sum added to the later ones' was a few ulps apart)
        def run(c: Any, sums: list[Any], xseg: Any) -> Any:
            return _recomputing(_summing(fn, consts), (c, sums), xseg, length, plan.chunk)
        sums = [ct_k[i] for i in index]
        _, vjp = jax.vjp(run, c_s, sums, xseg)
        ct_c, sums, ct_xseg = vjp(((ct_c, sums), ct_yseg))
        ct_k = list(ct_k)
        for i, total in zip(index, sums):
            ct_k[i] = total
        return ct_c, ct_k, ct_xseg

    def fetch(s: Any) -> Any:
        return ordered(partial(_get, treedef), carry_struct, wire.ids(key, s))

    xs_main, xs_rest = _segments(xs, plan) if xs is not None else (None, None)
    ct_main, ct_rest = _segments(ct_ys, plan) if ct_ys is not None else (None, None)
    ct_c = ct_final
    ct_k = jax.tree_util.tree_map(jnp.zeros_like, consts)
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


checkpointed.defvjp(told(_forward), told(_backward))
