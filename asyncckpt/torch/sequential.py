"""``checkpoint_sequential``: a stack of layers checkpointed by asyncckpt."""
from __future__ import annotations

import contextlib
import itertools
import weakref
from collections import OrderedDict
from collections.abc import Sequence
from typing import Any

import torch

from ..checkpointer import AsyncCheckpointer
from ..errors import InvalidTypeError, InvalidValueError

from .function import Checkpointed, ForwardOperator, ReverseOperator, record_stats
from .preserve import (Autocast, Buffers, Generators, LateDraw, UnlistedLeafError,
                       describe_leaf, reached_leaves)
from .segments import STACK_CHECKPOINTS_SHARE, graph_share, in_segments, segment_starts

__all__ = ["PASSES", "Passes", "SequentialRun", "activation_shapes", "checkpoint_sequential",
           "meta_pass"]

def activation_shapes(layers: Sequence[Any], input: torch.Tensor) -> list[tuple[Any, Any]]:
    """(shape, dtype) of the input of each layer and of the last one's output, from a pass on
    torch's meta device (no data, no compute); a layer that cannot run there is run for real,
    without a graph, from that layer on."""
    return meta_pass(layers, input)[0]


def meta_pass(layers: Sequence[Any], input: torch.Tensor) -> tuple[
        list[tuple[Any, Any]], list[int | None], list[list[torch.Tensor]]]:
    """:func:`activation_shapes`, the bytes each layer's graph keeps for its backward
    (the tensors autograd saves, each counted once, parameters not at all; None for a layer
    run for real), and the tensors needing a gradient each layer reaches, found by autograd
    in its graph (a module's parameters through their copies on the meta device). A layer
    run for real runs with the random generators and the buffers put back after it."""
    from torch.func import functional_call

    shapes = [(input.shape, input.dtype)]
    graph: list[int | None] = []
    x = input.detach().to("meta").requires_grad_(input.is_floating_point())
    real: torch.Tensor | None = None
    parameters: dict[int, torch.Tensor] = {}  # held, so that no later tensor takes an id
    saved: dict[int, torch.Tensor] = {}  # the tensors held, so ids stay theirs
    kept = [0]  # their bytes
    reached: list[list[torch.Tensor]] = []
    generators = Generators([input])

    def pack(tensor: torch.Tensor) -> torch.Tensor:
        base = tensor if tensor._base is None else tensor._base  # a view keeps its base
        if id(base) not in parameters and id(base) not in saved:
            saved[id(base)] = base
            kept[0] += base.numel() * base.element_size()
        return tensor

    for i, layer in enumerate(layers):
        if real is None:
            before = kept[0]
            inputs = x  # the meta graph runs on, so that a tensor saved twice counts once
            try:
                with torch.enable_grad(), \
                        torch.autograd.graph.saved_tensors_hooks(pack, lambda tensor: tensor):
                    if isinstance(layer, torch.nn.Module):
                        state = {name: t.to("meta") for name, t in
                                 [*layer.named_parameters(), *layer.named_buffers()]}
                        parameters.update((id(t), t) for t in state.values())
                        x = functional_call(layer, state, (inputs,))
                    else:
                        x = layer(inputs)
                graph.append(kept[0] - before)
            except (NotImplementedError, RuntimeError):
                real = input
                with generators.fork(), Buffers() as touched, torch.no_grad():
                    try:
                        for earlier in layers[:i]:
                            real = earlier(real)
                    finally:
                        touched.restore()
        if real is not None:
            inputs = real.detach().requires_grad_(real.is_floating_point())
            with generators.fork(), Buffers() as touched, torch.enable_grad():
                try:
                    x = layer(inputs)
                finally:
                    touched.restore()
            real = x.detach() if isinstance(x, torch.Tensor) else x
            graph.append(None)
        if not isinstance(x, torch.Tensor):
            raise InvalidTypeError(f"layer {i} returned a {type(x).__name__}, expected a tensor")
        reached.append(reached_leaves([x] if x.grad_fn is not None else [], {id(inputs)},
                                      {inputs.grad_fn} if inputs.grad_fn is not None else set()))
        if real is not None:
            x = real
        shapes.append((x.shape, x.dtype))
    return shapes, graph, reached


class Passes:
    """The meta passes of recent stacks, for the next call on the same layers and input: a
    model trained over many calls skips its pass.

    Keyed by the layers' identities, every parameter's and buffer's shape, dtype, device and
    ``requires_grad``, and the input's; the layers are held by weak reference where they allow
    it, so a cached stack goes with its model. A layer whose outputs change with none of those
    (an attribute set between calls) makes the forward sweep raise its shape error, and
    :func:`checkpoint_sequential` then runs once more after a fresh pass.
    """

    #: stacks remembered, the most recent
    SIZE = 4

    def __init__(self) -> None:
        self._entries: OrderedDict[tuple[Any, ...], tuple[list[Any], Any]] = OrderedDict()

    @staticmethod
    def key(layers: Sequence[Any], input: torch.Tensor) -> tuple[Any, ...]:
        def signature(layer: Any) -> tuple[Any, ...]:
            if not isinstance(layer, torch.nn.Module):
                return (id(layer),)
            return (id(layer), *((name, t.shape, t.dtype, t.device, t.requires_grad)
                                 for name, t in itertools.chain(layer.named_parameters(),
                                                                layer.named_buffers())))

        return (tuple(map(signature, layers)), input.shape, input.dtype, input.device,
                input.requires_grad)

    def get(self, key: tuple[Any, ...], layers: Sequence[Any]) -> Any:
        entry = self._entries.get(key)
        if entry is None:
            return None
        refs, result = entry
        if any((ref() if isinstance(ref, weakref.ref) else ref) is not layer
               for ref, layer in zip(refs, layers)):
            del self._entries[key]  # a freed layer's id, taken by another
            return None
        self._entries.move_to_end(key)
        return result

    def put(self, key: tuple[Any, ...], layers: Sequence[Any], result: Any) -> None:
        refs: list[Any] = []
        for layer in layers:
            try:
                refs.append(weakref.ref(layer))
            except TypeError:  # a builtin such as torch.tanh: it lives as long as torch
                refs.append(layer)
        self._entries[key] = (refs, result)
        while len(self._entries) > self.SIZE:
            self._entries.popitem(last=False)

    def drop(self, key: tuple[Any, ...]) -> None:
        self._entries.pop(key, None)


