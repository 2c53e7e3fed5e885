"""``checkpoint_scan``: a scan whose backward runs asyncckpt."""
from __future__ import annotations

import itertools
from collections.abc import Callable, Sequence
from typing import Any

import torch
from torch.utils import _pytree as pytree

from ..checkpointer import AsyncCheckpointer
from ..errors import InvalidTypeError, InvalidValueError
from ..planning import scan_length

from .function import ForwardOperator, ReverseOperator, apply_checkpointed
from .preserve import LateDraw, describe_leaf, differentiable
from .recompute import SegmentedRun, backward_through
from .segments import SCAN_CHECKPOINTS_SHARE, graph_share, in_segments, segment_starts
from .steps import Step
from .trees import UNSET, Live, leaves

__all__ = ["ScanRun", "checkpoint_scan"]


class ScanRun(SegmentedRun):
    """One scan's state between its forward sweep and its backward: the step, the live carry,
    the inputs and outputs, and the checkpointer that holds the carries.

    The random generators' state is checkpointed with the carry where step 0 draws random
    numbers (or ``with_rng``), so that every recomputation draws what the first run drew; a
    later step that draws while the carry holds none raises :class:`LateDraw` in the forward
    sweep (:func:`checkpoint_scan` then runs again with it)."""

    name = "checkpoint_scan"
    unit = "steps"

    def __init__(self, step: Callable[..., Any], carry_spec: Any, carry: Sequence[torch.Tensor],
                 xs_spec: Any, xs: Sequence[torch.Tensor], n: int,
                 params: Sequence[torch.Tensor] | None, segments: int | None,
                 options: dict[str, Any], *, preserve_rng_state: bool = True,
                 with_rng: bool = False) -> None:
        self.step, self.n = Step(step, carry_spec, carry, xs_spec, xs), n
        self.xs = self.step.xs
        self.ys: list[torch.Tensor] | None = None
        super().__init__([*carry, *xs, *(params or ())], preserve_rng_state)
        # self.named: the parameters of the modules step 0 calls, by name, for errors
        graph, self.params, drew, self.named, outside = self.step.probe(
            carry, params, self.generators, self.autocast, self.name)
        self.step_graph_bytes = graph
        self.param_ids = {id(p) for p in self.params if p.grad_fn is None}
        self.param_stops = {p.grad_fn for p in self.params if p.grad_fn is not None}
        rng = preserve_rng_state and (drew or with_rng)
        self.live = Live(carry, self.generators.nbytes if rng else 0)
        self.rng = self.live.extra
        if self.rng is not None:
            self.rng.copy_(self.generators.get())
        self.adjoint: list[torch.Tensor | None] = []
        self.grad_ys: list[torch.Tensor | None] = []
        self.grad_xs: list[torch.Tensor | None] = []
        self.grad_params: list[torch.Tensor | None] = []
        self.carry_needs_grad: list[bool] = []
        itemsize = torch.empty((), dtype=self.live.dtype).element_size()
        # parameters' gradients: the new sum, a step's part (the sum so far is outside)
        most, options = graph_share(
            self.live.size * itemsize, options, SCAN_CHECKPOINTS_SHARE, name=self.name,
            graph=graph, gradients=2 * sum(p.nbytes for p in self.params)
            + 2 * sum(t.nbytes for t in self.live.tensors))
        # a step's graph, measured on step 0, where the budget bounds a segment's
        graph = 1 if most is None or segments is not None else max(graph, 1)
        self.starts = segment_starts([graph] * n, segments, most)
        if outside and len(self.starts) > 2:
            self.refuse_outside(*outside[0])
        self.checkpointer = AsyncCheckpointer(
            self.live, ForwardOperator(self), ReverseOperator(self), len(self.starts) - 1,
            taping=False, **in_segments(options, len(self.starts) - 1))

    def refuse_outside(self, node: Any, behind: Sequence[torch.Tensor]) -> None:
        """Raise InvalidValueError for a tensor computed outside the steps that needs a
        gradient (by ``node``, from the leaves ``behind`` it): each segment's backward would
        go through its graph, which autograd frees after the first."""
        leaf = f" from {describe_leaf(behind[0], self.named)}" if behind else ""
        raise InvalidValueError(
            f"{self.name}: step 0 reaches a tensor computed outside the steps that needs a "
            f"gradient (made by {node.name()}{leaf}), and each of the {len(self.starts) - 1} "
            "segments' backwards would go through the graph that made it: pass that tensor in "
            "params= with the other tensors the steps reach (it is differentiated as an "
            "input, its gradient flowing on through that graph once), or compute it in the step")

    def read_again(self) -> list[tuple[str | None, torch.Tensor]]:
        return [*((f"xs leaf {j}", x) for j, x in enumerate(self.xs)),
                *((None, p) for p in self.params)]

    def forward_outputs(self, inputs: Sequence[torch.Tensor]) -> tuple[torch.Tensor, ...]:
        """After the forward sweep: the final carry and the stacked outputs."""
        self.end_forward()
        nc = len(self.live.tensors)
        self.carry_needs_grad = [leaf.requires_grad and differentiable(leaf.dtype)
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
        self.reverse_sweep()
        carry_grads = [g if needs else None
                       for g, needs in zip(self.adjoint, self.carry_needs_grad)]
        grads_out = (*carry_grads, *self.grad_xs, *self.grad_params)
        # let go of them, so autograd can take them into .grad instead of copying them
        self.adjoint, self.grad_xs, self.grad_params = [], [], []
        return grads_out

    def graph_bytes(self) -> int:
        """The bytes step 0's graph keeps for its backward, as :meth:`Step.probe` measured
        them."""
        return self.step_graph_bytes

    def run_segments(self, start: int, end: int) -> None:
        # each step takes the one before's carry as it returned it; the live carry, which the
        # checkpointer reads, takes the segment's last
        live = carry = self.live.tensors
        step = self.step
        for t in range(self.starts[start], self.starts[end]):
            carry, y = step(t, step.carry_tree.unflatten(carry), step.x(t))
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
        with self.recomputing():
            # every floating or complex leaf: carries after u_0 depend on xs and the parameters
            inputs = [leaf.detach().requires_grad_(differentiable(leaf.dtype))
                      for leaf in self.live.tensors]
            carry, outputs, x_leaves = inputs, [], []
            seeds: list[torch.Tensor | None] = []
            step = self.step
            for t in range(begin, end):
                x = step.x(t, grad=True)
                x_leaves.append(step.x_leaves(x))
                carry, y = step(t, step.carry_tree.unflatten(carry), x)
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
            self.check_reached(
                s, outputs, known | self.param_ids, self.param_stops,
                itertools.chain(self.named, self.touched.named()),
                f"is not differentiated (the {len(self.params)} tensors differentiated were "
                "found on step 0): pass every tensor the steps reach in params=")
            wrt = [*inputs, *(leaf for leaves in x_leaves for leaf in leaves), *self.params]
            wanted = [leaf for leaf in wrt if leaf.requires_grad]
            found = iter(backward_through(
                outputs, seeds, wanted,
                ((p, total) for p, total in zip(self.params, self.grad_params) if p.requires_grad)))
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
        backward. A tensor computed outside the steps (``W = A @ B``) goes here itself.
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
        gradient which the steps reach and ``params`` leaves out. UsageError, in the backward:
        ``xs`` or a parameter modified in place since the forward, a second derivative.
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
        outputs = apply_checkpointed(scan, *carry_leaves, *xs_leaves, *scan.params)
    except LateDraw:
        # a step after step 0 drew: again from the start, the generators in the carry
        scan.generators.set(initial)
        scan.forward_buffers.restore()
        scan = ScanRun(step, carry_spec, carry_leaves, xs_spec, xs_leaves, n, params, segments,
                       dict(options), preserve_rng_state=preserve_rng_state, with_rng=True)
        outputs = apply_checkpointed(scan, *carry_leaves, *xs_leaves, *scan.params)
    nc = len(carry_leaves)
    final = pytree.tree_unflatten(list(outputs[:nc]), carry_spec)
    ys = pytree.tree_unflatten(list(outputs[nc:]), scan.step.y_spec) \
        if scan.step.y_spec not in (None, UNSET) else None
    return final, ys
