"""Pytrees of tensors as the checkpointer sees them: their leaves, the live carry, the
parameters a step closes over and the bytes a step's graph saves."""
from __future__ import annotations

import functools
from collections.abc import Callable, Sequence
from typing import Any

import torch
from torch.utils import _pytree as pytree

from ..errors import InvalidTypeError

__all__ = ["UNSET", "Live", "Tree", "closed_over_parameters", "leaves", "saved_bytes"]

UNSET = object()


def leaves(tree: Any, what: str) -> tuple[list[torch.Tensor], Any]:
    leaves, spec = pytree.tree_flatten(tree)
    for i, leaf in enumerate(leaves):
        if not isinstance(leaf, torch.Tensor):
            raise InvalidTypeError(f"{what} leaf {i} is a {type(leaf).__name__}, expected a "
                                   "torch.Tensor (a tensor or a tuple, list or dict of them)")
    return leaves, spec


class Tree:
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
    it calls is searched too). A guess from the closures, kept for callers that want a list
    up front: :func:`checkpoint_scan` and :func:`checkpoint_sequential` find what needs a
    gradient in the graph autograd builds instead, however deep the helpers."""
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
        return tensor.detach()  # an output saved as itself would keep its graph

    with torch.enable_grad(), torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        run()
    return sum(saved.values())


def numpy_has(dtype: torch.dtype) -> bool:
    """Whether a CPU tensor of ``dtype`` has a numpy view (not bfloat16, nor complex32)."""
    try:
        torch.empty(0, dtype=dtype).numpy()
    except TypeError:
        return False
    return True


class Live:
    """The carry asyncckpt checkpoints, and its checkpoint descriptor: tensors this module owns,
    seen by the checkpointer as numpy views (host memory) or as the tensors themselves (a CUDA
    device), as bytes where the leaves' dtypes differ."""

    def __init__(self, leaves: Sequence[torch.Tensor], extra_bytes: int = 0) -> None:
        self.tensors = [leaf.detach().clone().contiguous() for leaf in leaves]
        dtypes = {t.dtype for t in self.tensors}
        on_device = any(t.device.type != "cpu" for t in self.tensors)
        # as bytes where numpy has no such dtype (bfloat16) as where the dtypes differ
        self.as_bytes = len(dtypes) > 1 or (not on_device and not all(map(numpy_has, dtypes)))
        views = [t.reshape(-1).view(torch.uint8) if self.as_bytes else t.reshape(-1)
                 for t in self.tensors]
        #: ``extra_bytes`` checkpointed with the carry (the random generators' state), as
        #: bytes; their array is padded to whole elements of the carry's dtype
        self.extra: torch.Tensor | None = None
        if extra_bytes:
            itemsize = views[0].element_size()
            padded = torch.zeros(-(-extra_bytes // itemsize) * itemsize, dtype=torch.uint8,
                                 device=self.tensors[0].device)
            self.extra = padded[:extra_bytes]
            views.append(padded.view(views[0].dtype))
        self.arrays: list[Any] = views if on_device else [v.numpy() for v in views]
        self.dtype = torch.uint8 if self.as_bytes else self.tensors[0].dtype
        self.size = sum(v.numel() for v in views)

    def get_data(self, timestep: int) -> list[Any]:
        return self.arrays

    def get_data_location(self, timestep: int) -> list[Any]:
        return self.arrays
