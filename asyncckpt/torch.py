"""PyTorch: a scan whose backward runs asyncckpt, for sequences longer than memory.

``checkpoint_scan(step, carry, xs)`` has ``jax.lax.scan``'s meaning, ``step(carry, x_t) ->
(carry_next, y_t)``, and returns the final carry and the stacked outputs, differentiable with
respect to the initial carry, ``xs`` and the parameters ``step`` closes over. The forward sweep
runs without building a graph and checkpoints carries (every I-th to Level-2 on the I/O
threads, Revolve inside each interval, within ``memory_budget``); the backward re-runs each step
from its restored carry under ``enable_grad`` and back-propagates through that step alone, in
reverse order, so memory is that of one step's graph plus the checkpoints, whatever n.

Imports torch; the rest of asyncckpt never imports this module.
"""
from __future__ import annotations

import functools
import itertools
import math
import weakref
from collections import OrderedDict
from collections.abc import Callable, Sequence
from typing import Any

import torch
from torch.utils import _pytree as pytree

from ._budget import engine_buffers
from ._buffers import padded
from ._options import parse_bytes
from .checkpointer import AsyncCheckpointer
from .errors import InvalidTypeError, InvalidValueError

__all__ = ["checkpoint_scan", "checkpoint_sequential", "closed_over_parameters",
           "activation_shapes", "saved_bytes"]

_UNSET = object()


def _leaves(tree: Any, what: str) -> tuple[list[torch.Tensor], Any]:
    leaves, spec = pytree.tree_flatten(tree)
    for i, leaf in enumerate(leaves):
        if not isinstance(leaf, torch.Tensor):
            raise InvalidTypeError(f"{what} leaf {i} is a {type(leaf).__name__}, expected a "
                                   "torch.Tensor (a tensor or a tuple, list or dict of them)")
    return leaves, spec


class _Tree:
    """A pytree structure, flattened and rebuilt with fast paths for a tensor and a tuple or
    list of tensors (the usual carries and inputs): pytree's general calls cost more than a
    small step."""

    def __init__(self, spec: Any) -> None:
        self.spec = spec
        self.kind: Any = None  # None: pytree's general calls
        if spec is not None and spec.is_leaf():
            self.kind = torch.Tensor
        elif spec is not None and spec.type in (tuple, list) \
                and all(child.is_leaf() for child in spec.children()):
            self.kind = spec.type
        self.count = 0 if spec is None else spec.num_leaves

    def unflatten(self, leaves: Sequence[torch.Tensor]) -> Any:
        if self.kind is torch.Tensor:
            return leaves[0]
        if self.kind is not None:
            return self.kind(leaves)
        return pytree.tree_unflatten(list(leaves), self.spec)

    def leaves(self, tree: Any) -> list[torch.Tensor] | None:
        """``tree``'s leaves where it has this structure with tensors for leaves, by a fast
        path; else None (flatten it in full)."""
        if self.kind is torch.Tensor:
            return [tree] if isinstance(tree, torch.Tensor) else None
        if self.kind is not None and type(tree) is self.kind and len(tree) == self.count \
                and all(isinstance(leaf, torch.Tensor) for leaf in tree):
            return list(tree)
        return None


def closed_over_parameters(step: Callable[..., Any]) -> list[torch.Tensor]:
    """The tensors that require grad which ``step`` reaches: an ``nn.Module``'s parameters and
    tensors, as ``step`` itself, its ``__self__``, a ``functools.partial``'s function and
    arguments, its closure's cells or the globals its code names (two levels deep: a function
    it calls is searched too). Anything reached otherwise: pass ``params=``."""
    found: dict[int, torch.Tensor] = {}

    def visit(obj: Any, depth: int = 0) -> None:
        if isinstance(obj, torch.nn.Module):
            for parameter in obj.parameters():
                if parameter.requires_grad:
                    found.setdefault(id(parameter), parameter)
        elif isinstance(obj, torch.Tensor):
            if obj.requires_grad:
                found.setdefault(id(obj), obj)
        elif isinstance(obj, (list, tuple)) and depth < 2:
            for item in obj:
                visit(item, depth + 1)
        elif isinstance(obj, functools.partial):
            visit(obj.func, depth)
            for item in (*obj.args, *obj.keywords.values()):
                visit(item, depth + 1)
        elif callable(obj) and depth < 2:
            visit(getattr(obj, "__self__", None), depth + 1)
            for cell in getattr(obj, "__closure__", None) or ():
                try:
                    visit(cell.cell_contents, depth + 1)
                except ValueError:  # an empty cell
                    pass
            code, names = getattr(obj, "__code__", None), getattr(obj, "__globals__", {})
            for name in code.co_names if code is not None else ():
                if name in names:
                    visit(names[name], depth + 1)

    visit(step)
    return list(found.values())


