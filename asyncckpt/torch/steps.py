"""The user's step as ``checkpoint_scan`` calls it: ``x_t`` taken from ``xs``, the carry and the
output it returns flattened and checked (the carry against the initial one, the output's
structure against step 0's), and step 0 run once more before the run, to learn what its graph
keeps, what needs a gradient in it and whether it draws random numbers."""
from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import torch
from torch.utils import _pytree as pytree

from ..errors import InvalidTypeError, InvalidValueError

from .preserve import (Autocast, Buffers, Generators, UnlistedLeafError, describe_leaf,
                       differentiable, outside_nodes, reached_leaves)
from .trees import UNSET, Tree, leaves

__all__ = ["Step"]


class Step:
    """``step(carry, x_t) -> (carry_next, y_t)`` on pytrees of tensors, called with and
    returning flat lists of leaves.

    Parameters
    ----------
    function
        The user's step.
    carry_spec, carry
        The initial carry's structure and leaves: every carry a step returns has them, and its
        leaves their shapes, dtypes and devices.
    xs_spec, xs
        The scanned inputs' structure (None: ``x_t`` is None) and leaves.
    """

    def __init__(self, function: Callable[..., Any], carry_spec: Any,
                 carry: Sequence[torch.Tensor], xs_spec: Any,
                 xs: Sequence[torch.Tensor]) -> None:
        self.function, self.carry_spec, self.xs_spec = function, carry_spec, xs_spec
        self.carry_tree, self.xs_tree = Tree(carry_spec), Tree(xs_spec)
        self.y_tree: Tree | None = None
        self.y_spec: Any = UNSET
        self.xs = list(xs)
        self.xs_data = [x.detach() for x in self.xs]  # indexed per step without a graph
        self.shapes = [(t.shape, t.dtype, t.device) for t in carry]

    def x(self, t: int, grad: bool = False) -> Any:
        leaves = [data[t].requires_grad_() if grad and x.requires_grad else data[t]
                  for x, data in zip(self.xs, self.xs_data)]
        return self.xs_tree.unflatten(leaves) if self.xs_spec is not None else None

    def x_leaves(self, x: Any) -> list[torch.Tensor]:
        """The leaves of ``x``, from :meth:`x`."""
        return (self.xs_tree.leaves(x) or pytree.tree_leaves(x)) if x is not None else []

    def __call__(self, t: int, carry: Any, x: Any
                 ) -> tuple[list[torch.Tensor], list[torch.Tensor]]:
        """``step(carry, x)``, its carry checked against the one it was given."""
        result = self.function(carry, x)
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

    def probe(self, carry: Sequence[torch.Tensor], params: Sequence[torch.Tensor] | None,
              generators: Generators, autocast: Autocast, name: str
              ) -> tuple[int, list[torch.Tensor], bool, list[tuple[str, torch.Tensor]],
                         list[tuple[Any, list[torch.Tensor]]]]:
        """Step 0 run once more under enable_grad (and ``autocast``), from u_0, its graph let
        go and nothing it changes kept (``generators``, buffers): the bytes its graph keeps for
        the backward (the tensors autograd saves, each storage once; not the carry, ``xs`` or
        the parameters), the tensors that need a gradient it reaches (``params``, or those
        autograd finds in its graph), whether it draws random numbers, and the parameters of
        the modules it calls, by name (for errors), and the nodes its graph reaches that were
        made before it (tensors computed outside the step, not in ``params``) with the leaves
        behind each.

        Raises
        ------
        UnlistedLeafError
            ``params`` is given and step 0 reaches another tensor that needs a gradient.
        InvalidValueError
            A module step 0 calls changes a buffer its outputs may read.
        """
        inputs = [leaf.detach().requires_grad_(differentiable(leaf.dtype)) for leaf in carry]
        x = self.x(0, grad=True)
        x_leaves = self.x_leaves(x)
        saved: dict[int, int] = {}

        def pack(tensor: torch.Tensor) -> torch.Tensor:
            storage = tensor.untyped_storage()
            saved.setdefault(storage.data_ptr(), storage.nbytes())
            return tensor.detach()  # an output saved as itself would keep its graph

        known = {id(t) for t in [*inputs, *x_leaves, *(params or ())] if t.grad_fn is None}
        stops = {p.grad_fn for p in params or () if p.grad_fn is not None}
        with generators.fork(), Buffers() as touched:
            try:
                before = generators.get()
                with torch.enable_grad():  # the number the first node of step 0 takes
                    first = torch.zeros(1, requires_grad=True).view(1).grad_fn
                with autocast(), torch.enable_grad(), \
                        torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
                    new, y = self(0, self.carry_tree.unflatten(inputs), x)
                drew = not torch.equal(before, generators.get())
                touched.check(f"{name}: step 0")
                roots = [t for t in [*new, *y] if t.requires_grad]
                found = reached_leaves(roots, known, stops)
                outside = outside_nodes(roots, first._sequence_nr() + 1 if first else 0, stops)
            finally:
                touched.restore()
        named = list(touched.named())
        if params is None:
            params = found
        elif found:
            raise UnlistedLeafError(
                f"{name}: step 0 reaches {describe_leaf(found[0], named)}, which "
                f"requires grad and is not in params= ({len(params)} tensors); add it, or leave "
                "params=None to differentiate every tensor autograd finds")
        held = {t.untyped_storage().data_ptr() for t in [*carry, *self.xs_data, *params]}
        return (sum(b for ptr, b in saved.items() if ptr not in held), list(params), drew, named,
                outside)
