"""How a budget is shared between the checkpoints and a segment's graph, and where segments
start."""
from __future__ import annotations

import math
import os
from collections.abc import Callable, Sequence
from typing import Any


from ..errors import InvalidValueError, MemoryBudgetError
from ..planning import default_budget, engine_buffers, parse_bytes, state_bytes

__all__ = ["GRAPH_OVERHEAD", "SCAN_CHECKPOINTS_SHARE", "STACK_CHECKPOINTS_SHARE",
           "checkpoints_share", "graph_share", "in_segments", "segment_starts"]

# The share of a scan's budget its checkpoints keep; a segment's graph gets the rest. Each
# segment costs a call of the autograd engine, and a scan's carries beyond the budget go to
# Level-2, so longer segments pay more than Level-1 slots (docs/torch.md compares the shares).
SCAN_CHECKPOINTS_SHARE = 0.25
# A stack's: its activations are its checkpoints, and each is as large as a layer's graph.
STACK_CHECKPOINTS_SHARE = 0.5
# What a segment's graph holds beside the bytes autograd saves for its backward, as a factor of
# them: the outputs nothing saves, the gradients its backward makes as it frees them and the
# allocator's pages between one segment and the next (a GRU language model's segment of 38
# steps, 5.9 MiB saved: 6.7 MiB resident once recomputed, 7.8 MiB at the peak of 30 in turn,
# its parameters' gradients apart).
GRAPH_OVERHEAD = 1.5


def graph_share(nbytes: int, options: dict[str, Any], kept: float, *, name: str = "",
                unit: str = "step", graph: int = 0, gradients: int = 0, output: int = 0,
                overhead: float = GRAPH_OVERHEAD) -> tuple[int | None, dict[str, Any]]:
    """How many bytes autograd may save for one segment's graph within ``memory_budget`` (in
    ``options``; by default a quarter of the available memory, unless ``l1_slots`` is given;
    None where no budget is given), and the checkpointer's options, a copy of ``options``
    whose ``memory_budget`` is the checkpoints' share.

    The budget holds the live state (``nbytes``, this module's copy), ``gradients`` (what one
    segment's backward holds beside its graph: the parameters' gradient sums, the state's
    gradient in and out), the checkpoints (at least one slot and the engine's buffers; the
    share ``kept`` of what is left where the largest ``unit``'s ``graph`` still fits beside
    them) and a segment's graph at ``overhead`` times ``graph`` (by default
    :data:`GRAPH_OVERHEAD` times what autograd saves; 1 where ``graph`` is what the segment's
    backward holds, as a stack measures it), and the ``output`` the call returns.

    Raises
    ------
    MemoryBudgetError
        The budget is below what the tightest plan holds: the live state, the least
        checkpoints, the gradients and one ``unit``'s graph, a segment of one.
    """
    budget = options.get("memory_budget")
    if budget is None:
        if "l1_slots" in options:
            return None, dict(options)
        budget = default_budget(nbytes)
    budget = parse_bytes("memory_budget", budget)
    live, least = state_bytes(nbytes), (engine_buffers() + 1) * state_bytes(nbytes)
    one = math.ceil(graph * overhead)
    need = live + output + gradients + least + one
    if budget < need:
        returned = f", the output it returns ({output})" if output else ""
        raise MemoryBudgetError(
            f"{name}: memory_budget={budget} bytes is below the {need} bytes its tightest plan "
            f"needs, a segment of one {unit}: the live state ({live}){returned}, the "
            f"checkpoints' least ({least}: one slot and {engine_buffers()} engine buffers of "
            f"{state_bytes(nbytes)} bytes), the largest {unit}'s graph ({one}) and its "
            f"backward's gradients ({gradients}); give at least {need} bytes")
    rest = budget - live - output - gradients
    checkpoints = max(least, min(int(rest * kept), rest - one))
    return int((rest - checkpoints) / overhead), {**options, "memory_budget": checkpoints}


def checkpoints_share(options: dict[str, Any]) -> float:
    """The share of a stack's given budget its checkpoints keep: none beyond their least (one
    slot and the engine's buffers) where Level-2 may go beyond the budget (``storage`` None,
    a name or a path, or a list of them: states beyond the in-memory tier spill to a
    directory), so that its segments are as long as the budget allows. Each segment is run
    once more whatever the slots (every checkpoint to Level-2 at interval 1), and fewer
    segments cost fewer calls of the autograd engine (the last, whose graph the forward sweep
    keeps, none). A Storage instance given holds what it holds: half, as by default."""
    storage = options.get("storage")
    tiers = storage if isinstance(storage, (list, tuple)) else [storage]
    if all(tier is None or isinstance(tier, (str, os.PathLike)) for tier in tiers):
        return 0.0
    return STACK_CHECKPOINTS_SHARE


def in_segments(options: dict[str, Any], count: int) -> dict[str, Any]:
    """``options`` for a checkpointer whose steps are ``count`` segments: a fixed interval
    (which counts segments) at most the run."""
    interval = options.get("interval")
    if isinstance(interval, int) and not isinstance(interval, bool) and interval > count:
        return {**options, "interval": count}
    return options


def segment_starts(graph: Sequence[int], segments: int | None, most: int | None,
                   held: Callable[[int, int], int] | None = None, *,
                   at_least_sqrt: bool = True) -> list[int]:
    """Where each segment of a stack of layers begins, and the number of layers at the end.

    Parameters
    ----------
    graph
        The bytes each layer's graph keeps for its backward.
    segments
        That many segments, of equal numbers of layers (as ``torch.utils.checkpoint``'s
        ``checkpoint_sequential`` splits); None: runs of layers whose graphs add up to at most
        ``most`` bytes (a layer alone where it keeps more), and at least sqrt(layers) of them,
        so that a segment's graph is at most the share of the whole that torch's advice
        gives.
    held
        The bytes a segment of layers ``begin`` to ``end`` (inclusive) holds, compared with
        ``most``; by default the sum of their ``graph``.
    at_least_sqrt
        With ``held``: whether to cut at least sqrt(layers) segments (else as few as ``most``
        allows: a budget the caller gave).
    """
    n = len(graph)
    if segments is not None:
        if isinstance(segments, bool) or not isinstance(segments, int) or segments < 1:
            raise InvalidValueError(f"segments must be a positive int or None, got {segments!r}")
        count = min(segments, n)
        return [n * k // count for k in range(count)] + [n]
    cap = -(-sum(graph) // (math.isqrt(n - 1) + 1))  # ceil(total / ceil(sqrt(n)))
    starts = [0]
    if held is not None:
        if not at_least_sqrt:
            cap = sum(graph)
        total = graph[0]
        for t in range(1, n):
            total += graph[t]
            if total > cap or (most is not None and held(starts[-1], t) > most):
                starts.append(t)
                total = graph[t]
        return starts + [n]
    if most is not None:
        cap = min(cap, most)
    total = 0  # a running sum: a scan's steps are many
    for t, nbytes in enumerate(graph):
        if t > starts[-1] and total + nbytes > cap:
            starts.append(t)
            total = 0
        total += nbytes
    return starts + [n]