def saved_bytes(run: Callable[[], object], outside: Sequence[torch.Tensor]) -> int:
    """The bytes autograd saves for the backward while ``run()`` builds its graph, each storage
    once, less the storages of ``outside`` (inputs and parameters, held anyway)."""
    held = {t.untyped_storage().data_ptr() for t in outside}
    saved: dict[int, int] = {}

    def pack(tensor: torch.Tensor) -> torch.Tensor:
        storage = tensor.untyped_storage()
        if storage.data_ptr() not in held:
            saved.setdefault(storage.data_ptr(), storage.nbytes())
        return tensor

    with torch.enable_grad(), torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        run()
    return sum(saved.values())


class _Live:
    """The carry asyncckpt checkpoints, and its checkpoint descriptor: tensors this module owns,
    seen by the checkpointer as numpy views (host memory) or as the tensors themselves (a CUDA
    device), as bytes where the leaves' dtypes differ."""

    def __init__(self, leaves: Sequence[torch.Tensor]) -> None:
        self.tensors = [leaf.detach().clone().contiguous() for leaf in leaves]
        dtypes = {t.dtype for t in self.tensors}
        self.as_bytes = len(dtypes) > 1
        views = [t.reshape(-1).view(torch.uint8) if self.as_bytes else t.reshape(-1)
                 for t in self.tensors]
        on_device = any(t.device.type != "cpu" for t in self.tensors)
        self.arrays: list[Any] = views if on_device else [v.numpy() for v in views]
        self.dtype = torch.uint8 if self.as_bytes else self.tensors[0].dtype
        self.size = sum(v.numel() for v in views)

    def get_data(self, timestep: int) -> list[Any]:
        return self.arrays

    def get_data_location(self, timestep: int) -> list[Any]:
        return self.arrays


