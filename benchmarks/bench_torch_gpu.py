"""PyTorch on a CUDA device: ``checkpoint_scan`` on an LSTM language model against plain
autograd, the forward sweep alone and torch's ``save_on_cpu``; one JSON line per n.

The model: an embedding, an ``nn.LSTMCell`` of ``--hidden`` units over ``--batch`` sequences and
a linear head; each step returns its cross-entropy, so the outputs are n scalars and the memory
is the method's own. Per n, in one process, the methods interleaved, medians of ``--repeats``:

- ``plain``: autograd keeps every step's graph in device memory (only for n <= ``--plain-max``);
- ``forward-no-grad``: the forward sweep without a graph; the floor of a checkpointed gradient is
  plain autograd plus this (each reverse step runs its step once more);
- ``checkpoint_scan``: ``memory_budget`` device bytes (the checkpoints in Level-1 slots and the
  staging buffers, and one segment's graph); Level-2 in pinned host memory (then a file);
- ``save_on_cpu``: plain autograd under ``torch.autograd.graph.save_on_cpu(pin_memory=True)``:
  every tensor autograd saves goes to pinned host memory as it is saved and comes back in the
  backward; the device holds the step's working set.

Memory per method: the device's peak (torch's peak allocated bytes over those before the
gradient, plus the bytes CuPy's memory pool holds after it, which is where asyncckpt keeps
Level-1; the pool is emptied before each run), the same less the parameters' gradients (the
result, which every method holds at the end) and the host's peak RSS growth (pinned memory
counts in RSS). ``scan_plan``: the segments, interval, Level-1 slots and device bytes of the
last ``checkpoint_scan``. The gradients of ``checkpoint_scan`` are compared bit for bit with plain
autograd's, under ``torch.use_deterministic_algorithms(True)``.

Usage: python benchmarks/bench_torch_gpu.py [--n 1000 10000] [--hidden 1024] [--batch 32]
       [--vocab 1000] [--budget 64MiB] [--repeats 3] [--plain-max 10000] [--device cuda]
``--device cpu`` runs the same code on the CPU (small sizes), which checks the benchmark, not
the hardware.
"""
from __future__ import annotations

import argparse
import gc
import json
import os
import statistics
import sys
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _results import add_flag, record  # noqa: E402

# cuBLAS picks a deterministic algorithm only with a fixed workspace, set before CUDA starts
os.environ.setdefault("CUBLAS_WORKSPACE_CONFIG", ":4096:8")

import psutil  # noqa: E402
import torch  # noqa: E402

from asyncckpt.torch import checkpoint_scan  # noqa: E402

METHODS = ("plain", "forward-no-grad", "checkpoint_scan", "save_on_cpu")
#: what the last ``checkpoint_scan`` ran: its segments and its checkpointer's plan and bytes
SCAN_PLAN: dict[str, Any] = {}


class LanguageModel:
    """An LSTM language model over n + 1 random tokens, its step in ``jax.lax.scan``'s form."""

    def __init__(self, n: int, hidden: int, batch: int, vocab: int, device: str) -> None:
        torch.manual_seed(0)
        self.cell = torch.nn.LSTMCell(hidden, hidden).to(device)
        self.embed = torch.nn.Embedding(vocab, hidden).to(device)
        self.head = torch.nn.Linear(hidden, vocab).to(device)
        tokens = torch.randint(0, vocab, (n + 1, batch), device=device)
        self.xs = (tokens[:-1], tokens[1:])
        self.params = [*self.cell.parameters(), *self.embed.parameters(),
                       *self.head.parameters()]
        self.carry_shape, self.device = (batch, hidden), device

    def step(self, carry: Any, x: Any) -> Any:
        tokens, targets = x
        h, c = self.cell(self.embed(tokens), carry)
        return (h, c), torch.nn.functional.cross_entropy(self.head(h), targets)

    def carry(self) -> tuple[torch.Tensor, torch.Tensor]:
        return (torch.zeros(self.carry_shape, device=self.device),
                torch.zeros(self.carry_shape, device=self.device))


def _plain_losses(model: LanguageModel) -> torch.Tensor:
    carry, losses = model.carry(), []
    for t in range(len(model.xs[0])):
        carry, loss = model.step(carry, (model.xs[0][t], model.xs[1][t]))
        losses.append(loss)
    return torch.stack(losses)


def _gradient(model: LanguageModel, method: str, budget: str) -> list[torch.Tensor]:
    """One gradient by ``method``; the parameters' gradients (empty for the forward alone)."""
    for p in model.params:
        p.grad = None
    if method == "forward-no-grad":
        with torch.no_grad():
            _plain_losses(model)
        return []
    if method == "checkpoint_scan":
        _, losses = checkpoint_scan(model.step, model.carry(), model.xs, params=model.params,
                                    memory_budget=budget)
        run = losses.grad_fn.run  # the ScanRun, on the autograd node's context
        losses.sum().backward()
        stats = run.checkpointer.stats
        SCAN_PLAN.update(segments=len(run.starts) - 1, interval=stats.interval,
                         l1_slots=stats.l1_slots, device_bytes=stats.device_bytes,
                         l2_writes=stats.l2_writes)
    elif method == "save_on_cpu":
        with torch.autograd.graph.save_on_cpu(pin_memory=True):
            losses = _plain_losses(model)
        losses.sum().backward()
    else:
        _plain_losses(model).sum().backward()
    return [p.grad.clone() for p in model.params]


def _synchronize(device: str) -> None:
    if device.startswith("cuda"):
        torch.cuda.synchronize()


