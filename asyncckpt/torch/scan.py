"""``checkpoint_scan``: a scan whose backward runs asyncckpt."""
from __future__ import annotations

import contextlib
from collections.abc import Callable, Sequence
from typing import Any

import torch
from torch.utils import _pytree as pytree

from ..checkpointer import AsyncCheckpointer
from ..errors import InvalidTypeError, InvalidValueError
from ..planning import scan_length

from .function import Checkpointed, ForwardOperator, ReverseOperator, record_stats
from .preserve import (Autocast, Buffers, Generators, LateDraw, UnlistedLeafError,
                       describe_leaf, reached_leaves)
from .segments import SCAN_CHECKPOINTS_SHARE, graph_share, in_segments, segment_starts
from .trees import UNSET, Live, Tree, leaves

__all__ = ["ScanRun", "checkpoint_scan"]

class ScanRun:
    """One scan's state between its forward sweep and its backward: the step, the live carry,
    the inputs and outputs, and the checkpointer that holds the carries.

    The random generators' state is checkpointed with the carry where step 0 draws random
    numbers (or ``with_rng``), so that every recomputation draws what the first run drew; a
    later step that draws while the carry holds none raises :class:`LateDraw` in the forward
    sweep (:func:`checkpoint_scan` then runs again with it)."""

    def __init__(self, step: Callable[..., Any], carry_spec: Any, carry: Sequence[torch.Tensor],
                 xs_spec: Any, xs: Sequence[torch.Tensor], n: int,
                 params: Sequence[torch.Tensor] | None, segments: int | None,
                 options: dict[str, Any], *, preserve_rng_state: bool = True,
                 with_rng: bool = False) -> None:
        self.step, self.carry_spec, self.xs_spec, self.n = step, carry_spec, xs_spec, n
        self.carry_tree, self.xs_tree = Tree(carry_spec), Tree(xs_spec)
        self.y_tree: Tree | None = None
        self.ys: list[torch.Tensor] | None = None
        self.y_spec: Any = UNSET
        self.xs = list(xs)
        self.xs_data = [x.detach() for x in self.xs]  # indexed per step without a graph
        self.shapes = [(t.shape, t.dtype, t.device) for t in carry]
        self.preserve_rng_state = preserve_rng_state
        self.autocast = Autocast()
        self.generators = Generators([*carry, *xs, *(params or ())])
        #: the modules the forward sweep calls, and their buffers before it
        self.forward_buffers = Buffers()
        self.named: list[tuple[str, torch.Tensor]] = []  # parameters by name, for errors
        self.touched = Buffers()  # the modules the backward calls
        graph, self.params, drew = self.probe(carry, params)
        self.step_graph_bytes = graph
        self.param_ids = {id(p) for p in self.params if p.grad_fn is None}
        self.param_stops = {p.grad_fn for p in self.params if p.grad_fn is not None}
        rng = preserve_rng_state and (drew or with_rng)
        self.live = Live(carry, self.generators.nbytes if rng else 0)
        if self.live.extra is not None:
            self.live.extra.copy_(self.generators.get())
        self.recording = True
        self.reached = 0  # the segments the forward sweep has run
        self.adjoint: list[torch.Tensor | None] = []
        self.grad_ys: list[torch.Tensor | None] = []
        self.grad_xs: list[torch.Tensor | None] = []
        self.grad_params: list[torch.Tensor | None] = []
        self.carry_needs_grad: list[bool] = []
        itemsize = torch.empty((), dtype=self.live.dtype).element_size()
        most, options = graph_share(self.live.size * itemsize, options, SCAN_CHECKPOINTS_SHARE)
        # a step's graph, measured on step 0, where the budget bounds a segment's
        graph = 1 if most is None or segments is not None else max(graph, 1)
        self.starts = segment_starts([graph] * n, segments, most)
        self.checkpointer = AsyncCheckpointer(
            self.live, ForwardOperator(self), ReverseOperator(self), len(self.starts) - 1,
            taping=False, **in_segments(options, len(self.starts) - 1))

    name = "checkpoint_scan"

    def forward_outputs(self, inputs: Sequence[torch.Tensor]) -> tuple[torch.Tensor, ...]:
        """After the forward sweep: the final carry and the stacked outputs."""
        self.recording = False
        self.forward_buffers.check(self.name)
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
        # the caller's generators and the modules' buffers as the forward sweep left them
        with self.generators.fork(), Buffers() as self.touched:
            try:
                self.checkpointer.apply_reverse()
            finally:
                self.touched.restore()
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

    def probe(self, carry: Sequence[torch.Tensor], params: Sequence[torch.Tensor] | None
              ) -> tuple[int, list[torch.Tensor], bool]:
        """Step 0 run once more under enable_grad, from u_0, its graph let go and nothing it
        changes kept (generators, buffers): the bytes its graph keeps for the backward (the
        tensors autograd saves, each storage once; not the carry, ``xs`` or the parameters),
        the tensors that need a gradient it reaches (``params``, or those autograd finds in
        its graph), and whether it draws random numbers.

        Raises
        ------
        UnlistedLeafError
            ``params`` is given and step 0 reaches another tensor that needs a gradient.
        InvalidValueError
            A module step 0 calls changes a buffer its outputs may read.
        """
        inputs = [leaf.detach().requires_grad_(leaf.is_floating_point()) for leaf in carry]
        x = self.x(0, grad=True)
        x_leaves = (self.xs_tree.leaves(x) or pytree.tree_leaves(x)) if x is not None else []
        saved: dict[int, int] = {}

        def pack(tensor: torch.Tensor) -> torch.Tensor:
            storage = tensor.untyped_storage()
            saved.setdefault(storage.data_ptr(), storage.nbytes())
            return tensor

        known = {id(t) for t in [*inputs, *x_leaves, *(params or ())] if t.grad_fn is None}
        stops = {p.grad_fn for p in params or () if p.grad_fn is not None}
        with self.generators.fork(), Buffers() as touched:
            try:
                before = self.generators.get()
                with self.autocast(), torch.enable_grad(), \
                        torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
                    new, y = self.call(0, self.carry_tree.unflatten(inputs), x)
                drew = not torch.equal(before, self.generators.get())
                touched.check(f"{self.name}: step 0")
                found = reached_leaves([t for t in [*new, *y] if t.requires_grad], known, stops)
            finally:
                touched.restore()
        self.named = list(touched.named())
        if params is None:
            params = found
        elif found:
            raise UnlistedLeafError(
                f"{self.name}: step 0 reaches {describe_leaf(found[0], self.named)}, which "
                f"requires grad and is not in params= ({len(params)} tensors); add it, or leave "
                "params=None to differentiate every tensor autograd finds")
        held = {t.untyped_storage().data_ptr() for t in [*carry, *self.xs_data, *params]}
        return sum(b for ptr, b in saved.items() if ptr not in held), list(params), drew

    def graph_bytes(self) -> int:
        """The bytes step 0's graph keeps for its backward, as :meth:`probe` measured them."""
        return self.step_graph_bytes

    def advance(self, start: int, end: int) -> None:
        if self.recording and start < self.reached < end:
            self.advance(start, self.reached)
            self.advance(self.reached, end)
            return
        # the forward sweep may run segments again (it split a call): their modules' buffers
        # are put back after, as the backward's recomputations are
        again = self.recording and start < self.reached
        self.reached = max(self.reached, end)
        live = carry = self.live.tensors
        generators, rng = self.generators, self.live.extra
        # the generators are part of the state: a segment draws from its first carry's
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
        if rng is not None:
            rng.copy_(generators.get())
        elif self.recording and self.preserve_rng_state \
                and not torch.equal(before, generators.get()):
            raise LateDraw(f"steps {self.starts[start]} to {self.starts[end] - 1}")

    def reverse(self, s: int) -> None:
        """Segment s's steps again under enable_grad from its first carry (live), and one
        backward through them into the carry's, ``xs``'s and the parameters' adjoints."""
        begin, end = self.starts[s], self.starts[s + 1]
        if self.live.extra is not None:
            self.generators.set(self.live.extra)
        with self.autocast(), torch.enable_grad():
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
            # what autograd reaches that nobody differentiates would lose its gradient
            known = {id(t) for t in [*inputs, *(leaf for xl in x_leaves for leaf in xl)]}
            unlisted = reached_leaves(outputs, known | self.param_ids, self.param_stops)
            if unlisted:
                raise UnlistedLeafError(
                    f"{self.name}: steps {begin} to {end - 1} reach "
                    f"{describe_leaf(unlisted[0], [*self.named, *self.touched.named()])}, which "
                    "requires grad and is not "
                    f"differentiated (the {len(self.params)} tensors differentiated were found "
                    "on step 0): pass every tensor the steps reach in params=")
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
                    if self.n > 1:  # autograd sums n selects' zeros in: -0.0 becomes 0.0
                        target[t].add_(grad)
                    else:
                        target[t] = grad
        for k, grad in enumerate(got[nc + (end - begin) * nx:]):
            if grad is not None:
                self.grad_params[k] = grad


