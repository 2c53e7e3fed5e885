"""A run cut into segments, each run again exactly from its checkpointed state: the forward
sweep's segments under the state they must see (random generators, buffers, autocast), and the
reverse sweep's backward through one segment, summed in autograd's order.

:class:`SegmentedRun` is what ``checkpoint_scan``'s and ``checkpoint_sequential``'s runs share;
each says what a segment computes (:meth:`SegmentedRun.run_segments`) and what its backward
differentiates.
"""
from __future__ import annotations

import contextlib
from collections.abc import Iterable, Iterator, Sequence, Set
from typing import Any

import torch

from ..errors import UsageError
from .preserve import (Autocast, Buffers, Generators, LateDraw, UnlistedLeafError,
                       describe_leaf, reached_leaves)

__all__ = ["SegmentedRun", "backward_through"]


class SegmentedRun:
    """The state a run's sweeps share: where its segments start, the random generators (their
    state checkpointed in ``rng`` where the segments draw, else None), the buffers of the
    modules the forward sweep and the backward call, and autocast as the run was called.

    Parameters
    ----------
    tensors
        The run's tensors, whose CUDA devices' generators count.
    preserve_rng_state
        Whether a recomputed segment draws what its first run drew.
    """

    #: the entry point, as errors name it
    name = ""
    #: what a segment is made of, as errors name them ("steps", "layers")
    unit = ""
    starts: list[int]
    rng: torch.Tensor | None
    checkpointer: Any
    #: whether the backward running builds the gradients' graph (create_graph=True)
    create_graph = False

    def __init__(self, tensors: Iterable[torch.Tensor], preserve_rng_state: bool) -> None:
        self.preserve_rng_state = preserve_rng_state
        self.autocast = Autocast()
        self.generators = Generators(tensors)
        #: the modules the forward sweep calls, and their buffers before it
        self.forward_buffers = Buffers()
        self.touched = Buffers()  # the modules the backward calls
        self.recording = True
        self.reached = 0  # the segments the forward sweep has run
        #: what the backward reads again, with its version at the end of the forward sweep
        self.versions: list[tuple[str | None, torch.Tensor, int]] = []

    def run_segments(self, start: int, end: int) -> None:
        """Segments ``start`` to ``end - 1`` from the live state, which they leave as the
        input of segment ``end`` (under no_grad, the generators and buffers in place)."""
        raise NotImplementedError

    def advance(self, start: int, end: int) -> None:
        if self.recording and start < self.reached < end:
            self.advance(start, self.reached)
            self.advance(self.reached, end)
            return
        # the forward sweep may run segments again (it split a call): their modules' buffers
        # are put back after, as the backward's recomputations are
        again = self.recording and start < self.reached
        self.reached = max(self.reached, end)
        generators, rng = self.generators, self.rng
        # the generators are part of the state: a segment draws from its first state's
        if rng is not None:
            generators.set(rng)
        elif self.recording and self.preserve_rng_state:
            before = generators.get()
        with contextlib.ExitStack() as stack:
            if again:
                stack.callback(stack.enter_context(Buffers()).restore)
            elif self.recording:
                stack.enter_context(self.forward_buffers)
            stack.enter_context(self.autocast())
            stack.enter_context(torch.no_grad())
            self.run_segments(start, end)
        if rng is not None:
            rng.copy_(generators.get())
        elif self.recording and self.preserve_rng_state \
                and not torch.equal(before, generators.get()):
            raise LateDraw(f"{self.unit} {self.starts[start]} to {self.starts[end] - 1}")

    def read_again(self) -> list[tuple[str | None, torch.Tensor]]:
        """The tensors the backward's recomputations read as they are then (not copied in the
        forward sweep), each with its name for errors (None: a parameter, named by its
        module)."""
        raise NotImplementedError

    def end_forward(self) -> None:
        """After the forward sweep: refuse a module that changed a buffer it may read; note
        the version of what the backward reads again."""
        self.recording = False
        self.forward_buffers.check(self.name)
        self.versions = [(what, t, t._version) for what, t in self.read_again()
                         if not t.is_inference()]

    def check_versions(self) -> None:
        """Raise UsageError naming a tensor the backward reads again that was modified in
        place since the forward sweep (as autograd refuses a saved tensor's)."""
        for what, tensor, version in self.versions:
            if tensor._version != version:
                what = what or describe_leaf(tensor, self.forward_buffers.named())
                raise UsageError(
                    f"{self.name}: {what} was modified in place after the forward (its version "
                    f"{version} then, {tensor._version} now); the backward recomputes the "
                    f"{self.unit} from it, and would differentiate other values than the "
                    "forward's (plain autograd refuses the same): run the backward before "
                    "changing it, or change a copy")

    def reverse_sweep(self) -> None:
        """The checkpointer's reverse sweep, from the caller's generators and the modules'
        buffers as the forward sweep left them, which it leaves as they were; each module in
        the training mode the forward sweep found it in, which it puts back after."""
        self.check_versions()
        with self.generators.fork(), self.forward_buffers.modes(), Buffers() as self.touched:
            try:
                self.checkpointer.apply_reverse()
            finally:
                self.touched.restore()

    def check_reached(self, s: int, roots: Sequence[torch.Tensor], known: set[int],
                      stops: Set[Any], named: Iterable[tuple[str, torch.Tensor]],
                      why: str) -> None:
        """Raise UnlistedLeafError where autograd reaches from ``roots``, segment s's
        recomputed outputs, a tensor that needs a gradient and is not ``known`` (nor behind
        ``stops``): it would lose its gradient. The error names it (a parameter among
        ``named``) and says ``why`` it is not differentiated."""
        unlisted = reached_leaves(roots, known, stops)
        if unlisted:
            raise UnlistedLeafError(
                f"{self.name}: {self.unit} {self.starts[s]} to {self.starts[s + 1] - 1} reach "
                f"{describe_leaf(unlisted[0], named)}, which requires grad and {why}")

    @contextlib.contextmanager
    def recomputing(self) -> Iterator[None]:
        """A segment run again for its backward: under enable_grad, autocast as it was, and the
        generators as its first run found them (where they are checkpointed)."""
        if self.rng is not None:
            self.generators.set(self.rng)
        with self.autocast(), torch.enable_grad():
            yield


