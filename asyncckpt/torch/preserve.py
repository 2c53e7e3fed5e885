"""What a recomputed step must see as its first run saw it, and what autograd says it reaches.

A recomputation is exact when it runs from the same state as the first run: the carry (which
asyncckpt checkpoints), the random generators (:class:`Generators`, checkpointed beside the
carry where the steps draw), the buffers modules change (:class:`Buffers`: only those whose
outputs do not read them, BatchNorm's running statistics in training mode, and those are put
back after recomputing), and autocast (:class:`Autocast`). The tensors that need a gradient
are found in the graph autograd builds (:func:`reached_leaves`), never in closures.
"""
from __future__ import annotations

import contextlib
import threading
from collections.abc import Iterable, Iterator, Sequence, Set
from typing import Any

import torch

from ..errors import InvalidValueError

__all__ = ["Autocast", "Buffers", "Generators", "LateDraw", "UnlistedLeafError",
           "describe_leaf", "differentiable", "outside_nodes", "reached_leaves"]


def differentiable(dtype: torch.dtype) -> bool:
    """Whether tensors of ``dtype`` carry gradients (floating and complex, as autograd says)."""
    return dtype.is_floating_point or dtype.is_complex


class LateDraw(Exception):
    """Raised inside the forward sweep of a run whose carry holds no generator state when a
    segment draws random numbers: the entry point runs again with the state in the carry."""


class UnlistedLeafError(InvalidValueError):
    """A step reaches a tensor that needs a gradient and is not among those differentiated."""


class Generators:
    """The CPU random generator and those of the CUDA devices a run touches, read and set as
    one uint8 tensor (5,056 bytes for the CPU's Mersenne Twister, 16 a CUDA device).

    Parameters
    ----------
    tensors
        The run's tensors: the CUDA devices they live on are the ones whose generators count
        (as ``torch.utils.checkpoint`` infers them from its inputs).
    """

    def __init__(self, tensors: Iterable[torch.Tensor]) -> None:
        self.devices = sorted({t.device.index if t.device.index is not None
                               else torch.cuda.current_device()
                               for t in tensors if t.device.type == "cuda"})
        self.cpu_bytes = torch.get_rng_state().numel()
        self.nbytes = self.get().numel()

    def get(self) -> torch.Tensor:
        """The generators' state now (a new CPU tensor)."""
        cpu = torch.get_rng_state()
        if not self.devices:
            return cpu
        return torch.cat([cpu, *(torch.cuda.get_rng_state(d) for d in self.devices)])

    def set(self, state: torch.Tensor) -> None:
        """Put the generators where ``state`` (from :meth:`get`, on any device) says."""
        # a copy of its own: the CPU generator reads a state from its storage's first byte
        state = state.to("cpu", copy=True)
        cpu = self.cpu_bytes
        torch.set_rng_state(state[:cpu])
        for k, device in enumerate(self.devices):
            part = state[cpu + 16 * k:cpu + 16 * (k + 1)].clone()
            torch.cuda.set_rng_state(part, device)

    @contextlib.contextmanager
    def fork(self) -> Iterator[None]:
        """The generators as they were on entry, again on exit: what runs inside draws from
        them without moving the caller's."""
        saved = self.get()
        try:
            yield
        finally:
            self.set(saved)


class Autocast:
    """Autocast as it is where a run is called (CPU and CUDA), re-entered around each
    recomputation: a backward called outside (or inside another) autocast region recomputes
    in the forward's precision."""

    def __init__(self) -> None:
        kinds = ["cpu"] + (["cuda"] if torch.cuda.is_available() else [])
        self.settings = [(kind, torch.is_autocast_enabled(kind), torch.get_autocast_dtype(kind))
                         for kind in kinds]
        self.cache = torch.is_autocast_cache_enabled()

    @contextlib.contextmanager
    def __call__(self) -> Iterator[None]:
        with contextlib.ExitStack() as stack:
            for kind, enabled, dtype in self.settings:
                stack.enter_context(torch.autocast(kind, dtype=dtype, enabled=enabled,
                                                   cache_enabled=self.cache))
            yield


#: modules whose outputs in training mode do not read the buffers their forward changes
#: (running statistics): a recomputation may run them with the statistics as they are
STATISTICS = (torch.nn.modules.batchnorm._NormBase,)


