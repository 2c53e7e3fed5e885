"""PyTorch: a scan whose backward runs asyncckpt, for sequences longer than memory.

``checkpoint_scan(step, carry, xs)`` has ``jax.lax.scan``'s meaning, ``step(carry, x_t) ->
(carry_next, y_t)``, and returns the final carry and the stacked outputs, differentiable with
respect to the initial carry, ``xs`` and the parameters ``step`` closes over. The forward sweep
runs without building a graph and checkpoints carries (every I-th to Level-2 on the I/O
threads, Revolve inside each interval, within ``memory_budget``); the backward re-runs each step
from its restored carry under ``enable_grad`` and back-propagates through that step alone, in
reverse order, so memory is that of one step's graph plus the checkpoints, whatever n.

Imports torch; the rest of asyncckpt never imports this module.
"""
from __future__ import annotations

from .function import last_stats
from .passes import activation_shapes
from .scan import checkpoint_scan
from .sequential import checkpoint_sequential
from .trees import closed_over_parameters, saved_bytes

__all__ = ["checkpoint_scan", "checkpoint_sequential", "closed_over_parameters",
           "activation_shapes", "last_stats", "saved_bytes"]