class _Scan:
    """One scan's state between its forward sweep and its backward: the step, the live carry,
    the inputs and outputs, and the checkpointer that holds the carries."""

    def __init__(self, step: Callable[..., Any], carry_spec: Any, carry: Sequence[torch.Tensor],
                 xs_spec: Any, xs: Sequence[torch.Tensor], n: int,
                 params: Sequence[torch.Tensor], segments: int | None,
                 options: dict[str, Any]) -> None:
        self.step, self.carry_spec, self.xs_spec, self.n = step, carry_spec, xs_spec, n
        self.carry_tree, self.xs_tree = _Tree(carry_spec), _Tree(xs_spec)
        self.y_tree: _Tree | None = None
        self.xs, self.params = list(xs), list(params)
        self.xs_data = [x.detach() for x in self.xs]  # indexed per step without a graph
        self.live = _Live(carry)
        self.shapes = [(t.shape, t.dtype, t.device) for t in self.live.tensors]
        self.ys: list[torch.Tensor] | None = None
        self.y_spec: Any = _UNSET
        self.recording = True
        self.adjoint: list[torch.Tensor | None] = []
        self.grad_ys: list[torch.Tensor | None] = []
        self.grad_xs: list[torch.Tensor | None] = []
        self.grad_params: list[torch.Tensor | None] = []
        self.carry_needs_grad: list[bool] = []
        itemsize = torch.empty((), dtype=self.live.dtype).element_size()
        most = graph_share(self.live.size * itemsize, options, SCAN_CHECKPOINTS_SHARE)
        # a step's graph, measured on step 0 where the budget bounds a segment's
        graph = 1 if most is None or segments is not None else max(self.graph_bytes(), 1)
        self.starts = segment_starts([graph] * n, segments, most)
        self.checkpointer = AsyncCheckpointer(
            self.live, _Forward(self), _Reverse(self), len(self.starts) - 1, taping=False,
            **in_segments(options, len(self.starts) - 1))

    name = "checkpoint_scan"

    def forward_outputs(self, inputs: Sequence[torch.Tensor]) -> tuple[torch.Tensor, ...]:
        """After the forward sweep: the final carry and the stacked outputs."""
        self.recording = False
        nc = len(self.live.tensors)
        self.carry_needs_grad = [leaf.requires_grad and leaf.is_floating_point()
                                 for leaf in inputs[:nc]]
        return tuple([t.clone() for t in self.live.tensors] + list(self.ys or []))

    def backward(self, grads: Sequence[torch.Tensor | None]) -> tuple[Any, ...]:
        """The reverse sweep from the outputs' gradients: those of the initial carry, ``xs``
        and the parameters."""
        nc = len(self.live.tensors)
        self.adjoint = [g if g is not None else torch.zeros_like(t)
                        for g, t in zip(grads[:nc], self.live.tensors)]
        self.grad_ys = list(grads[nc:])
        self.grad_xs = [torch.zeros_like(x) if x.requires_grad else None for x in self.xs]
        self.grad_params = [None] * len(self.params)
        self.checkpointer.apply_reverse()
        carry_grads = [g if needs else None
                       for g, needs in zip(self.adjoint, self.carry_needs_grad)]
        grads_out = (*carry_grads, *self.grad_xs, *self.grad_params)
        # let go of them, so autograd can take them into .grad instead of copying them
        self.adjoint, self.grad_xs, self.grad_params = [], [], []
        return grads_out

    def x(self, t: int, grad: bool = False) -> Any:
        leaves = [data[t].requires_grad_() if grad and x.requires_grad else data[t]
                  for x, data in zip(self.xs, self.xs_data)]
        return self.xs_tree.unflatten(leaves) if self.xs_spec is not None else None

    def call(self, t: int, carry: Any, x: Any) -> tuple[list[torch.Tensor], list[torch.Tensor]]:
        """``step(carry, x)``, its carry checked against the one it was given."""
        result = self.step(carry, x)
        if not isinstance(result, tuple) or len(result) != 2:
            raise InvalidTypeError(f"step {t} returned a {type(result).__name__}, expected a "
                                   "pair (carry_next, y)")
        new, y = result
        new_leaves = self.carry_tree.leaves(new)
        if new_leaves is None:
            new_leaves, new_spec = _leaves(new, f"the carry step {t} returned:")
            if new_spec != self.carry_spec:
                raise InvalidValueError(f"step {t} returned a carry of structure {new_spec}, it "
                                        f"was given {self.carry_spec}")
        for i, (leaf, (shape, dtype, device)) in enumerate(zip(new_leaves, self.shapes)):
            if leaf.shape != shape or leaf.dtype != dtype or leaf.device != device:
                raise InvalidValueError(
                    f"step {t} returned carry leaf {i} of shape {tuple(leaf.shape)}, "
                    f"{leaf.dtype} on {leaf.device}; it was given {tuple(shape)}, {dtype} "
                    f"on {device}")
        y_leaves = None if y is None or self.y_tree is None else self.y_tree.leaves(y)
        if y_leaves is None:
            y_leaves, y_spec = _leaves(y, f"the output step {t} returned:") if y is not None \
                else ([], None)
            if self.y_spec is _UNSET:
                self.y_spec, self.y_tree = y_spec, _Tree(y_spec)
            elif y_spec != self.y_spec:
                raise InvalidValueError(f"step {t} returned an output of structure {y_spec}, "
                                        f"step 0 returned {self.y_spec}")
        return new_leaves, y_leaves

    def graph_bytes(self) -> int:
        """The bytes step 0's graph keeps for its backward (the tensors autograd saves, each
        storage once; not the carry it was given, ``xs`` or the parameters): the step run once
        more, from u_0, and its graph let go."""
        inputs = [leaf.detach().requires_grad_(leaf.is_floating_point())
                  for leaf in self.live.tensors]
        return saved_bytes(
            lambda: self.call(0, self.carry_tree.unflatten(inputs), self.x(0, grad=True)),
            [*self.live.tensors, *self.xs_data, *self.params])

    def advance(self, start: int, end: int) -> None:
        live = carry = self.live.tensors
        with torch.no_grad():
            # each step takes the one before's carry as it returned it; the live carry, which
            # the checkpointer reads, takes the segment's last
            for t in range(self.starts[start], self.starts[end]):
                carry, y = self.call(t, self.carry_tree.unflatten(carry), self.x(t))
                if self.recording:
                    if self.ys is None:
                        self.ys = [torch.empty((self.n, *leaf.shape), dtype=leaf.dtype,
                                               device=leaf.device) for leaf in y]
                    for out, leaf in zip(self.ys, y):
                        out[t].copy_(leaf)
            for target, leaf in zip(live, carry):
                if leaf is not target:
                    target.copy_(leaf)

    def reverse(self, s: int) -> None:
        """Segment s's steps again under enable_grad from its first carry (live), and one
        backward through them into the carry's, ``xs``'s and the parameters' adjoints."""
        begin, end = self.starts[s], self.starts[s + 1]
        with torch.enable_grad():
            # every floating leaf: carries after u_0 depend on xs and the parameters
            inputs = [leaf.detach().requires_grad_(leaf.is_floating_point())
                      for leaf in self.live.tensors]
            carry, outputs, seeds, x_leaves = inputs, [], [], []
            for t in range(begin, end):
                x = self.x(t, grad=True)
                x_leaves.append(self.xs_tree.leaves(x) or pytree.tree_leaves(x)
                                if x is not None else [])
                carry, y = self.call(t, self.carry_tree.unflatten(carry), x)
                for leaf, grads in zip(y, self.grad_ys):
                    if grads is not None and leaf.requires_grad:
                        outputs.append(leaf)
                        seeds.append(grads[t])
            for leaf, seed in zip(carry, self.adjoint):
                if seed is not None and leaf.requires_grad:
                    outputs.append(leaf)
                    seeds.append(seed)
            # Each parameter's sum so far enters its gradient first, through an identity made
            # last (autograd runs it first): the later steps' parts are then added one by one,
            # in the order plain autograd adds them, so the sums are its own to the last bit.
            for parameter, total in zip(self.params, self.grad_params):
                if total is not None and parameter.requires_grad:
                    outputs.append(parameter.view_as(parameter))
                    seeds.append(total)
            wrt = [*inputs, *(leaf for leaves in x_leaves for leaf in leaves), *self.params]
            wanted = [leaf for leaf in wrt if leaf.requires_grad]
            grads = iter(torch.autograd.grad(outputs, wanted, seeds, allow_unused=True)
                         if outputs and wanted else [None] * len(wanted))
            got = [next(grads) if leaf.requires_grad else None for leaf in wrt]
        nc, nx = len(inputs), len(self.xs)
        self.adjoint = got[:nc]
        for i, t in enumerate(range(begin, end)):
            for j, grad in enumerate(got[nc + i * nx:nc + (i + 1) * nx]):
                if grad is not None:
                    target = self.grad_xs[j]
                    assert target is not None
                    target[t] = grad
        for k, grad in enumerate(got[nc + (end - begin) * nx:]):
            if grad is not None:
                self.grad_params[k] = grad