def _cupy_pool() -> Any:
    try:
        import cupy
    except ImportError:
        return None
    return cupy.get_default_memory_pool()


def _peak_rss() -> int:
    """The process's peak RSS since it was last reset (Linux's VmHWM), in bytes."""
    with open("/proc/self/status") as status:
        line = next(line for line in status if line.startswith("VmHWM:"))
    return int(line.split()[1]) * 1024


def _measured(model: LanguageModel, method: str, budget: str) -> dict[str, Any]:
    """One gradient's seconds, device and host memory, and its gradients."""
    cuda = model.device.startswith("cuda")
    pool = _cupy_pool() if cuda else None
    gc.collect()  # an earlier run's cycles, freed mid-run, would lower the peak's base
    if pool is not None:
        pool.free_all_blocks()
    _synchronize(model.device)
    if cuda:
        torch.cuda.empty_cache()
        torch.cuda.reset_peak_memory_stats()
        before = torch.cuda.memory_allocated()
    rss = psutil.Process().memory_info().rss
    with open("/proc/self/clear_refs", "w") as clear:
        clear.write("5")  # the peak RSS from here
    start = time.perf_counter()
    grads = _gradient(model, method, budget)
    _synchronize(model.device)
    seconds = time.perf_counter() - start
    print(f"n {len(model.xs[0])}: {method} {seconds:.3f} s", file=sys.stderr, flush=True)
    out: dict[str, Any] = {"seconds": seconds, "grads": grads,
                           "host_growth_mib": max(0, _peak_rss() - rss) / 2**20}
    if cuda:
        torch_peak = torch.cuda.max_memory_allocated() - before
        cupy_held = pool.total_bytes() if pool is not None else 0
        result = sum(g.nbytes for g in grads)  # .grad: every method ends holding it
        out.update(device_torch_mib=torch_peak / 2**20, device_cupy_mib=cupy_held / 2**20,
                   device_mib=(torch_peak + cupy_held) / 2**20,
                   device_beyond_grads_mib=(torch_peak + cupy_held - result) / 2**20)
    return out


def _row(n: int, args: argparse.Namespace) -> dict[str, Any]:
    model = LanguageModel(n, args.hidden, args.batch, args.vocab, args.device)
    methods = [m for m in METHODS if n <= args.plain_max or m in ("forward-no-grad",
                                                                   "checkpoint_scan")]
    _gradient(LanguageModel(4, args.hidden, args.batch, args.vocab, args.device),
              "checkpoint_scan", args.budget)  # CuPy's kernels, torch's pools, imports
    runs: dict[str, list[dict[str, Any]]] = {m: [] for m in methods}
    bitwise = True
    for _ in range(args.repeats):
        for method in methods:
            runs[method].append(_measured(model, method, args.budget))
        if "plain" in runs:
            bitwise &= all(torch.equal(a, b) for a, b in zip(runs["checkpoint_scan"][-1]["grads"],
                                                              runs["plain"][-1]["grads"]))
    keys = ("seconds", "device_mib", "device_beyond_grads_mib", "device_torch_mib",
            "device_cupy_mib", "host_growth_mib")
    median = {m: {k: round(statistics.median(r[k] for r in rs), 3) for k in keys if k in rs[0]}
              for m, rs in runs.items()}
    row: dict[str, Any] = {
        "bench": "torch-gpu", "device": _device_name(args.device), "torch": torch.__version__,
        "n": n, "hidden": args.hidden, "batch": args.batch, "vocab": args.vocab,
        "carry_bytes": 2 * args.batch * args.hidden * 4, "budget": args.budget,
        "repeats": args.repeats, "scan_plan": dict(SCAN_PLAN), "median": median}
    seconds = {m: v["seconds"] for m, v in median.items()}
    if "plain" in seconds:
        floor = seconds["plain"] + seconds["forward-no-grad"]
        row.update(floor_s=round(floor, 3),
                   scan_over_floor=round(seconds["checkpoint_scan"] / floor, 3),
                   save_on_cpu_over_scan=round(seconds["save_on_cpu"]
                                               / seconds["checkpoint_scan"], 3),
                   bitwise_equal_to_plain=bitwise)
    return row


def _device_name(device: str) -> str:
    if not device.startswith("cuda"):
        return "cpu"
    pool = _cupy_pool()
    cupy = f", CuPy {__import__('cupy').__version__}" if pool is not None else ""
    return (f"{torch.cuda.get_device_name()}, CUDA {torch.version.cuda}, "
            f"driver {_driver()}{cupy}")


def _driver() -> str:
    try:
        import pynvml
        pynvml.nvmlInit()
        version = pynvml.nvmlSystemGetDriverVersion()
        return version.decode() if isinstance(version, bytes) else str(version)
    except Exception:  # nvidia-ml-py absent or no NVML: the driver unknown, the run goes on
        return "unknown"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--n", type=int, nargs="+", default=[1000, 10000])
    parser.add_argument("--hidden", type=int, default=1024)
    parser.add_argument("--batch", type=int, default=32)
    parser.add_argument("--vocab", type=int, default=1000)
    parser.add_argument("--budget", default="64MiB")
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--plain-max", type=int, default=10000)
    parser.add_argument("--device", default="cuda")
    add_flag(parser)
    args = parser.parse_args()
    torch.use_deterministic_algorithms(True)
    for n in args.n:
        row = _row(n, args)
        print(json.dumps(row), flush=True)
        record("bench_torch_gpu", row, ["device", "n", "hidden", "batch", "budget"], args=args)


if __name__ == "__main__":
    main()
