"""The planning entry the adapters (:mod:`asyncckpt.compat`, :mod:`asyncckpt.torch`, an
adapter of your own) build on: how options are read and checked, and how much memory a plan
may take, without reaching into the runtime's private rooms (docs/architecture.md)."""
from __future__ import annotations

from ._execution.ranks import world_if_running
from ._memory.buffers import padded
from ._memory.numa import check_node
from ._planning.budget import (DEFAULT_STAGING_BUFFERS, MEMORY_SHARE, available_memory,
                               codec_threads, default_bound, engine_buffers)
from ._planning.environment import Environment, environment
from ._planning.options import (check_choice, check_int, check_operator, parse_bytes,
                                parse_flag, parse_interval)
from .errors import InvalidValueError, MemoryBudgetError

__all__ = ["DEFAULT_STAGING_BUFFERS", "Environment", "MEMORY_SHARE", "available_memory",
           "check_choice",
           "check_int", "check_node", "check_operator", "choose_l1_slots", "codec_threads",
           "default_budget",
           "engine_buffers", "environment", "parse_bytes", "parse_flag", "parse_interval",
           "scan_length", "state_bytes", "world_if_running"]


def scan_length(shapes: list[tuple[int, ...]], given: int | None, name: str) -> int:
    """The steps of a scan over ``xs`` whose leaves have ``shapes`` (steps first), or
    ``given`` (the argument ``name``) where there are none; both must agree.

    Raises
    ------
    InvalidValueError
        Leaves without a first dimension or of different lengths, ``given`` disagreeing with
        them, or fewer than one step.
    """
    lengths = {int(shape[0]) if len(shape) else -1 for shape in shapes}
    if -1 in lengths or len(lengths) > 1:
        raise InvalidValueError(f"xs leaves must share their first dimension (the steps), got "
                                f"shapes {[tuple(shape) for shape in shapes]}")
    n = lengths.pop() if lengths else given
    if given is not None and n != given:
        raise InvalidValueError(f"{name}={given} but xs hold {n} steps")
    if isinstance(n, bool) or not isinstance(n, int) or n < 1:
        raise InvalidValueError(f"checkpoint_scan needs n >= 1 steps: xs with a first "
                                f"dimension, or {name}; got {n!r}")
    return n


def state_bytes(nbytes: int) -> int:
    """Bytes a state of ``nbytes`` takes in a Level-1 slot or an engine buffer (page-padded)."""
    return padded(nbytes)


def default_budget(nbytes: int, available: int | None = None,
                   environment: Environment | None = None) -> int:
    """The memory budget of ``n_checkpoints=None``: ``$ASYNCCKPT_MEMORY_BUDGET`` where
    ``environment`` (default: the variables as they are now) sets it, else a quarter of the
    available memory (psutil; what asyncckpt's pool keeps for reuse counts as
    available). It bounds Level-1 slots, staging and prefetch buffers and DRAM Level-2 together;
    Level-2 beyond it goes to the temporary directory (unless ``storage`` says where).

    Raises
    ------
    MemoryBudgetError
        If a quarter of the available memory holds no state beside the staging and prefetch
        buffers.
    """
    environment = Environment.read() if environment is None else environment
    if environment.memory_budget_text is None:
        available = available_memory() if available is None else available
        _slots_in_share(nbytes, available)  # refuses a share with no slot beside the buffers
    return default_bound(environment, available)


def choose_l1_slots(nbytes: int, n_timesteps: int, available: int | None = None) -> int:
    """Level-1 slots for ``n_checkpoints=None``: as many states as fit in a quarter of the
    available memory (psutil; what asyncckpt's pool keeps for reuse counts as available),
    beside the staging and prefetch buffers, at most n. Slots are allocated only when a
    schedule uses them."""
    if available is None:
        available = available_memory()
    return min(_slots_in_share(nbytes, available), n_timesteps)


def _slots_in_share(nbytes: int, available: int) -> int:
    """Level-1 slots of ``nbytes`` that :data:`MEMORY_SHARE` of ``available`` bytes holds
    beside the staging and prefetch buffers (at least 1, else raise)."""
    fit = int(MEMORY_SHARE * available // padded(nbytes)) - engine_buffers()
    if fit < 1:
        raise MemoryBudgetError(
            f"a state of {nbytes} bytes leaves no room for a Level-1 slot in "
            f"{MEMORY_SHARE:.0%} of the {available / 2**30:.2f} GiB available"
        )
    return fit