def checkpoint_scan(step: Callable[[Any, Any], tuple[Any, Any]], carry: Any, xs: Any = None, *,
                    n_steps: int | None = None, params: Sequence[torch.Tensor] | None = None,
                    segments: int | None = None, memory_budget: int | str | None = None,
                    storage: Any = None, interval: int | str = "auto",
                    preserve_rng_state: bool = True, **options: Any) -> tuple[Any, Any]:
    """Scan ``step`` over ``xs`` (or ``n_steps`` times), reversed by asyncckpt in bounded memory.

    Parameters
    ----------
    step : callable
        ``step(carry, x_t) -> (carry_next, y_t)``; ``carry_next`` of the same structure, shapes,
        dtypes and devices as ``carry``; ``y_t`` a tensor, a pytree of them, or None. It must
        compute the same values when run again from the same carry, random generators and
        buffers (deterministic kernels) and leave its inputs unmodified. It may draw random
        numbers (dropout, noise) and call modules that update running statistics (BatchNorm
        in training mode): see docs/torch.md for what a recomputation restores.
    carry : tensor or pytree of tensors
        The initial carry.
    xs : tensor or pytree of tensors, optional
        Scanned along their first dimension (all of length n); None with ``n_steps``.
    n_steps : int, optional
        n, where ``xs`` is None (``x_t`` is then None).
    params : sequence of tensors, optional
        The tensors to differentiate beside ``carry`` and ``xs``; default: every tensor that
        needs a gradient autograd reaches in step 0's graph (step 0 run once more). A step
        that reaches another one raises UnlistedLeafError naming it, at step 0 or in the
        backward.
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
    preserve_rng_state : bool
        Checkpoint the random generators' state (the CPU's and those of the CUDA devices of
        ``carry``, ``xs`` and ``params``) with each carry where the steps draw random numbers,
        so that a recomputed step draws what it drew first (``torch.utils.checkpoint``'s
        option); the caller's generators end where plain autograd leaves them. False: a step
        that draws recomputes with other numbers.

    Returns
    -------
    (final carry, stacked outputs)
        The outputs with a leading dimension n (None where ``step`` returns None).

    Raises
    ------
    InvalidTypeError, InvalidValueError
        A leaf that is not a tensor, ``xs`` of different lengths, a step whose carry changes
        structure, shape, dtype or device (naming the step); a module whose forward changes
        a buffer its outputs may read (naming it); UnlistedLeafError, a tensor that needs a
        gradient which the steps reach and ``params`` leaves out.
    """
    carry_leaves, carry_spec = leaves(carry, "carry")
    if not carry_leaves:
        raise InvalidValueError("carry must hold at least one tensor")
    xs_leaves, xs_spec = leaves(xs, "xs") if xs is not None else ([], None)
    n = scan_length([tuple(x.shape) for x in xs_leaves], n_steps, "n_steps")
    if params is not None:
        params = list(params)
        for k, p in enumerate(params):
            if not isinstance(p, torch.Tensor):
                raise InvalidTypeError(f"params[{k}] is a {type(p).__name__}, expected a tensor")
    if not isinstance(preserve_rng_state, bool):
        raise InvalidTypeError(f"preserve_rng_state must be a bool, got {preserve_rng_state!r}")
    if memory_budget is not None:
        options["memory_budget"] = memory_budget
    options = {"storage": storage, "interval": interval, **options}
    try:
        scan = ScanRun(step, carry_spec, carry_leaves, xs_spec, xs_leaves, n, params, segments,
                       dict(options), preserve_rng_state=preserve_rng_state)
        initial = scan.generators.get()
        outputs = Checkpointed.apply(scan, *carry_leaves, *xs_leaves, *scan.params)
    except LateDraw:
        # a step after step 0 drew: again from the start, the generators in the carry
        scan.generators.set(initial)
        scan.forward_buffers.restore()
        scan = ScanRun(step, carry_spec, carry_leaves, xs_spec, xs_leaves, n, params, segments,
                       dict(options), preserve_rng_state=preserve_rng_state, with_rng=True)
        outputs = Checkpointed.apply(scan, *carry_leaves, *xs_leaves, *scan.params)
    if not any(out.requires_grad for out in outputs):
        scan.checkpointer.close()  # no backward will come (no_grad, or nothing to differentiate)
        record_stats(scan.checkpointer.stats)
    nc = len(carry_leaves)
    final = pytree.tree_unflatten(list(outputs[:nc]), carry_spec)
    ys = pytree.tree_unflatten(list(outputs[nc:]), scan.y_spec) \
        if scan.y_spec not in (None, UNSET) else None
    return final, ys
