"""A stack's parameters' gradients added into ``.grad`` segment by segment, where the backward
that runs the stack's node accumulates them there (``loss.backward()``), as autograd's own
``AccumulateGrad`` nodes add them under plain autograd or ``torch.utils.checkpoint``: one
segment's parts are held at a time, not every parameter's gradient at once beside ``.grad``."""
from __future__ import annotations

from collections.abc import Sequence

import torch

__all__ = ["accumulated", "accumulate_through"]


def accumulated(params: Sequence[torch.Tensor], create_graph: bool) -> list[bool]:
    """Whether the backward now running (asked from inside a node's backward) adds each of
    ``params`` into its ``.grad``: ``loss.backward()`` and ``backward(inputs=[p])`` do;
    ``torch.autograd.grad``, a backward that builds the gradients' graph (``create_graph``)
    and one whose ``inputs=`` leave the parameter out do not (the gradient then goes back
    through the node, or nowhere). A parameter with hooks, or any under
    ``torch.distributed``, is handed back through the node too."""
    if create_graph or _distributed():
        # the gradients carry their own graph, which .grad would not hold; or a data-parallel
        # reducer's hooks on the accumulators, which must see each gradient once
        return [False] * len(params)
    found = []
    for p in params:
        if p.grad_fn is not None or not p.requires_grad or p._backward_hooks \
                or getattr(p, "_post_accumulate_grad_hooks", None):
            # a hook sees the gradient once: where it is added here, the stack's node still
            # hands the accumulator an undefined one, which it would see too (as None)
            found.append(False)
            continue
        node = torch.autograd.graph.get_gradient_edge(p).node
        try:
            found.append(bool(torch._C._will_engine_execute_node(node)))
        except RuntimeError:  # inside torch.autograd.grad, which captures and never adds
            found.append(False)
    return found


def _distributed() -> bool:
    distributed = getattr(torch, "distributed", None)
    return bool(distributed is not None and distributed.is_available()
                and distributed.is_initialized())


def accumulate_through(outputs: Sequence[torch.Tensor], seeds: Sequence[torch.Tensor],
                       wanted: Sequence[torch.Tensor]) -> None:
    """One backward from ``outputs`` (their gradients ``seeds``) that adds the gradient of
    each of ``wanted`` into its ``.grad`` through its ``AccumulateGrad`` node, hooks and
    all, as ``torch.autograd.backward(outputs, seeds, inputs=wanted)`` does (without that
    function's check of the seeds' shapes, which imports sympy: some 38 MiB resident in the
    first backward of a process)."""
    engine = getattr(torch.autograd.graph, "_engine_run_backward", None)
    if engine is None or any(seed.shape != out.shape for out, seed in zip(outputs, seeds)):
        torch.autograd.backward(list(outputs), list(seeds), inputs=list(wanted))
        return
    engine(tuple(outputs), tuple(seeds), False, False, tuple(wanted), True,
           accumulate_grad=True)
