"""``checkpoint_sequential``: a stack of layers checkpointed by asyncckpt."""
from __future__ import annotations

import weakref
from collections.abc import Sequence
from typing import Any

import torch

from ..checkpointer import AsyncCheckpointer
from ..errors import InvalidTypeError, InvalidValueError

from .accumulate import accumulate_through, accumulated
from .function import ForwardOperator, ReverseOperator, apply_checkpointed
from .held import SegmentHeld
from .passes import PASSES, Passes, meta_pass
from .preserve import LateDraw, UnlistedLeafError, differentiable
from .recompute import SegmentedRun, backward_through
from .segments import (STACK_CHECKPOINTS_SHARE, checkpoints_share, graph_share, in_segments,
                       segment_starts)

__all__ = ["SequentialRun", "checkpoint_sequential"]


class SequentialRun(SegmentedRun):
    """A stack of layers as a run of asyncckpt: a step is a segment of consecutive layers, and
    u_s the input of segment s, stored as bytes in one buffer the size of the largest (states
    of different sizes). The backward of a segment runs its layers again under enable_grad and
    back-propagates through them in one call, as ``torch.utils.checkpoint`` does; the segments
    are as long as ``memory_budget`` lets their graphs be, beside the checkpoints."""

    name = "checkpoint_sequential"
    unit = "layers"

    def __init__(self, layers: Sequence[Any], input: torch.Tensor, segments: int | None,
                 options: dict[str, Any], key: tuple[Any, ...], *,
                 preserve_rng_state: bool = True, with_rng: bool = False) -> None:
        self.layers = list(layers)
        passed = PASSES.get(key, self.layers)
        #: whether the shapes came from an earlier call's pass
        self.remembered = passed is not None
        if passed is None:
            passed = meta_pass(self.layers, input)
            PASSES.put(key, self.layers, passed)
        self.shapes, graph, reached, ends = passed
        sizes = [torch.Size(shape).numel() * torch.empty((), dtype=dtype).element_size()
                 for shape, dtype in self.shapes]
        # what a segment's backward holds, its parameters' new gradient sums among it (the sums
        # so far are the parameters' gradients, outside the budget as the parameters are);
        # beside it the activation's gradient in and out, and the output the call returns
        held = SegmentHeld(self.layers, sizes, graph, ends, reached)
        given = options.get("memory_budget") is not None
        most, options = graph_share(
            max(sizes), options, checkpoints_share(options) if given
            else STACK_CHECKPOINTS_SHARE, name=self.name, unit="layer",
            graph=held.largest_layer(), gradients=2 * max(sizes), output=sizes[-1],
            overhead=1.0)
        self.starts = segment_starts(graph, segments, most, held, at_least_sqrt=not given)
        self.sizes = [sizes[t] for t in self.starts]
        self.params = [list({id(p): p for t in range(begin, end)
                             for p in reached[t]}.values())
                       for begin, end in zip(self.starts, self.starts[1:])]
        self.flat_params = list({id(p): p for ps in self.params for p in ps}.values())
        self.index = {id(p): k for k, p in enumerate(self.flat_params)}
        self.param_ids = set(self.index)
        # a parameter of several segments: its gradient summed across them, as autograd sums it
        uses = [id(p) for ps in self.params for p in ps]
        self.shared = {i for i in self.param_ids if uses.count(i) > 1}
        #: the parameters whose gradients this backward adds into .grad segment by segment
        self.direct: set[int] = set()
        super().__init__([input, *self.flat_params], preserve_rng_state)
        # the generators' state is checkpointed after the activation where a layer draws
        # (a dropout layer, or a layer that drew in an earlier forward sweep: LateDraw)
        rng = preserve_rng_state and (with_rng or any(
            isinstance(m, torch.nn.modules.dropout._DropoutNd) and m.p > 0
            for layer in self.layers if isinstance(layer, torch.nn.Module)
            for m in layer.modules()))
        rng_bytes = self.generators.nbytes if rng else 0
        self.size, self.dtype = max(self.sizes), torch.uint8  # the descriptor's: the largest
        self.buffer = torch.empty(self.size + rng_bytes, dtype=torch.uint8, device=input.device)
        self.rng = self.buffer[self.size:] if rng else None
        self.size += rng_bytes
        if self.rng is not None:
            self.rng.copy_(self.generators.get())
        self.view(0).copy_(input)
        self.arrays = self.buffer if input.device.type != "cpu" else self.buffer.numpy()
        self.adjoint: torch.Tensor | None = None
        self.grad_params: list[torch.Tensor | None] = []
        self.last = len(self.starts) - 2
        #: the last segment's input and output, their graph kept from the forward sweep
        self.kept: tuple[torch.Tensor, torch.Tensor] | None = None
        self.keep_last = torch.is_grad_enabled() and (
            input.requires_grad or any(p.requires_grad for p in self.flat_params))
        self.checkpointer = AsyncCheckpointer(weakref.proxy(self), ForwardOperator(self),
                                              ReverseOperator(self),
                                              len(self.starts) - 1, taping=False,
                                              **in_segments(options, len(self.starts) - 1))

    def view(self, s: int) -> torch.Tensor:
        """The live activation u_s: the buffer's first bytes, as segment s's input."""
        shape, dtype = self.shapes[self.starts[s]]
        return self.buffer[:self.sizes[s]].view(dtype).view(shape)

    # the checkpoint descriptor asyncckpt reads: u_0 at the descriptor's size, as it checks
    def get_data(self, timestep: int) -> list[Any]:
        if timestep == 0:
            return [self.arrays]
        if self.rng is None:
            return [self.arrays[:self.sizes[timestep]]]
        return [self.arrays[:self.sizes[timestep]], self.arrays[self.size - self.rng.numel():]]

    def get_data_location(self, timestep: int) -> list[Any]:
        return self.get_data(timestep)

    def segment(self, s: int, x: torch.Tensor) -> torch.Tensor:
        """Segment s's layers on ``x``, each output checked against the shape its first pass
        gave."""
        for t in range(self.starts[s], self.starts[s + 1]):
            x = self.layers[t](x)
            shape, dtype = self.shapes[t + 1]
            if not isinstance(x, torch.Tensor) or x.shape != shape or x.dtype != dtype:
                raise InvalidValueError(
                    f"layer {t} returned {getattr(x, 'shape', type(x).__name__)}, "
                    f"{getattr(x, 'dtype', '')}; its first pass returned {tuple(shape)}, {dtype}")
        return x

    def run_segments(self, start: int, end: int) -> None:
        for s in range(start, end):
            if s == self.last and self.keep_last and self.recording:
                # the last segment's graph is kept from the forward sweep for its backward
                # (as torch's checkpoint_sequential runs its last segment): never recomputed;
                # its input a copy, as the live buffer takes the output next
                floating = differentiable(self.shapes[self.starts[s]][1])
                with torch.enable_grad():
                    inputs = self.view(s).clone().requires_grad_(floating)
                    output = self.segment(s, inputs)
                self.kept = (inputs, output)
            else:
                output = self.segment(s, self.view(s))
            if output.untyped_storage().data_ptr() == self.buffer.untyped_storage().data_ptr():
                output = output.clone()  # a view of its input (a reshape, say)
            self.view(s + 1).copy_(output)

    def reverse(self, s: int) -> None:
        floating = differentiable(self.shapes[self.starts[s]][1])
        params = self.params[s]
        # where every parameter of the segment goes into .grad now, autograd's AccumulateGrad
        # nodes add them one layer at a time; else their gradients come back, to be summed
        # across segments or returned through the stack's node
        direct = all(id(p) in self.direct for p in params)
        with self.recomputing():
            if s == self.last and self.kept is not None:
                (inputs, output), self.kept = self.kept, None
            else:
                inputs = self.view(s).detach().requires_grad_(floating)
                output = self.segment(s, inputs)
            self.check_reached(
                s, [output] if output.grad_fn is not None else [], self.param_ids | {id(inputs)},
                frozenset(), self.touched.named(),
                "was not found in their first pass (a layer that reaches other tensors from "
                "call to call): make it an nn.Module that owns them")
            wanted = ([inputs] if floating else []) + params
            if direct:
                if output.requires_grad and wanted and self.adjoint is not None:
                    accumulate_through([output], [self.adjoint], wanted)
                self.adjoint = inputs.grad if floating else None
                return
            got = backward_through(
                [output], [self.adjoint], wanted,
                ((p, self.grad_params[self.index[id(p)]]) for p in params
                 if id(p) in self.shared), output.requires_grad)
        self.adjoint = got[0] if floating else None
        for parameter, grad in zip(params, got[1:] if floating else got):
            if grad is None:
                continue
            if id(parameter) in self.direct:  # as its AccumulateGrad node would add it
                if parameter.grad is None:
                    parameter.grad = grad
                else:
                    parameter.grad.add_(grad)
            else:
                self.grad_params[self.index[id(parameter)]] = grad

    def read_again(self) -> list[tuple[str | None, torch.Tensor]]:
        return [(None, p) for p in self.flat_params]

    def forward_outputs(self, inputs: Sequence[torch.Tensor]) -> tuple[torch.Tensor, ...]:
        self.end_forward()
        self.input_needs_grad = inputs[0].requires_grad
        if self.kept is not None:
            return (self.kept[1].detach(),)
        return (self.view(len(self.starts) - 1).clone(),)

    def backward(self, grads: Sequence[torch.Tensor | None]) -> tuple[Any, ...]:
        (grad,) = grads
        last = self.view(len(self.starts) - 1)
        self.adjoint = grad if grad is not None else torch.zeros_like(last)
        self.grad_params = [None] * len(self.flat_params)
        self.direct = {id(p) for p, adds in zip(self.flat_params, accumulated(
            self.flat_params, self.create_graph)) if adds and id(p) not in self.shared}
        self.reverse_sweep()
        grads_out = (self.adjoint if self.input_needs_grad else None, *self.grad_params)
        # let go of them, so autograd can take them into .grad instead of copying them
        self.adjoint, self.grad_params = None, []
        return grads_out


