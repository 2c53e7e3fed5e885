"""One forward+backward pass of the LSTM by each method, all with bit-identical gradients."""
from __future__ import annotations

import argparse
import os
from collections.abc import Callable
from typing import Any

from .model import (LSTM, ForwardOperator, ReverseOperator, StepCheckpoint, StepForwardOperator,
                    StepReverseOperator)

__all__ = ["JAX", "METHODS", "ON_DEVICE", "TORCH", "describe", "jax_available",
           "parse_interval", "run_method", "torch_available"]

#: the host memory budget of ``async-budget``, whatever n
BUDGET = "4MiB"

#: method name -> what it is
METHODS = {
    "backprop": "standard backpropagation, every activation stored",
    "store-all": "pyrevolve Revolver with n - 1 slots (store-all under the checkpointing protocol)",
    "revolve": "pyrevolve Revolver (Revolve) with s Level-1 slots",
    "revolve-budget": f"pyrevolve Revolver with as many slots as memory_budget={BUDGET!r} holds "
                      "(async-budget's bytes: the two at equal memory)",
    "async-dram": "asyncckpt, Level-2 in host DRAM",
    "async-tmpfs": "asyncckpt, Level-2 on tmpfs (/dev/shm)",
    "async-disk": "asyncckpt, Level-2 on the disk",
    "async-taping-free": "asyncckpt taping-free, Level-2 in host DRAM; the checkpoint holds the "
                         "activations the reverse step reads",
    "async-budget": f"asyncckpt within memory_budget={BUDGET!r}: Level-1 and DRAM Level-2 share "
                    "it, the rest spills to the disk",
    "torch-backprop": "the same LSTM in PyTorch, autograd through the whole sequence (the torch "
                      "methods' reference: torch rounds differently from numpy)",
    "torch-checkpoint": "PyTorch, torch.utils.checkpoint around every step (every step's carry "
                        "kept, each step run again in the backward)",
    "torch-scan": f"PyTorch, asyncckpt.torch.checkpoint_scan within memory_budget={BUDGET!r}",
    "jax-scan": "the same LSTM in JAX, jax.grad of jax.lax.scan (every step's residuals kept; "
                "the JAX methods' reference)",
    "jax-checkpoint-scan": f"JAX, asyncckpt.jax.checkpoint_scan within memory_budget={BUDGET!r}",
}

#: the methods that run the LSTM in PyTorch (the ``torch`` extra)
TORCH = tuple(m for m in METHODS if m.startswith("torch-"))
#: ... in JAX (the ``jax`` extra)
JAX = tuple(m for m in METHODS if m.startswith("jax-"))


def parse_interval(text: str) -> int | str:
    """The ``--interval`` option: a positive int, "auto" or "adaptive" (asyncckpt's own
    parser)."""
    from asyncckpt.planning import parse_interval as parse

    try:
        return parse(text, name="--interval", adaptive=True)
    except ValueError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None


def describe(method: str) -> str:
    if method not in METHODS:
        raise ValueError(f"unknown method {method!r}; expected one of {', '.join(METHODS)}")
    return METHODS[method]


def _backprop(model: LSTM, **_: Any) -> dict[str, Any]:
    saved = []
    for t in range(model.n_steps):
        model.step(t)
        saved.append(model.save_activations())
    for t in range(model.n_steps - 1, -1, -1):
        model.restore_activations(saved[t], t)
        model.adjoint(t)
    return {}


def _pyrevolve(model: LSTM, slots: int) -> dict[str, Any]:
    import pyrevolve

    revolver = pyrevolve.Revolver(model, ForwardOperator(model), ReverseOperator(model),
                                  slots, model.n_steps)
    revolver.apply_forward()
    revolver.apply_reverse()
    return {}


def _revolve(model: LSTM, slots: int, **_: Any) -> dict[str, Any]:
    if model.n_steps == 1:
        return _backprop(model)
    return _pyrevolve(model, min(slots, model.n_steps - 1))


