"""JAX: a scan whose carries stream to host memory and disk, under ``jax.jit`` and ``jax.grad``.

``checkpoint_scan(step, carry, xs)`` has ``jax.lax.scan``'s meaning and returns the final carry
and the stacked outputs, differentiable with respect to the initial carry, ``xs`` and the
arrays ``step`` closes over. Its backward is a ``jax.custom_vjp``: the forward sweep runs the
scan in segments and hands each segment's first carry to an :class:`~asyncckpt.AsyncCheckpointer`
through host callbacks that return once the carry is copied (the write runs on its I/O threads,
within the memory budget, in DRAM then on disk); the backward takes them back in reverse order,
prefetched, and recomputes and back-propagates one segment at a time.

Imports JAX; the rest of asyncckpt never imports this module.
"""
from __future__ import annotations

from .host import end_open_runs, last_plan, last_stats
from .scan import Plan, checkpoint_scan, plan_scan

__all__ = ["Plan", "checkpoint_scan", "end_open_runs", "last_plan", "last_stats", "plan_scan"]
