"""A stack's first pass, a layer at a time: the shapes of its activations, the bytes each
layer's graph keeps and the tensors needing a gradient each layer reaches; and the passes
remembered for the next call on the same stack."""
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
    """(shape, dtype) of the input of each layer and of the last one's output, from a pass
    that runs each layer once on its input (the stack's first pass, ``meta_pass``)."""
    return meta_pass(layers, input)[0]


def meta_pass(layers: Sequence[Any], input: torch.Tensor) -> tuple[
        list[tuple[Any, Any]], list[int], list[list[torch.Tensor]], list[tuple[int, int]]]:
    """The stack's first pass: :func:`activation_shapes`, the bytes each layer's graph keeps
    for its backward (the tensors autograd saves, each storage once, the layer's parameters
    and buffers not at all), the tensors needing a gradient each layer reaches, found by
    autograd in its graph, and of each layer's bytes, those that are its input and its output
    (a segment's input is its live state, and its last output is held anyway).

    Each layer runs once under enable_grad on the one before's output, its graph let go before
    the next runs (so the pass holds one layer's graph at a time), with the random generators
    and the buffers put back after it. Not on torch's meta device: its kernels are Python
    (``torch._meta_registrations``, sympy), some 70 MiB resident from the first use in a
    process, which no run of the model itself loads."""
    shapes = [(input.shape, input.dtype)]
    graph: list[int] = []
    reached: list[list[torch.Tensor]] = []
    ends: list[tuple[int, int]] = []
    generators = Generators([input])
    x, counted = input.detach(), False  # counted: the pass before counted x as saved
    for i, layer in enumerate(layers):
        saved: dict[int, int] = {}

        def pack(tensor: torch.Tensor) -> torch.Tensor:
            storage = tensor.untyped_storage()
            saved.setdefault(storage.data_ptr(), storage.nbytes())
            # not the tensor: a layer's output saved as itself would hold its own graph in a
            # cycle the garbage collector cannot see (the whole stack's activations, kept)
            return tensor.detach()

        inputs = x.requires_grad_(differentiable(x.dtype))
        with generators.fork(), Buffers() as touched, torch.enable_grad(), \
                torch.autograd.graph.saved_tensors_hooks(pack, lambda tensor: tensor):
            try:
                out = layer(inputs)
            finally:
                touched.restore()
        if not isinstance(out, torch.Tensor):
            raise InvalidTypeError(f"layer {i} returned a {type(out).__name__}, expected a "
                                   "tensor")
        reached.append(reached_leaves([out] if out.grad_fn is not None else [], {id(inputs)},
                                      set()))
        own = [*reached[-1], *(itertools.chain(layer.parameters(), layer.buffers())
                               if isinstance(layer, torch.nn.Module) else ())]
        held = {t.untyped_storage().data_ptr() for t in own}
        if counted:  # the input, saved by the layer before too, is counted once
            held.add(x.untyped_storage().data_ptr())
        graph.append(sum(b for ptr, b in saved.items() if ptr not in held))
        x_ptr, out_ptr = x.untyped_storage().data_ptr(), out.untyped_storage().data_ptr()
        ends.append((0 if x_ptr in held else saved.get(x_ptr, 0),
                     0 if out_ptr in held or out_ptr == x_ptr else saved.get(out_ptr, 0)))
        counted = out_ptr in saved
        x = out.detach()
        shapes.append((x.shape, x.dtype))
    return shapes, graph, reached, ends


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