PASSES = Passes()


class SequentialRun:
    """A stack of layers as a run of asyncckpt: a step is a segment of consecutive layers, and
    u_s the input of segment s, stored as bytes in one buffer the size of the largest (states
    of different sizes). The backward of a segment runs its layers again under enable_grad and
    back-propagates through them in one call, as ``torch.utils.checkpoint`` does; the segments
    are as long as ``memory_budget`` lets their graphs be, beside the checkpoints."""

    name = "checkpoint_sequential"

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
        self.shapes, graph, reached = passed
        sizes = [torch.Size(shape).numel() * torch.empty((), dtype=dtype).element_size()
                 for shape, dtype in self.shapes]
        # a layer run for real, off the meta device: its input and output, as a bound
        graph = [sizes[t] + sizes[t + 1] if g is None else g for t, g in enumerate(graph)]
        most, options = graph_share(max(sizes), options, STACK_CHECKPOINTS_SHARE)
        self.starts = segment_starts(graph, segments, most)
        self.sizes = [sizes[t] for t in self.starts]
        self.params = [list({id(p): p for t in range(begin, end)
                             for p in reached[t]}.values())
                       for begin, end in zip(self.starts, self.starts[1:])]
        self.flat_params = list({id(p): p for ps in self.params for p in ps}.values())
        self.index = {id(p): k for k, p in enumerate(self.flat_params)}
        self.param_ids = set(self.index)
        self.preserve_rng_state = preserve_rng_state
        self.autocast = Autocast()
        self.generators = Generators([input, *self.flat_params])
        self.forward_buffers, self.touched = Buffers(), Buffers()
        self.recording = True
        self.reached = 0  # the segments the forward sweep has run
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
        self.checkpointer = AsyncCheckpointer(self, ForwardOperator(self), ReverseOperator(self),
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
        # the generators are part of the state: a segment draws from its input's
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
            for s in range(start, end):
                output = self.segment(s, self.view(s))
                if output.untyped_storage().data_ptr() == \
                        self.buffer.untyped_storage().data_ptr():
                    output = output.clone()  # a view of its input (a reshape, say)
                self.view(s + 1).copy_(output)
        if rng is not None:
            rng.copy_(generators.get())
        elif self.recording and self.preserve_rng_state \
                and not torch.equal(before, generators.get()):
            raise LateDraw(f"layers {self.starts[start]} to {self.starts[end] - 1}")

    def reverse(self, s: int) -> None:
        floating = self.shapes[self.starts[s]][1].is_floating_point
        if self.rng is not None:
            self.generators.set(self.rng)
        with self.autocast(), torch.enable_grad():
            inputs = self.view(s).detach().requires_grad_(floating)
            output = self.segment(s, inputs)
            unlisted = reached_leaves([output] if output.grad_fn is not None else [],
                                      self.param_ids | {id(inputs)})
            if unlisted:
                raise UnlistedLeafError(
                    f"{self.name}: layers {self.starts[s]} to {self.starts[s + 1] - 1} reach "
                    f"{describe_leaf(unlisted[0], self.touched.named())}, which requires grad "
                    "and was not found in their first pass (a layer that reaches other "
                    "tensors from call to call): make it an nn.Module that owns them")
            wanted = ([inputs] if floating else []) + self.params[s]
            outputs, seeds = [output], [self.adjoint]
            # Each parameter's sum so far enters its gradient first, through an identity made
            # last (autograd runs it first): this segment's uses are then added one by one,
            # in the order plain autograd adds them (as checkpoint_scan sums them)
            for parameter in self.params[s]:
                total = self.grad_params[self.index[id(parameter)]]
                if total is not None:
                    outputs.append(parameter.view_as(parameter))
                    seeds.append(total)
            got = torch.autograd.grad(outputs, wanted, seeds, allow_unused=True) \
                if output.requires_grad and wanted else [None] * len(wanted)
        self.adjoint = got[0] if floating else None
        for parameter, grad in zip(self.params[s], got[1:] if floating else got):
            if grad is not None:
                self.grad_params[self.index[id(parameter)]] = grad

    def forward_outputs(self, inputs: Sequence[torch.Tensor]) -> tuple[torch.Tensor, ...]:
        self.recording = False
        self.forward_buffers.check(self.name)
        self.input_needs_grad = inputs[0].requires_grad
        return (self.view(len(self.starts) - 1).clone(),)

    def backward(self, grads: Sequence[torch.Tensor | None]) -> tuple[Any, ...]:
        (grad,) = grads
        last = self.view(len(self.starts) - 1)
        self.adjoint = grad if grad is not None else torch.zeros_like(last)
        self.grad_params = [None] * len(self.flat_params)
        # the caller's generators and the modules' buffers as the forward sweep left them
        with self.generators.fork(), Buffers() as self.touched:
            try:
                self.checkpointer.apply_reverse()
            finally:
                self.touched.restore()
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
            (output,) = Checkpointed.apply(run, input, *run.flat_params)
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
    if not output.requires_grad:
        run.checkpointer.close()
        record_stats(run.checkpointer.stats)
    return output