class Buffers:
    """While entered, the modules this thread calls, their training mode and their own buffers
    as they were when each was first called (a global forward pre-hook; modules of other
    threads are not seen).

    :meth:`restore` puts those values back; :meth:`check` refuses a module whose forward changed
    a buffer its outputs may read; :meth:`modes` runs code with the modes recorded.
    """

    def __init__(self) -> None:
        self.modules: dict[int, tuple[torch.nn.Module, dict[str, torch.Tensor]]] = {}
        self.training: dict[int, bool] = {}
        self._thread = threading.get_ident()
        self._handle: Any = None

    def _seen(self, module: torch.nn.Module, args: Any) -> None:
        if id(module) not in self.modules and threading.get_ident() == self._thread:
            self.training[id(module)] = module.training
            self.modules[id(module)] = (module, {
                name: buffer.detach().clone()
                for name, buffer in module.named_buffers(recurse=False) if buffer is not None})

    def __enter__(self) -> Buffers:
        self._thread = threading.get_ident()
        self._handle = torch.nn.modules.module.register_module_forward_pre_hook(self._seen)
        return self

    def __exit__(self, *exc: object) -> None:
        self._handle.remove()

    def changed(self) -> list[tuple[torch.nn.Module, str]]:
        """(module, buffer name) of each buffer whose value differs from its first call's."""
        found = []
        for module, saved in self.modules.values():
            buffers = dict(module.named_buffers(recurse=False))
            for name, before in saved.items():
                now = buffers.get(name)
                if now is not None and (now.shape != before.shape or not torch.equal(now, before)):
                    found.append((module, name))
        return found

    def check(self, where: str) -> None:
        """Raise InvalidValueError naming a module that changed a buffer and may read it."""
        for module, name in self.changed():
            if not (isinstance(module, STATISTICS) and module.training):
                raise InvalidValueError(
                    f"{where}: module {type(module).__name__} ({module!r:.60}) changed its buffer "
                    f"{name!r} in the forward sweep; recomputing it would change it again and its "
                    "outputs may read it, so it cannot be recomputed exactly (keep it out of the "
                    "checkpointed steps, or make its forward leave its buffers as they are; "
                    "BatchNorm's running statistics in training mode are kept)")

    def restore(self) -> None:
        """Each buffer seen, back to its value at its module's first call."""
        with torch.no_grad():
            for module, saved in self.modules.values():
                buffers = dict(module.named_buffers(recurse=False))
                for name, before in saved.items():
                    now = buffers.get(name)
                    if now is not None and now.shape == before.shape:
                        now.copy_(before)

    @contextlib.contextmanager
    def modes(self) -> Iterator[None]:
        """Each module seen in the training mode of its first call (dropout, BatchNorm's
        statistics), whatever the caller switched since; the caller's modes again on exit."""
        now = [(module, module.training) for module, _ in self.modules.values()]
        try:
            for key, (module, _) in self.modules.items():
                module.training = self.training[key]
            yield
        finally:
            for module, training in now:
                module.training = training

    def named(self) -> Iterator[tuple[str, torch.Tensor]]:
        """``Class.name`` and each parameter of the modules seen."""
        for module, _ in self.modules.values():
            for name, parameter in module.named_parameters(recurse=False):
                yield f"{type(module).__name__}.{name}", parameter


def reached_leaves(roots: Sequence[torch.Tensor], known: set[int],
                   stops: Set[Any] = frozenset()) -> list[torch.Tensor]:
    """The leaf tensors that need a gradient which autograd reaches from ``roots``, other than
    those whose ids are in ``known``, in the order first reached: the ``.variable`` of each
    AccumulateGrad node of their graph; the walk stops at those and at the nodes in ``stops``
    (the ``grad_fn`` of tensors computed outside, differentiated as they are)."""
    return _walk([r.grad_fn for r in roots if r.grad_fn is not None], known, stops)


def _walk(stack: list[Any], known: set[int], stops: Set[Any]) -> list[torch.Tensor]:
    seen: set[Any] = set()
    found: list[torch.Tensor] = []
    while stack:
        node = stack.pop()
        if node in seen or node in stops:
            continue
        seen.add(node)
        variable = getattr(node, "variable", None)
        if variable is not None:
            if id(variable) not in known:
                found.append(variable)
            continue
        for successor, _ in node.next_functions:
            if successor is not None and successor not in seen:
                stack.append(successor)
    return found


def outside_nodes(roots: Sequence[torch.Tensor], first: int, stops: Set[Any]
                  ) -> list[tuple[Any, list[torch.Tensor]]]:
    """The nodes of ``roots``' graph made before node number ``first`` (a tensor computed
    outside the code that made ``roots``, in this thread: ``W = A @ B`` before a scan), other
    than ``stops``, each with the leaves needing a gradient behind it."""
    stack = [r.grad_fn for r in roots if r.grad_fn is not None]
    seen: set[Any] = set()
    found = []
    while stack:
        node = stack.pop()
        if node in seen or node in stops or getattr(node, "variable", None) is not None:
            continue
        seen.add(node)
        if node._sequence_nr() < first:
            found.append((node, _walk([node], set(), frozenset())))
            continue
        stack.extend(successor for successor, _ in node.next_functions if successor is not None)
    return found


def describe_leaf(leaf: torch.Tensor, named: Iterable[tuple[str, torch.Tensor]]) -> str:
    """``leaf`` as an error names it: a module's parameter by its class and name, else by
    shape and dtype."""
    where = next((name for name, parameter in named if parameter is leaf), None)
    what = f"a tensor of shape {tuple(leaf.shape)}, {leaf.dtype}"
    return f"{where} ({what})" if where else what