def backward_through(outputs: list[torch.Tensor], seeds: list[torch.Tensor | None],
                     wanted: Sequence[torch.Tensor],
                     totals: Iterable[tuple[torch.Tensor, torch.Tensor | None]],
                     differentiable: bool = True) -> Sequence[torch.Tensor | None]:
    """The gradients of ``wanted`` in one backward through a recomputed segment, from the
    ``outputs``' gradients ``seeds`` (None for each where nothing is ``differentiable``, or
    nothing is wanted).

    Each (parameter, sum so far) of ``totals`` enters the parameter's gradient first, through
    an identity made last (autograd runs it first): the segment's parts are then added one by
    one, in the order plain autograd adds them, so the sums are its own to the last bit.
    """
    for parameter, total in totals:
        if total is not None:
            outputs.append(parameter.view_as(parameter))
            seeds.append(total)
    if differentiable and outputs and wanted:
        return _grad(outputs, wanted, seeds)
    return [None] * len(wanted)


def _grad(outputs: Sequence[torch.Tensor], wanted: Sequence[torch.Tensor],
          seeds: Sequence[torch.Tensor | None]) -> Sequence[torch.Tensor | None]:
    """``torch.autograd.grad(outputs, wanted, seeds, allow_unused=True)`` by the engine call it
    makes. Its check of the seeds' shapes imports sympy (``symbolic_shapes``), some 38 MiB
    resident in the first backward of a process, which a plain ``loss.backward()`` never
    imports; each seed here is a tensor of its output's shape, made so by the run."""
    engine = getattr(torch.autograd.graph, "_engine_run_backward", None)
    if engine is None or any(seed is None or seed.shape != out.shape
                             for out, seed in zip(outputs, seeds)):
        return torch.autograd.grad(outputs, wanted, seeds, allow_unused=True)
    result: Sequence[torch.Tensor | None] = engine(
        tuple(outputs), tuple(seeds), False, False, tuple(wanted), True, accumulate_grad=False)
    return result
