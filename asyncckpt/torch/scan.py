"""``checkpoint_scan``: a scan whose backward runs asyncckpt."""
from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import torch
from torch.utils import _pytree as pytree

from ..checkpointer import AsyncCheckpointer
from ..errors import InvalidTypeError, InvalidValueError
from ..planning import scan_length

from .function import Checkpointed, ForwardOperator, ReverseOperator, record_stats
from .segments import SCAN_CHECKPOINTS_SHARE, graph_share, in_segments, segment_starts
from .trees import UNSET, Live, Tree, closed_over_parameters, leaves, saved_bytes

__all__ = ["ScanRun", "checkpoint_scan"]

class ScanRun:
    """One scan's state between its forward sweep and its backward: the step, the live carry,
    the inputs and outputs, and the checkpointer that holds the carries."""

    def __init__(self, step: Callable[..., Any], carry_spec: Any, carry: Sequence[torch.Tensor],
                 xs_spec: Any, xs: Sequence[torch.Tensor], n: int,
                 params: Sequence[torch.Tensor], segments: int | None,
                 options: dict[str, Any]) -> None:
        self.step, self.carry_spec, self.xs_spec, self.n = step, carry_spec, xs_spec, n
        self.carry_tree, self.xs_tree = Tree(carry_spec), Tree(xs_spec)
        self.y_tree: Tree | None = None
        self.xs, self.params = list(xs), list(params)
        self.xs_data = [x.detach() for x in self.xs]  # indexed per step without a graph
        self.live = Live(carry)
        self.shapes = [(t.shape, t.dtype, t.device) for t in self.live.tensors]
        self.ys: list[torch.Tensor] | None = None
        self.y_spec: Any = UNSET
        self.recording = True
        self.adjoint: list[torch.Tensor | None] = []
        self.grad_ys: list[torch.Tensor | None] = []
        self.grad_xs: list[torch.Tensor | None] = []
        self.grad_params: list[torch.Tensor | None] = []
        self.carry_needs_grad: list[bool] = []
        itemsize = torch.empty((), dtype=self.live.dtype).element_size()
        most, options = graph_share(self.live.size * itemsize, options, SCAN_CHECKPOINTS_SHARE)
        # a step's graph, measured on step 0 where the budget bounds a segment's
        graph = 1 if most is None or segments is not None else max(self.graph_bytes(), 1)
        self.starts = segment_starts([graph] * n, segments, most)
        self.checkpointer = AsyncCheckpointer(
            self.live, ForwardOperator(self), ReverseOperator(self), len(self.starts) - 1,
            taping=False, **in_segments(options, len(self.starts) - 1))

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
            new_leaves, new_spec = leaves(new, f"the carry step {t} returned:")
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
            y_leaves, y_spec = leaves(y, f"the output step {t} returned:") if y is not None \
                else ([], None)
            if self.y_spec is UNSET:
                self.y_spec, self.y_tree = y_spec, Tree(y_spec)
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
            found = iter(torch.autograd.grad(outputs, wanted, seeds, allow_unused=True)
                         if outputs and wanted else [None] * len(wanted))
            got = [next(found) if leaf.requires_grad else None for leaf in wrt]
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
    carry_leaves, carry_spec = leaves(carry, "carry")
    if not carry_leaves:
        raise InvalidValueError("carry must hold at least one tensor")
    xs_leaves, xs_spec = leaves(xs, "xs") if xs is not None else ([], None)
    n = scan_length([tuple(x.shape) for x in xs_leaves], n_steps, "n_steps")
    if params is None:
        params = closed_over_parameters(step)
    for k, p in enumerate(params):
        if not isinstance(p, torch.Tensor):
            raise InvalidTypeError(f"params[{k}] is a {type(p).__name__}, expected a tensor")
    if memory_budget is not None:
        options["memory_budget"] = memory_budget
    scan = ScanRun(step, carry_spec, carry_leaves, xs_spec, xs_leaves, n, params, segments,
                 {"storage": storage, "interval": interval, **options})
    outputs = Checkpointed.apply(scan, *carry_leaves, *xs_leaves, *params)
    if not any(out.requires_grad for out in outputs):
        scan.checkpointer.close()  # no backward will come (no_grad, or nothing to differentiate)
        record_stats(scan.checkpointer.stats)
    nc = len(carry_leaves)
    final = pytree.tree_unflatten(list(outputs[:nc]), carry_spec)
    ys = pytree.tree_unflatten(list(outputs[nc:]), scan.y_spec) \
        if scan.y_spec not in (None, UNSET) else None
    return final, ys