class _Forward:
    def __init__(self, scan: _Scan) -> None:
        self.scan = scan

    def apply(self, *, t_start: int, t_end: int) -> None:
        self.scan.advance(t_start, t_end)


class _Reverse:
    def __init__(self, scan: _Scan) -> None:
        self.scan = scan

    def apply(self, *, t_start: int, t_end: int) -> None:
        self.scan.reverse(t_start)


class _Checkpointed(torch.autograd.Function):
    """A forward sweep checkpointed by asyncckpt, and its reverse sweep as the backward: ``run``
    (a :class:`_Scan` or :class:`_Sequential`) does both."""

    @staticmethod
    def forward(ctx: Any, run: Any, *inputs: torch.Tensor) -> Any:  # type: ignore[override]
        try:
            run.checkpointer.apply_forward()
            outputs = run.forward_outputs(inputs)
        except BaseException:
            run.checkpointer.close()
            raise
        ctx.run, ctx.name = run, run.name
        ctx.mark_non_differentiable(*(t for t in outputs if not t.is_floating_point()))
        return outputs

    @staticmethod
    def backward(ctx: Any, *grads: torch.Tensor | None) -> Any:
        run = getattr(ctx, "run", None)
        if run is None:
            raise RuntimeError(f"Trying to backward through {ctx.name} a second time: its "
                               "checkpoints were freed after the first backward (call it again "
                               "for another backward pass)")
        ctx.run = None
        try:
            return (None, *run.backward(grads))
        finally:
            run.checkpointer.close()


