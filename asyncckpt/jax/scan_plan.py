"""How ``checkpoint_scan`` cuts a scan: its :class:`Plan` (segments on Level-2, the chunks a
segment's backward recomputes) and :func:`plan_scan`, which chooses them from the carry's and
the residuals' bytes, a step's seconds and the memory budget."""
from __future__ import annotations

import math
import time
from collections.abc import Callable
from dataclasses import dataclass
from functools import partial
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
from jax import lax

from ..errors import MemoryBudgetError
from ..planning import default_budget, engine_buffers, state_bytes
from . import wire
from .checks import least_budget

__all__ = ["HIDE", "PRIOR_WRITE_BPS", "Plan", "SEGMENT_S", "SEGMENT_SHARE", "TIMED_STEPS",
           "nbytes", "plan_scan", "step_seconds"]

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
        """Segments of the scan: the full ones and the shorter last one where there is one."""
        return self.full + (1 if self.rest else 0)


def nbytes(tree: Any) -> int:
    """The bytes of ``tree``'s leaves as the wire carries them."""
    return sum(wire.leaf_bytes(leaf.shape, leaf.dtype) for leaf in jax.tree_util.tree_leaves(tree))


def step_seconds(fn: Any, carry: Any, x: Any, consts: list[Any]) -> float:
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
        short_s = timed(short)
        long_s = timed(long)
    slope = (long_s - short_s) / (long - short)
    return slope if slope > 0 else long_s / long


