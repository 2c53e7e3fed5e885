"""A stack's first pass, on torch's meta device: the shapes of its activations, the bytes each
layer's graph keeps and the tensors needing a gradient each layer reaches, with no data and no
compute; and the passes remembered for the next call on the same stack."""
from __future__ import annotations

import itertools
import weakref
from collections import OrderedDict
from collections.abc import Sequence
from typing import Any

import torch

from ..errors import InvalidTypeError

from .preserve import Buffers, Generators, differentiable, reached_leaves

__all__ = ["PASSES", "Passes", "activation_shapes", "meta_pass"]


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
    x = input.detach().to("meta").requires_grad_(differentiable(input.dtype))
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
            inputs = real.detach().requires_grad_(differentiable(real.dtype))
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
