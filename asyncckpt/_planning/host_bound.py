"""The default bound: the host memory a checkpointer holds where no ``memory_budget`` is
given and Level-2 keeps states in host memory, and the room a NUMA node bound to Level-1
has."""
from __future__ import annotations

from typing import TYPE_CHECKING

import psutil

from .._memory.buffers import padded
from .._memory.numa import node_memory
from .._memory.pool import POOL
from ..errors import MemoryBudgetError
from ..storage.kept import kept_ram_bytes
from .environment import Environment

if TYPE_CHECKING:
    from .budget import MemoryPlan

__all__ = ["MEMORY_SHARE", "available_memory", "bound_source", "check_node_holds",
           "default_bound"]

#: Share of the available memory a checkpointer keeps in host memory where no budget is given.
MEMORY_SHARE = 0.25


def available_memory() -> int:
    """Memory available to a new checkpointer: the system's (psutil) and what asyncckpt's pool
    and kept files in RAM keep for reuse."""
    return psutil.virtual_memory().available + POOL.nbytes + kept_ram_bytes()


def default_bound(environment: Environment, available: int | None = None) -> int:
    """Bytes of host memory a checkpointer holds where no budget is given:
    ``$ASYNCCKPT_MEMORY_BUDGET`` where ``environment`` (the construction's) sets it, else
    :data:`MEMORY_SHARE` of ``available`` (default :func:`available_memory`)."""
    bound = environment.memory_budget
    if bound is not None:
        return bound
    return int(MEMORY_SHARE * (available_memory() if available is None else available))


def bound_source(environment: Environment) -> str:
    """Where :func:`default_bound` takes its bytes from under ``environment``, for messages."""
    if environment.memory_budget_text is not None:
        return "$ASYNCCKPT_MEMORY_BUDGET"
    return f"{MEMORY_SHARE:.0%} of the available memory"


def check_node_holds(node: int | None, memory: "MemoryPlan", l1_slots: int, in_level1: bool,
                     slots_fixed: bool) -> None:
    """Raise unless NUMA ``node`` (``l1_node``; None: unbound) has room for the most Level-1
    may take: ``l1_slots`` slots (and the engine's buffers) where fixed, else the whole
    ``memory_budget``, which "auto" may give to slots. Memory bound to a node
    never spills to another: a fault beyond it meets the out-of-memory killer."""
    if node is None:
        return
    need = memory.l1_bytes(l1_slots, in_level1)
    if not slots_fixed and memory.budget is not None:
        need = max(need, memory.budget.buffers * padded(memory.nbytes))
    available = node_memory(node).available + POOL.nbytes  # the pool's may be the node's
    if need > available:
        hint = "" if slots_fixed else ", or fix l1_slots (\"auto\" may give slots the budget)"
        raise MemoryBudgetError(
            f"Level-1 may need {need} bytes on NUMA node {node} (l1_node={node}), which has "
            f"{available} available: give fewer l1_slots or a smaller memory_budget{hint}")