def activation_shapes(layers: Sequence[Any], input: torch.Tensor) -> list[tuple[Any, Any]]:
    """(shape, dtype) of the input of each layer and of the last one's output, from a pass on
    torch's meta device (no data, no compute); a layer that cannot run there is run for real,
    without a graph, from that layer on."""
    return _meta_pass(layers, input)[0]


def _meta_pass(layers: Sequence[Any], input: torch.Tensor) -> tuple[list[tuple[Any, Any]],
                                                                    list[int | None]]:
    """:func:`activation_shapes`, and the bytes each layer's graph keeps for its backward
    (the tensors autograd saves, each counted once, parameters not at all; None for a layer
    run for real)."""
    from torch.func import functional_call

    shapes = [(input.shape, input.dtype)]
    graph: list[int | None] = []
    x = input.detach().to("meta").requires_grad_(input.is_floating_point())
    real: torch.Tensor | None = None
    parameters: dict[int, torch.Tensor] = {}  # held, so that no later tensor takes an id
    saved: dict[int, torch.Tensor] = {}  # the tensors held, so ids stay theirs
    kept = [0]  # their bytes

    def pack(tensor: torch.Tensor) -> torch.Tensor:
        base = tensor if tensor._base is None else tensor._base  # a view keeps its base
        if id(base) not in parameters and id(base) not in saved:
            saved[id(base)] = base
            kept[0] += base.numel() * base.element_size()
        return tensor

    for i, layer in enumerate(layers):
        if real is None:
            before = kept[0]
            try:
                with torch.autograd.graph.saved_tensors_hooks(pack, lambda tensor: tensor):
                    if isinstance(layer, torch.nn.Module):
                        state = {name: t.to("meta") for name, t in
                                 [*layer.named_parameters(), *layer.named_buffers()]}
                        parameters.update((id(t), t) for t in state.values())
                        x = functional_call(layer, state, (x,))
                    else:
                        x = layer(x)
                graph.append(kept[0] - before)
            except (NotImplementedError, RuntimeError):
                real = input
                with torch.no_grad():
                    for earlier in layers[:i]:
                        real = earlier(real)
        if real is not None:
            with torch.no_grad():
                real = layer(real)
            x = real
            graph.append(None)
        if not isinstance(x, torch.Tensor):
            raise InvalidTypeError(f"layer {i} returned a {type(x).__name__}, expected a tensor")
        shapes.append((x.shape, x.dtype))
    return shapes, graph


# The share of a scan's budget its checkpoints keep; a segment's graph gets the rest. Each
# segment costs a call of the autograd engine (some 0.5 ms on the CPU), and a scan's carries
# beyond the budget go to Level-2, so longer segments pay more than Level-1 slots: a quarter
# ran 1 to 15% faster than half at five budgets, 0.6% to 100% of the carries (of 1 and 64
# KiB).
SCAN_CHECKPOINTS_SHARE = 0.25
# A stack's: its activations are its checkpoints, and each is as large as a layer's graph.
STACK_CHECKPOINTS_SHARE = 0.5


def graph_share(nbytes: int, options: dict[str, Any], kept: float) -> int | None:
    """How many bytes of ``memory_budget`` (in ``options``; by default a quarter of the
    available memory, unless ``l1_slots`` is given) one segment's graph may take beside
    checkpoints of ``nbytes``: what the checkpoints leave, the checkpoints keeping the share
    ``kept`` of it, and at least the engine's buffers and one slot.
    ``options["memory_budget"]`` becomes the checkpoints' share. None where no budget is
    given."""
    budget = options.get("memory_budget")
    if budget is None:
        if "l1_slots" in options:
            return None
        from .compat import default_budget
        budget = default_budget(nbytes)
    budget = parse_bytes("memory_budget", budget)
    checkpoints = max(int(budget * kept), (engine_buffers() + 1) * padded(nbytes))
    most = max(budget - checkpoints, 0)
    options["memory_budget"] = budget - most
    return most


