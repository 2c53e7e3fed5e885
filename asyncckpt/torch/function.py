"""The autograd function whose forward is a checkpointed forward sweep and whose backward is
its reverse sweep, and the operators it hands the checkpointer."""
from __future__ import annotations

import weakref
from typing import Any, Protocol

import torch

from ..errors import UsageError
from ..stats import Stats
from .preserve import differentiable

__all__ = ["Checkpointed", "ForwardOperator", "ReverseOperator", "Run", "apply_checkpointed",
           "last_stats"]

# The stats of the last run that ended in this process (its backward, or its forward where no
# backward comes); the checkpointer itself is let go with the run.
_LAST: list[Stats] = []


def last_stats() -> Stats | None:
    """The :class:`~asyncckpt.Stats` of the last ``checkpoint_scan`` or
    ``checkpoint_sequential`` of this process to end (after its backward, or after its forward
    where nothing needs a gradient); None before any."""
    return _LAST[-1] if _LAST else None


def record_stats(stats: Stats) -> None:
    """Keep ``stats`` as the last run's (one at a time)."""
    _LAST[:] = [stats]


class Run(Protocol):
    """What the operators drive: a scan's or a stack's steps and their backward."""

    def advance(self, start: int, end: int, /) -> None: ...

    def reverse(self, s: int, /) -> None: ...


class ForwardOperator:
    """The checkpointer's forward operator: steps of the run."""

    #: it copies every carry into the live arrays, and a step may leave a carry as it was (a
    #: fixed point), which the checkpointer's check for rebound arrays would refuse
    updates_in_place = True

    def __init__(self, scan: Run) -> None:
        # the run holds the checkpointer that holds this: a strong reference back would keep
        # both (and the checkpointer's threads) until the cyclic collector runs, where a run
        # whose output nobody differentiates should go when its graph does
        self.scan = weakref.proxy(scan)

    def apply(self, *, t_start: int, t_end: int) -> None:
        self.scan.advance(t_start, t_end)


class ReverseOperator:
    """The checkpointer's reverse operator: the backward of one step of the run."""

    def __init__(self, scan: Run) -> None:
        self.scan = weakref.proxy(scan)  # as the forward operator's

    def apply(self, *, t_start: int, t_end: int) -> None:
        self.scan.reverse(t_start)


class Checkpointed(torch.autograd.Function):
    """A forward sweep checkpointed by asyncckpt, and its reverse sweep as the backward: ``run``
    (a :class:`ScanRun` or :class:`SequentialRun`) does both."""

    @staticmethod
    def forward(*args: Any, **kwargs: Any) -> Any:
        ctx, run, *inputs = args  # torch's signature: (ctx, *inputs)
        try:
            run.checkpointer.apply_forward()
            outputs = run.forward_outputs(inputs)
        except BaseException:
            run.checkpointer.close()
            raise
        ctx.run, ctx.name = run, run.name
        ctx.mark_non_differentiable(*(t for t in outputs if not differentiable(t.dtype)))
        return outputs

    @staticmethod
    def backward(ctx: Any, *grads: torch.Tensor | None) -> Any:
        run = getattr(ctx, "run", None)
        if run is None:
            raise RuntimeError(f"Trying to backward through {ctx.name} a second time: its "
                               "checkpoints were freed after the first backward (call it again "
                               "for another backward pass)")
        ctx.run = None
        # autograd runs a backward under grad mode where it builds the graph of the gradients
        # (create_graph=True): the reverse sweep's are first derivatives only
        create_graph = run.create_graph = torch.is_grad_enabled()
        try:
            with torch.no_grad():
                got = run.backward(grads)
        finally:
            run.checkpointer.close()
            record_stats(run.checkpointer.stats)
        if create_graph:
            # each a leaf that requires grad, so that the node is recorded whatever they are
            got = SecondDerivative.apply(run.name, *(
                g if g is None else g.detach().requires_grad_() for g in got))
        return (None, *got)


class SecondDerivative(torch.autograd.Function):
    """The gradients of a run's inputs where autograd builds their graph (``create_graph``):
    what differentiates them again reaches this node, which refuses (the reverse sweep
    computes first derivatives only), where it would otherwise take them for constants."""

    @staticmethod
    def forward(*args: Any, **kwargs: Any) -> Any:
        ctx, name, *grads = args  # torch's signature: (ctx, *inputs)
        ctx.name = name
        return tuple(g if g is None else g.detach() for g in grads)

    @staticmethod
    def backward(ctx: Any, *grads: torch.Tensor | None) -> Any:
        raise UsageError(
            f"{ctx.name} computes first derivatives only: a second derivative through it "
            "(torch.autograd.grad(..., create_graph=True), then a backward of those gradients) "
            f"would leave out {ctx.name}'s part; differentiate twice without {ctx.name} (plain "
            "autograd, or torch.utils.checkpoint.checkpoint(use_reentrant=False))")


def apply_checkpointed(run: Any, *inputs: torch.Tensor) -> tuple[torch.Tensor, ...]:
    """:class:`Checkpointed` applied to ``run`` and its ``inputs``: the outputs of its forward
    sweep; its checkpointer closed (its stats kept) where no backward will come (no_grad, or
    nothing to differentiate)."""
    outputs: tuple[torch.Tensor, ...] = Checkpointed.apply(run, *inputs)
    if not any(out.requires_grad for out in outputs):
        run.checkpointer.close()
        record_stats(run.checkpointer.stats)
    return outputs