def checkpoint_sequential(functions: Sequence[Any] | torch.nn.Sequential, input: torch.Tensor,
                          *, segments: int | None = None,
                          memory_budget: int | str | None = None, storage: Any = None,
                          interval: int | str = "auto", preserve_rng_state: bool = True,
                          **options: Any) -> torch.Tensor:
    """``functions`` applied in turn to ``input``, back-propagated by asyncckpt in bounded memory.

    The stack is cut into segments of consecutive layers; the input of each is a state that
    asyncckpt checkpoints (every I-th to Level-2, Revolve in between), and the backward runs a
    segment's layers again under enable_grad and back-propagates through them in one call, as
    ``torch.utils.checkpoint.checkpoint_sequential`` does. The inputs of segments may differ in
    shape and size (each is stored at its own size in a budget sized for the largest). The
    shapes, and the bytes each layer's graph keeps, come first from a pass on torch's meta
    device. Layers must compute the same values when run again from the same input, random
    generators and buffers (deterministic kernels); dropout, noise and BatchNorm in training
    mode recompute exactly (docs/torch.md says what is restored).

    Parameters
    ----------
    functions : nn.Sequential or sequence of modules or callables
        Each takes the previous one's output tensor and returns one tensor.
    input : tensor
    segments : int, optional
        That many segments of equal numbers of layers. Default: from the budget, which covers
        the checkpoints and one segment's graph: segments whose graphs take at most half of it
        (the checkpoints keep the rest), and at least sqrt(layers) segments.
    memory_budget, storage, interval, preserve_rng_state, **options
        As :func:`checkpoint_scan`'s.

    Returns
    -------
    tensor
        The last layer's output, differentiable with respect to ``input`` and every layer's
        parameters.
    """
    layers = list(functions)  # (a Sequential's children() would drop a repeated module)
    if not layers:
        raise InvalidValueError("checkpoint_sequential needs at least one layer")
    for i, layer in enumerate(layers):
        if not callable(layer):
            raise InvalidTypeError(
                f"layer {i} is a {type(layer).__name__} ({layer!r:.40}), expected an nn.Module "
                "or a callable taking a tensor and returning one (torch.nn.ReLU(), not 'relu')")
    if not isinstance(input, torch.Tensor):
        raise InvalidTypeError(f"input must be a tensor, got a {type(input).__name__}")
    if memory_budget is not None:
        options["memory_budget"] = memory_budget
    options.update(storage=storage, interval=interval)
    if not isinstance(preserve_rng_state, bool):
        raise InvalidTypeError(f"preserve_rng_state must be a bool, got {preserve_rng_state!r}")
    key = Passes.key(layers, input)
    with_rng, fresh = False, False
    while True:
        run = SequentialRun(layers, input, segments, dict(options), key,
                            preserve_rng_state=preserve_rng_state, with_rng=with_rng)
        initial = run.generators.get()
        try:
            (output,) = apply_checkpointed(run, input, *run.flat_params)
            break
        except LateDraw:
            # a layer drew with no generator state in the checkpoints: again, with it
            if with_rng:
                raise
            with_rng = True
        except InvalidValueError as error:
            if not run.remembered or fresh or isinstance(error, UnlistedLeafError) \
                    or "buffer" in str(error):
                raise
            PASSES.drop(key)  # a layer's outputs changed since its pass: once more, afresh
            fresh = True
        run.generators.set(initial)
        run.forward_buffers.restore()
    return output