def in_segments(options: dict[str, Any], count: int) -> dict[str, Any]:
    """``options`` for a checkpointer whose steps are ``count`` segments: a fixed interval
    (which counts segments) at most the run."""
    interval = options.get("interval")
    if isinstance(interval, int) and not isinstance(interval, bool) and interval > count:
        return {**options, "interval": count}
    return options


def segment_starts(graph: Sequence[int], segments: int | None, most: int | None) -> list[int]:
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
    """
    n = len(graph)
    if segments is not None:
        if isinstance(segments, bool) or not isinstance(segments, int) or segments < 1:
            raise InvalidValueError(f"segments must be a positive int or None, got {segments!r}")
        count = min(segments, n)
        return [n * k // count for k in range(count)] + [n]
    cap = -(-sum(graph) // (math.isqrt(n - 1) + 1))  # ceil(total / ceil(sqrt(n)))
    if most is not None:
        cap = min(cap, most)
    starts, held = [0], 0
    for t, nbytes in enumerate(graph):
        if t > starts[-1] and held + nbytes > cap:
            starts.append(t)
            held = 0
        held += nbytes
    return starts + [n]


class _Passes:
    """The meta passes of recent stacks, for the next call on the same layers and input: a
    model trained over many calls skips its pass (0.15 s for 200 layers).

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


_PASSES = _Passes()


class _Sequential:
    """A stack of layers as a run of asyncckpt: a step is a segment of consecutive layers, and
    u_s the input of segment s, stored as bytes in one buffer the size of the largest (states
    of different sizes). The backward of a segment runs its layers again under enable_grad and
    back-propagates through them in one call, as ``torch.utils.checkpoint`` does; the segments
    are as long as ``memory_budget`` lets their graphs be, beside the checkpoints."""

    name = "checkpoint_sequential"

    def __init__(self, layers: Sequence[Any], input: torch.Tensor, segments: int | None,
                 options: dict[str, Any], key: tuple[Any, ...]) -> None:
        self.layers = list(layers)
        passed = _PASSES.get(key, self.layers)
        #: whether the shapes came from an earlier call's pass
        self.remembered = passed is not None
        if passed is None:
            passed = _meta_pass(self.layers, input)
            _PASSES.put(key, self.layers, passed)
        self.shapes, graph = passed
        sizes = [torch.Size(shape).numel() * torch.empty((), dtype=dtype).element_size()
                 for shape, dtype in self.shapes]
        # a layer run for real, off the meta device: its input and output, as a bound
        graph = [sizes[t] + sizes[t + 1] if g is None else g for t, g in enumerate(graph)]
        self.starts = segment_starts(graph, segments,
                                     graph_share(max(sizes), options, STACK_CHECKPOINTS_SHARE))
        self.sizes = [sizes[t] for t in self.starts]
        self.size, self.dtype = max(self.sizes), torch.uint8  # the descriptor's: the largest
        self.buffer = torch.empty(self.size, dtype=torch.uint8, device=input.device)
        self.view(0).copy_(input)
        self.arrays = self.buffer if input.device.type != "cpu" else self.buffer.numpy()
        self.params = [list({id(p): p for t in range(begin, end)
                             for p in closed_over_parameters(self.layers[t])}.values())
                       for begin, end in zip(self.starts, self.starts[1:])]
        self.flat_params = list({id(p): p for ps in self.params for p in ps}.values())
        self.index = {id(p): k for k, p in enumerate(self.flat_params)}
        self.adjoint: torch.Tensor | None = None
        self.grad_params: list[torch.Tensor | None] = []
        self.checkpointer = AsyncCheckpointer(self, _Forward(self), _Reverse(self),
                                              len(self.starts) - 1, taping=False,
                                              **in_segments(options, len(self.starts) - 1))

    def view(self, s: int) -> torch.Tensor:
        """The live activation u_s: the buffer's first bytes, as segment s's input."""
        shape, dtype = self.shapes[self.starts[s]]
        return self.buffer[:self.sizes[s]].view(dtype).view(shape)

    # the checkpoint descriptor asyncckpt reads: u_0 at the descriptor's size, as it checks
    def get_data(self, timestep: int) -> list[Any]:
        return [self.arrays if timestep == 0 else self.arrays[:self.sizes[timestep]]]

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
        for s in range(start, end):
            with torch.no_grad():
                output = self.segment(s, self.view(s))
                if output.untyped_storage().data_ptr() == \
                        self.buffer.untyped_storage().data_ptr():
                    output = output.clone()  # a view of its input (a reshape, say)
                self.view(s + 1).copy_(output)

    def reverse(self, s: int) -> None:
        floating = self.shapes[self.starts[s]][1].is_floating_point
        with torch.enable_grad():
            inputs = self.view(s).detach().requires_grad_(floating)
            output = self.segment(s, inputs)
            wanted = ([inputs] if floating else []) + self.params[s]
            got = torch.autograd.grad(output, wanted, self.adjoint, allow_unused=True) \
                if output.requires_grad and wanted else [None] * len(wanted)
        self.adjoint = got[0] if floating else None
        for parameter, grad in zip(self.params[s], got[1:] if floating else got):
            if grad is not None:  # summed from the last segment down, as autograd sums them
                k = self.index[id(parameter)]
                total = self.grad_params[k]
                if total is None:
                    self.grad_params[k] = grad.clone()
                else:
                    total.add_(grad)

    def forward_outputs(self, inputs: Sequence[torch.Tensor]) -> tuple[torch.Tensor, ...]:
        self.input_needs_grad = inputs[0].requires_grad
        return (self.view(len(self.starts) - 1).clone(),)

    def backward(self, grads: Sequence[torch.Tensor | None]) -> tuple[Any, ...]:
        (grad,) = grads
        last = self.view(len(self.starts) - 1)
        self.adjoint = grad if grad is not None else torch.zeros_like(last)
        self.grad_params = [None] * len(self.flat_params)
        self.checkpointer.apply_reverse()
        grads_out = (self.adjoint if self.input_needs_grad else None, *self.grad_params)
        # let go of them, so autograd can take them into .grad instead of copying them
        self.adjoint, self.grad_params = None, []
        return grads_out