def _revolve_budget(model: LSTM, **_: Any) -> dict[str, Any]:
    from asyncckpt.planning import parse_bytes

    slots = max(1, parse_bytes("budget", BUDGET) // model.nbytes)
    return {**_revolve(model, slots), "slots": min(slots, max(model.n_steps - 1, 1))}


def _store_all(model: LSTM, **_: Any) -> dict[str, Any]:
    if model.n_steps == 1:
        return _backprop(model)
    return _pyrevolve(model, model.n_steps - 1)


def _asyncckpt(storage: Callable[[str], Any], taping: bool = True,
               budget: str | None = None) -> Callable[..., dict[str, Any]]:
    def run(model: LSTM, slots: int, interval: int | str, level2_dir: str, **_: Any) -> dict[str, Any]:
        from asyncckpt import AsyncCheckpointer

        if taping:
            operators: tuple[Any, Any, Any] = (model, ForwardOperator(model), ReverseOperator(model))
        else:
            model.step(0)  # u_0 of the taping-free checkpoint is step 0's scratch
            operators = (StepCheckpoint(model), StepForwardOperator(model), StepReverseOperator(model))
        with AsyncCheckpointer(*operators, model.n_steps, interval=interval,
                               l1_slots=None if budget else slots, memory_budget=budget,
                               storage=storage(level2_dir), taping=taping) as ckp:
            ckp.apply_forward()
            ckp.apply_reverse()
            stats = ckp.stats
            # in DRAM, what Level-2 occupies inside the process, its allocations included
            held = getattr(ckp.storage, "nbytes_held", stats.l2_peak_states * operators[0].nbytes)
        return {"interval": stats.interval, "l2_writes": stats.l2_writes,
                "level2_bytes": held, "device_bytes": stats.device_bytes,
                "write_stall_s": stats.write_stall_s, "read_stall_s": stats.read_stall_s,
                "l1_bytes": stats.l1_bytes}
    return run


def _torch(kind: str) -> Callable[..., dict[str, Any]]:
    def run(model: LSTM, **_: Any) -> dict[str, Any]:
        import torch
        from torch.utils.checkpoint import checkpoint

        from .torch_model import TorchLSTM

        net = TorchLSTM(model)
        carry, (inputs, targets) = net.initial_carry(), net.inputs()
        if kind == "scan":
            from asyncckpt.torch import checkpoint_scan

            _, losses = checkpoint_scan(net.step, carry, (inputs, targets),
                                        params=list(net.params.values()), memory_budget=BUDGET)
        else:
            steps = []
            for t in range(model.n_steps):
                x = (inputs[t], targets[t])
                if kind == "checkpoint":
                    carry, loss = checkpoint(net.step, carry, x, use_reentrant=False)
                else:
                    carry, loss = net.step(carry, x)
                steps.append(loss)
            losses = torch.stack(steps)
        losses.sum().backward()
        net.report(losses.detach())
        return {}
    return run


#: compiled gradients by (method, n, hidden, batch): a process's passes after its first reuse
#: them (the experiment reports the least time of its passes)
_COMPILED: dict[tuple[Any, ...], Any] = {}


def _jax(kind: str) -> Callable[..., dict[str, Any]]:
    def run(model: LSTM, **_: Any) -> dict[str, Any]:
        import jax
        import jax.numpy as jnp

        from .jax_model import JaxLSTM

        net = JaxLSTM(model)
        carry, xs = net.initial_carry(), net.inputs()

        def loss(params: dict[str, Any], scan: Any) -> Any:
            _, losses = scan(net.step(params), carry, xs)
            return jnp.sum(losses)

        def scan_of(which: str) -> Any:
            if which == "scan":
                return jax.lax.scan
            from asyncckpt.jax import checkpoint_scan

            return lambda step, carry, xs: checkpoint_scan(step, carry, xs,
                                                           memory_budget=BUDGET)

        key = (kind, model.n_steps, model.hidden, model.batch)
        if key not in _COMPILED:
            _COMPILED[key] = jax.jit(jax.value_and_grad(lambda p: loss(p, scan_of(kind))))
        value, grads = jax.block_until_ready(_COMPILED[key](net.params))
        # checkpoint_scan runs each step once more, in its segment's backward
        net.report(grads, value, model.n_steps * (1 if kind == "scan" else 2))
        return {}
    return run


RUNNERS: dict[str, Callable[..., dict[str, Any]]] = {
    "backprop": _backprop,
    "store-all": _store_all,
    "revolve": _revolve,
    "revolve-budget": _revolve_budget,
    "async-dram": _asyncckpt(lambda d: None),
    "async-tmpfs": _asyncckpt(lambda d: "/dev/shm"),
    "async-disk": _asyncckpt(lambda d: d),
    "async-taping-free": _asyncckpt(lambda d: None, taping=False),
    "async-budget": _asyncckpt(lambda d: ["dram", d], budget=BUDGET),
    "torch-backprop": _torch("backprop"),
    "torch-checkpoint": _torch("checkpoint"),
    "torch-scan": _torch("scan"),
    "jax-scan": _jax("scan"),
    "jax-checkpoint-scan": _jax("checkpoint-scan"),
}


#: methods that run with the model on a device (pyrevolve copies states with numpy; the torch
#: and JAX methods run on the host)
ON_DEVICE = tuple(m for m in METHODS if m not in ("store-all", "revolve", "revolve-budget")
                  + TORCH + JAX)


def torch_available() -> bool:
    """Whether PyTorch is installed (the ``torch`` extra), without importing it."""
    import importlib.util

    return importlib.util.find_spec("torch") is not None


def jax_available() -> bool:
    """Whether JAX is installed (the ``jax`` extra), without importing it."""
    import importlib.util

    return importlib.util.find_spec("jax") is not None


def run_method(method: str, model: LSTM, *, slots: int = 10, interval: int | str = 1,
               level2_dir: str | None = None) -> dict[str, Any]:
    """Run one forward+backward pass of ``model`` by ``method``; return what the method reports.

    ``level2_dir`` is the disk directory for ``async-disk`` (default: the current directory).
    """
    describe(method)
    if model.device != "cpu" and method not in ON_DEVICE:
        raise ValueError(f"{method} runs on the host only (pyrevolve copies states with "
                         f"numpy; the torch and JAX methods run on the host); on a device use "
                         f"one of {', '.join(ON_DEVICE)}")
    return RUNNERS[method](model, slots=slots, interval=interval,
                           level2_dir=level2_dir or os.getcwd())