def plan_scan(n: int, carry_bytes: int, residual_bytes: int, step_s: float | None, *,
              memory_budget: int | None, interval: int | str = "auto",
              write_bps: float = PRIOR_WRITE_BPS, engine_states: int | None = None,
              fixed_bytes: int = 0, level2_in_memory: bool = False) -> tuple[int, int, int]:
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
    do not fit that share. ``fixed_bytes``: what the scan holds whatever the plan
    (``asyncckpt.jax.held.fixed_bytes``), taken off the budget first. The checkpointer
    gets the rest, and at least a carry more than ``engine_states`` (its transfer buffers;
    default ``engine_buffers()``'s): a budget below that, the fixed bytes and the chosen
    segment's is refused (``asyncckpt.jax.checks.least_budget``).

    ``level2_in_memory``: every Level-2 tier keeps its states in RAM, within the budget (none
    spills): the checkpointer then holds every segment's first carry, and the plan is cut so
    that they fit beside what the scan holds (``_fit_in_memory``).
    """
    budget = default_budget(carry_bytes) if memory_budget is None else memory_budget
    engine = engine_buffers() if engine_states is None else engine_states
    left = budget - fixed_bytes
    # the checkpointer's least (a carry beside its transfer buffers) comes first
    share = max(min(int(SEGMENT_SHARE * left), left - (engine + 1) * state_bytes(carry_bytes)), 0)
    stored = residual_bytes + carry_bytes
    kept = 2 * carry_bytes

    def memory(length: int, chunk: int) -> int:
        # a backward holds one step's residuals whatever the plan: chunks hold the rest
        return length * stored if chunk == 0 else \
            -(-length // chunk) * kept + (chunk - 1) * stored

    def recomputing(length: int) -> int:
        """The chunk that keeps a segment of ``length`` steps in the least memory."""
        guess = max(1, min(length, round(math.sqrt(length * kept / max(stored, 1)))))
        return min({max(1, guess - 1), guess, min(length, guess + 1)},
                   key=lambda chunk: (memory(length, chunk), chunk))

    if step_s is None and not isinstance(interval, int):
        raise ValueError("plan_scan needs the step's seconds for interval='auto'")
    segment_s = SEGMENT_S + carry_bytes / write_bps
    wanted = 1 if step_s is None else \
        min(n, max(math.isqrt(n), math.ceil(HIDE * segment_s / max(step_s, 1e-9))))
    if level2_in_memory:
        chosen, chunk = _fit_in_memory(
            n, state_bytes(carry_bytes), left, memory, recomputing, interval,
            lambda length, chunk: (n * (step_s or 0.0) if chunk else 0.0)
            + math.ceil(n / min(length, wanted)) * segment_s, budget, fixed_bytes)
        return chosen, chunk, budget - fixed_bytes - memory(chosen, chunk)
    if isinstance(interval, int):
        chosen = interval
        chunk = 0 if interval * stored <= share else recomputing(interval)
    else:
        assert step_s is not None
        step_s = max(step_s, 1e-9)
        # the longest segment whose recomputing backward fits (memory grows with length)
        low = 1
        high = wanted
        while low < high:
            middle = (low + high + 1) // 2
            if memory(middle, recomputing(middle)) <= share:
                low = middle
            else:
                high = middle - 1
        options = [(n * step_s + math.ceil(n / low) * segment_s, low, recomputing(low))]
        if stored <= share:
            length = min(wanted, share // stored)
            options.append((math.ceil(n / length) * segment_s, length, 0))
        _, chosen, chunk = min(options)
    # the checkpointer's transfer buffers and its live state, at the least
    held = fixed_bytes + memory(chosen, chunk)
    least = least_budget(budget, carry_bytes, engine, held)
    return chosen, chunk, max(budget - held, least)


def _lengths(n: int) -> list[int]:
    """Every segment length that cuts ``n`` steps into fewer segments than a length one shorter
    (``ceil(n / s)`` for every count ``s``), shortest first: some 2 sqrt(n) of them."""
    root = math.isqrt(n)
    return sorted(set(range(1, min(n, root + 1) + 1))
                  | {-(-n // count) for count in range(1, root + 2)})


def _fit_in_memory(n: int, carry: int, left: int, memory: Callable[[int, int], int],
                   recomputing: Callable[[int], int], interval: int | str,
                   seconds: Callable[[int, int], float], budget: int,
                   fixed: int) -> tuple[int, int]:
    """The interval and chunk where Level-2 is in RAM within the budget: a segment's backward
    (``memory``) beside its ``ceil(n / interval)`` first carries of ``carry`` bytes (padded),
    which the checkpointer keeps in its slots (its least: no transfer buffers) within the
    ``left`` bytes the scan's fixed ones leave; "auto" the fastest by ``seconds``, then the
    least memory. None fits: :class:`~asyncckpt.MemoryBudgetError` naming the bytes."""
    def need(length: int, chunk: int) -> int:
        return memory(length, chunk) + -(-n // length) * carry

    def fitted(length: int) -> tuple[int, int]:
        chunk = 0 if need(length, 0) <= left else recomputing(length)
        return need(length, chunk), chunk

    def least() -> tuple[int, int, int]:
        """The least bytes any interval needs, its chunk and the interval."""
        return min((need(length, chunk), chunk, length) for length in _lengths(n)
                   for chunk in (0, recomputing(length)))

    if isinstance(interval, int):
        total, chunk = fitted(interval)
        if total <= left:
            return interval, chunk
        fits = [length for length in _lengths(n) if fitted(length)[0] <= left]
        hint = (f"the shortest interval that fits is {fits[0]}, the longest {fits[-1]}" if fits
                else f"no interval fits: {fixed + least()[0]} bytes at the least")
        held = fixed + memory(interval, chunk)
        raise MemoryBudgetError(
            f"memory_budget of {budget} bytes cannot hold interval {interval} with Level-2 in "
            f"RAM (tiers in RAM, tmpfs directories included, count against it): its "
            f"{-(-n // interval)} carries of {carry} bytes beside the {held} bytes the scan "
            f"holds need {fixed + total} bytes; {hint}; give another interval, a larger "
            "budget or a disk tier")
    options = []
    for length in _lengths(n):
        for chunk in {0, recomputing(length)}:
            if need(length, chunk) <= left:
                options.append((seconds(length, chunk), need(length, chunk), length, chunk))
    if not options:
        total, chunk, length = least()
        carries = -(-n // length)
        raise MemoryBudgetError(
            f"memory_budget of {budget} bytes holds no plan with Level-2 in RAM (tiers in RAM, "
            f"tmpfs directories included, count against it): the least, segments of {length} "
            f"steps, needs {fixed + total} bytes, {carries} carries of {carry} bytes on "
            f"Level-2 beside the {fixed + memory(length, chunk)} bytes the scan holds; give a "
            "larger budget, or a disk tier")
    _, _, chosen, chunk = min(options)
    return chosen, chunk