def checkpoint_sequential(functions: Sequence[Any] | torch.nn.Sequential, input: torch.Tensor,
                          *, segments: int | None = None,
                          memory_budget: int | str | None = None, storage: Any = None,
                          interval: int | str = "auto", **options: Any) -> torch.Tensor:
    """``functions`` applied in turn to ``input``, back-propagated by asyncckpt in bounded memory.

    The stack is cut into segments of consecutive layers; the input of each is a state that
    asyncckpt checkpoints (every I-th to Level-2, Revolve in between), and the backward runs a
    segment's layers again under enable_grad and back-propagates through them in one call, as
    ``torch.utils.checkpoint.checkpoint_sequential`` does. The inputs of segments may differ in
    shape and size (each is stored at its own size in a budget sized for the largest). The
    shapes, and the bytes each layer's graph keeps, come first from a pass on torch's meta
    device. Layers must be deterministic and keep no state across calls (dropout, batch norm
    in training mode: as with ``torch.utils.checkpoint``).

    Parameters
    ----------
    functions : nn.Sequential or sequence of modules or callables
        Each takes the previous one's output tensor and returns one tensor.
    input : tensor
    segments : int, optional
        That many segments of equal numbers of layers. Default: from the budget, which covers
        the checkpoints and one segment's graph: segments whose graphs take at most half of it
        (the checkpoints keep the rest), and at least sqrt(layers) segments.
    memory_budget, storage, interval, **options
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
    if not isinstance(input, torch.Tensor):
        raise InvalidTypeError(f"input must be a tensor, got a {type(input).__name__}")
    if memory_budget is not None:
        options["memory_budget"] = memory_budget
    options.update(storage=storage, interval=interval)
    key = _Passes.key(layers, input)
    run = _Sequential(layers, input, segments, dict(options), key)
    try:
        (output,) = _Checkpointed.apply(run, input, *run.flat_params)
    except InvalidValueError:
        if not run.remembered:
            raise
        _PASSES.drop(key)  # a layer's outputs changed since its pass: once more, afresh
        run = _Sequential(layers, input, segments, dict(options), key)
        (output,) = _Checkpointed.apply(run, input, *run.flat_params)
    if not output.requires_grad:
        run.checkpointer.close()
    return output


def checkpoint_scan(step: Callable[[Any, Any], tuple[Any, Any]], carry: Any, xs: Any = None, *,
                    n_steps: int | None = None, params: Sequence[torch.Tensor] | None = None,
                    segments: int | None = None, memory_budget: int | str | None = None,
                    storage: Any = None, interval: int | str = "auto",
                    **options: Any) -> tuple[Any, Any]:
    """Scan ``step`` over ``xs`` (or ``n_steps`` times), reversed by asyncckpt in bounded memory.

    Parameters
    ----------
    step : callable
        ``step(carry, x_t) -> (carry_next, y_t)``; ``carry_next`` of the same structure, shapes,
        dtypes and devices as ``carry``; ``y_t`` a tensor, a pytree of them, or None. It must
        compute the same values when run again (deterministic kernels) and leave its inputs
        unmodified.
    carry : tensor or pytree of tensors
        The initial carry.
    xs : tensor or pytree of tensors, optional
        Scanned along their first dimension (all of length n); None with ``n_steps``.
    n_steps : int, optional
        n, where ``xs`` is None (``x_t`` is then None).
    params : sequence of tensors, optional
        The tensors to differentiate beside ``carry`` and ``xs``; default: those ``step``
        closes over (see :func:`closed_over_parameters`).
    segments : int, optional
        The steps are cut into segments of consecutive steps, each a step of asyncckpt (its
        first carry the state checkpointed); the backward runs a segment's steps again under
        enable_grad and back-propagates through them in one call. That many segments of equal
        length; default: from the budget, which covers the checkpoints and one segment's graph:
        segments whose graphs (step 0's, measured once more) take at most three quarters of
        it (the checkpoints keep the rest, and Level-2 what is beyond it), and at least sqrt(n)
        segments.
    memory_budget, storage, interval, **options
        As :class:`~asyncckpt.AsyncCheckpointer`'s (default budget: a quarter of the available
        memory; Level-2 beyond it in the temporary directory). The taping-free protocol is used.

    Returns
    -------
    (final carry, stacked outputs)
        The outputs with a leading dimension n (None where ``step`` returns None).

    Raises
    ------
    InvalidTypeError, InvalidValueError
        A leaf that is not a tensor, ``xs`` of different lengths, a step whose carry changes
        structure, shape, dtype or device (naming the step).
    """
    carry_leaves, carry_spec = _leaves(carry, "carry")
    if not carry_leaves:
        raise InvalidValueError("carry must hold at least one tensor")
    xs_leaves, xs_spec = _leaves(xs, "xs") if xs is not None else ([], None)
    lengths = {int(x.shape[0]) if x.dim() else -1 for x in xs_leaves}
    if -1 in lengths or len(lengths) > 1:
        raise InvalidValueError(f"xs leaves must share their first dimension (the steps), got "
                                f"shapes {[tuple(x.shape) for x in xs_leaves]}")
    n = lengths.pop() if lengths else n_steps
    if n_steps is not None and n != n_steps:
        raise InvalidValueError(f"n_steps={n_steps} but xs hold {n} steps")
    if not isinstance(n, int) or isinstance(n, bool) or n < 1:
        raise InvalidValueError(f"checkpoint_scan needs n >= 1 steps: xs with a first "
                                f"dimension, or n_steps; got {n!r}")
    if params is None:
        params = closed_over_parameters(step)
    for k, p in enumerate(params):
        if not isinstance(p, torch.Tensor):
            raise InvalidTypeError(f"params[{k}] is a {type(p).__name__}, expected a tensor")
    if memory_budget is not None:
        options["memory_budget"] = memory_budget
    scan = _Scan(step, carry_spec, carry_leaves, xs_spec, xs_leaves, n, params, segments,
                 {"storage": storage, "interval": interval, **options})
    outputs = _Checkpointed.apply(scan, *carry_leaves, *xs_leaves, *params)
    if not any(out.requires_grad for out in outputs):
        scan.checkpointer.close()  # no backward will come (no_grad, or nothing to differentiate)
    nc = len(carry_leaves)
    final = pytree.tree_unflatten(list(outputs[:nc]), carry_spec)
    ys = pytree.tree_unflatten(list(outputs[nc:]), scan.y_spec) \
        if scan.y_spec not in (None, _UNSET) else None
    return final, ys

