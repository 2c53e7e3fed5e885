"""PyTorch: ``asyncckpt.torch.checkpoint_scan`` against plain autograd and
``torch.utils.checkpoint`` per step on an LSTM language model, one JSON line per n.

The model: an embedding, an ``nn.LSTMCell`` and a linear head; each step returns its
cross-entropy, so the outputs are n scalars and memory is the method's own. Per n:

- **time** (n <= ``--plain-max``), interleaved in one process, medians of ``--repeats``: plain
  autograd (every step's graph kept), the forward sweep alone without a graph, and
  ``checkpoint_scan``; its floor is plain autograd plus one more forward sweep (each reverse step
  re-runs its step to build its graph, as ``torch.utils.checkpoint`` does); ``torch.utils.
  checkpoint`` per step beside them, over sqrt(n) chunks of steps (torch's advice for a
  sequence: its memory is sqrt(n) carries and one chunk's graph), and nested in as few levels
  of chunks as fit ``--budget`` (``torch-checkpoint-budget``: torch at equal memory, in its
  reentrant form, since the other keeps every step's autograd nodes; each level runs every
  step once more; the line gives its chunk lengths and the bytes they hold).
- **memory**, each method in its own process: peak RSS during the gradient (Linux's VmHWM,
  reset just before it) and its growth over the RSS just before it. ``checkpoint_scan`` holds carries within ``--budget`` bytes
  (Level-1 and DRAM Level-2), the rest in the temporary directory.

Gradients of ``checkpoint_scan`` are compared bit for bit with plain autograd's where it runs.

With ``--sequential DEPTH``, instead: ``checkpoint_sequential`` on an MLP of 2 x DEPTH layers
(widths alternating 256 and 1024, ``--batch`` rows) against plain autograd and torch's own
``checkpoint_sequential`` with sqrt(layers) segments: time and peak RSS growth of each.

Usage: python benchmarks/bench_torch.py [--n 1000 10000 100000] [--plain-max 10000]
       [--repeats 3] [--budget 1MiB] [--batch 4] [--hidden 32] [--sequential DEPTH]
"""
from __future__ import annotations

import argparse
import json
import math
import statistics
import subprocess
import sys
import time
import warnings
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _results import add_flag, record  # noqa: E402

VOCAB = 50
BATCH, HIDDEN = 4, 32  # set from --batch and --hidden


def _configure(batch: int, hidden: int) -> None:
    global BATCH, HIDDEN
    BATCH, HIDDEN = batch, hidden


def _model(n: int) -> tuple[Any, ...]:
    import torch

    torch.manual_seed(0)
    cell = torch.nn.LSTMCell(HIDDEN, HIDDEN)
    embed, head = torch.nn.Embedding(VOCAB, HIDDEN), torch.nn.Linear(HIDDEN, VOCAB)
    tokens = torch.randint(0, VOCAB, (n + 1, BATCH))
    params = [*cell.parameters(), *embed.parameters(), *head.parameters()]

    def step(carry: Any, x: Any) -> Any:
        tokens_t, targets_t = x
        h, c = cell(embed(tokens_t), carry)
        return (h, c), torch.nn.functional.cross_entropy(head(h), targets_t)

    return step, (tokens[:-1], tokens[1:]), params


def _run(method: str, n: int, budget: str) -> tuple[float, list[Any]]:
    """One gradient; its seconds and the parameters' gradients."""
    import torch
    import torch.utils.checkpoint as torch_checkpoint

    from asyncckpt.planning import parse_bytes
    from asyncckpt.torch import checkpoint_scan

    step, xs, params = _model(n)
    for p in params:
        p.grad = None
    carry = (torch.zeros(BATCH, HIDDEN), torch.zeros(BATCH, HIDDEN))
    start = time.perf_counter()
    if method == "forward-no-grad":
        with torch.no_grad():
            for t in range(n):
                carry, _ = step(carry, (xs[0][t], xs[1][t]))
        return time.perf_counter() - start, []
    if method == "checkpoint_scan":
        _, losses = checkpoint_scan(step, carry, xs, memory_budget=budget)
        losses.sum().backward()
    elif method == "torch-checkpoint-chunks":  # sqrt(n) chunks of steps, torch's advice
        chunk = math.isqrt(n - 1) + 1

        def steps(begin: int, carry: Any) -> tuple[Any, Any]:
            losses = []
            for t in range(begin, min(begin + chunk, n)):
                carry, loss = step(carry, (xs[0][t], xs[1][t]))
                losses.append(loss)
            return carry, torch.stack(losses)

        parts = []
        for begin in range(0, n, chunk):
            carry, part = torch_checkpoint.checkpoint(steps, begin, carry, use_reentrant=False)
            parts.append(part)
        torch.cat(parts).sum().backward()
    elif method == "torch-checkpoint-budget":  # nested chunks that fit the budget
        lengths = _nested_chunks(n, parse_bytes("budget", budget), _carry_bytes(),
                                 _graph_bytes(step, carry, (xs[0][0], xs[1][0]), params))

        # Reentrant: the non-reentrant form keeps every step's autograd nodes (without their
        # saved tensors) until the backward, some 30 KiB a step here, so no chunking holds a
        # budget. The reentrant form runs under no_grad and needs an input that requires grad.
        def levels(begin: int, end: int, h: Any, c: Any, *lengths: int) -> tuple[Any, ...]:
            losses = []
            if not lengths:
                for t in range(begin, end):
                    (h, c), loss = step((h, c), (xs[0][t], xs[1][t]))
                    losses.append(loss)
                return h, c, torch.stack(losses)
            for chunk in range(begin, end, lengths[0]):
                h, c, part = torch_checkpoint.checkpoint(
                    levels, chunk, min(chunk + lengths[0], end), h, c, *lengths[1:],
                    use_reentrant=True)
                losses.append(part)
            return h, c, torch.cat(losses)

        with warnings.catch_warnings():  # an inner level run in its outer one's no_grad
            warnings.filterwarnings("ignore", "None of the inputs have requires_grad")
            levels(0, n, *(leaf.requires_grad_() for leaf in carry), *lengths)[2].sum().backward()
    else:
        losses = []
        for t in range(n):
            x = (xs[0][t], xs[1][t])
            if method == "torch-checkpoint":
                carry, loss = torch_checkpoint.checkpoint(step, carry, x, use_reentrant=False)
            else:
                carry, loss = step(carry, x)
            losses.append(loss)
        torch.stack(losses).sum().backward()
    return time.perf_counter() - start, [p.grad.clone() for p in params]


def _carry_bytes() -> int:
    return 2 * BATCH * HIDDEN * 4  # h and c, float32


def _graph_bytes(step: Any, carry: Any, x: Any, params: list[Any]) -> int:
    """The bytes one step's graph keeps for its backward, as ``checkpoint_scan`` measures it."""
    from asyncckpt.torch import saved_bytes

    return saved_bytes(lambda: step(carry, x), [*carry, *x, *params])


def _nested_bytes(n: int, lengths: tuple[int, ...], carry: int, graph: int) -> int:
    """The bytes nested chunks of ``lengths`` hold at most: the carries at every level's
    chunk boundaries and one innermost chunk's graph."""
    bounds = (n, *lengths)
    return carry * sum(math.ceil(a / b) for a, b in zip(bounds, bounds[1:])) \
        + graph * lengths[-1]


def _nested_chunks(n: int, budget: int, carry: int, graph: int) -> tuple[int, ...]:
    """Chunk lengths, outermost first, for ``torch.utils.checkpoint`` nested in as few levels
    as fit ``budget``: with levels L1 > ... > Ld it holds n/L1 + L1/L2 + ... + L(d-1)/Ld
    carries and the graph of Ld steps, and each level runs every step once more. The terms
    are balanced (their product, n * graph / carry, is fixed, so their sum is least when they
    are equal); a budget that no depth up to 8 fits gets the depth that comes closest."""
    ratio = graph / carry

    def held(lengths: tuple[int, ...]) -> int:
        return _nested_bytes(n, lengths, carry, graph)

    best: tuple[int, ...] = ()
    for depth in range(1, 9):
        term = (n * ratio) ** (1 / (depth + 1))
        innermost = max(1.0, term / ratio)
        lengths = tuple(max(1, min(n, round(innermost * term ** (depth - 1 - i))))
                        for i in range(depth))
        if not best or held(lengths) < held(best):
            best = lengths
        if held(lengths) <= budget:
            return lengths
    return best


def _budget_chunks(n: int, budget: str) -> dict[str, Any]:
    """What ``torch-checkpoint-budget`` makes of ``budget``: its chunk lengths and the bytes
    they hold, beside a step's graph and a carry."""
    import torch

    from asyncckpt.planning import parse_bytes

    step, xs, params = _model(min(n, 2))
    carry = (torch.zeros(BATCH, HIDDEN), torch.zeros(BATCH, HIDDEN))
    graph = _graph_bytes(step, carry, (xs[0][0], xs[1][0]), params)
    lengths = _nested_chunks(n, parse_bytes("budget", budget), _carry_bytes(), graph)
    return {"lengths": list(lengths),
            "held_bytes": _nested_bytes(n, lengths, _carry_bytes(), graph),
            "graph_bytes_per_step": graph,
            "carry_bytes": _carry_bytes()}


def _peak_rss() -> int:
    """The process's peak RSS in bytes since it was last reset (Linux's VmHWM)."""
    with open("/proc/self/status") as status:
        line = next(line for line in status if line.startswith("VmHWM:"))
    return int(line.split()[1]) * 1024


def _deep_stack(depth: int) -> tuple[Any, Any]:
    """An MLP of ``depth`` layers whose widths alternate between 256 and 1024, and its input."""
    import torch

    torch.manual_seed(0)
    layers: list[Any] = []
    for i in range(depth):
        wide, narrow = (256, 1024) if i % 2 == 0 else (1024, 256)
        layers += [torch.nn.Linear(wide, narrow), torch.nn.Tanh()]
    return torch.nn.Sequential(*layers), torch.randn(BATCH, 256, requires_grad=True)


def _run_sequential(method: str, depth: int, budget: str,
                    stack: tuple[Any, Any] | None = None) -> tuple[float, list[Any]]:
    """One gradient of the deep stack (``stack``: built beforehand, outside what is measured);
    its seconds and the parameters' gradients."""
    import torch.utils.checkpoint as torch_checkpoint

    from asyncckpt.torch import checkpoint_sequential

    net, x = stack if stack is not None else _deep_stack(depth)
    start = time.perf_counter()
    if method == "checkpoint_sequential":
        out = checkpoint_sequential(net, x, memory_budget=budget)
    elif method == "torch-checkpoint_sequential":  # sqrt(layers) segments, torch's advice
        out = torch_checkpoint.checkpoint_sequential(net, max(1, int(len(net) ** 0.5)), x,
                                                     use_reentrant=False)
    else:
        out = net(x)
    out.square().sum().backward()
    return time.perf_counter() - start, [p.grad.clone() for p in net.parameters()]


def _memory(method: str, n: int, budget: str) -> dict[str, float]:
    """Peak RSS of one gradient, in this process (run it in a fresh one)."""
    import psutil

    sequential = "sequential" in method or method == "plain-stack"
    run = _run_sequential if sequential else _run
    run(method, 10, budget)  # imports, thread pools, first allocations
    # the stack's parameters are the model's, not the method's: built before measuring
    stack = {"stack": _deep_stack(n)} if sequential else {}
    before = psutil.Process().memory_info().rss
    with open("/proc/self/clear_refs", "w") as clear:
        clear.write("5")  # reset the peak to the current RSS
    seconds, _ = run(method, n, budget, **stack)
    peak = _peak_rss()
    return {"peak_rss_mib": round(peak / 2**20, 1),
            "growth_mib": round(max(0, peak - before) / 2**20, 1), "seconds": round(seconds, 3)}


def _times(n: int, repeats: int, budget: str, plain: bool) -> dict[str, Any]:
    methods = ["checkpoint_scan"] + (["plain", "forward-no-grad", "torch-checkpoint",
                                      "torch-checkpoint-chunks", "torch-checkpoint-budget"]
                                     if plain else [])
    times: dict[str, list[float]] = {m: [] for m in methods}
    equal = {m: True for m in methods if m not in ("plain", "forward-no-grad")}
    for _ in range(repeats):
        grads: dict[str, list[Any]] = {}
        for method in methods:
            seconds, grads[method] = _run(method, n, budget)
            times[method].append(seconds)
        for method in equal if plain else ():
            equal[method] &= all(a.numpy().tobytes() == b.numpy().tobytes()
                                 for a, b in zip(grads[method], grads["plain"]))
    median = {m: statistics.median(v) for m, v in times.items()}
    out: dict[str, Any] = {"seconds": {m: round(v, 3) for m, v in median.items()}}
    if plain:
        floor = median["plain"] + median["forward-no-grad"]
        out.update(floor_s=round(floor, 3),
                   scan_over_floor=round(median["checkpoint_scan"] / floor, 3),
                   scan_over_plain=round(median["checkpoint_scan"] / median["plain"], 3),
                   torch_checkpoint_over_scan=round(
                       median["torch-checkpoint"] / median["checkpoint_scan"], 3),
                   torch_chunks_over_scan=round(
                       median["torch-checkpoint-chunks"] / median["checkpoint_scan"], 3),
                   torch_budget_over_scan=round(
                       median["torch-checkpoint-budget"] / median["checkpoint_scan"], 3),
                   bitwise_equal_to_plain=equal)
    return out


def _sequential_row(depth: int, repeats: int, budget: str) -> dict[str, Any]:
    methods = ["checkpoint_sequential", "plain-stack", "torch-checkpoint_sequential"]
    times: dict[str, list[float]] = {m: [] for m in methods}
    equal = True
    for _ in range(repeats):
        grads = {}
        for method in methods:
            seconds, grads[method] = _run_sequential(method, depth, budget)
            times[method].append(seconds)
        equal &= all(a.numpy().tobytes() == b.numpy().tobytes()
                     for a, b in zip(grads["checkpoint_sequential"], grads["plain-stack"]))
    median = {m: statistics.median(v) for m, v in times.items()}
    memory = {}
    for method in methods:
        done = subprocess.run([sys.executable, __file__, "--budget", budget,
                               "--batch", str(BATCH), "--memory-of", method, str(depth)],
                              capture_output=True, text=True, check=True)
        memory[method] = json.loads(done.stdout.strip().splitlines()[-1])
    return {"bench": "torch-sequential", "layers": 2 * depth, "widths": [256, 1024],
            "batch": BATCH, "budget": budget, "seconds": {m: round(v, 3) for m, v in median.items()},
            "ours_over_plain": round(median["checkpoint_sequential"] / median["plain-stack"], 3),
            "torch_over_ours": round(median["torch-checkpoint_sequential"]
                                     / median["checkpoint_sequential"], 3),
            "bitwise_equal_to_plain": equal, "memory": memory}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--n", type=int, nargs="+", default=[1000, 10000, 100000])
    parser.add_argument("--plain-max", type=int, default=10000)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--budget", default="1MiB")
    parser.add_argument("--batch", type=int, default=4)
    parser.add_argument("--hidden", type=int, default=32)
    parser.add_argument("--memory-of", nargs=2, metavar=("METHOD", "N"), help=argparse.SUPPRESS)
    parser.add_argument("--sequential", type=int, default=0, metavar="DEPTH",
                        help="instead: checkpoint_sequential on an MLP of DEPTH layer pairs")
    add_flag(parser)
    args = parser.parse_args()
    _configure(args.batch, args.hidden)
    if args.memory_of:
        print(json.dumps(_memory(args.memory_of[0], int(args.memory_of[1]), args.budget)))
        return
    if args.sequential:
        row = _sequential_row(args.sequential, args.repeats, args.budget)
        print(json.dumps(row), flush=True)
        record("bench_torch", row, ["bench", "layers", "batch", "budget"], args=args)
        return
    for n in args.n:
        plain = n <= args.plain_max
        row: dict[str, Any] = {"bench": "torch", "n": n, "batch": BATCH, "hidden": HIDDEN,
                               "carry_bytes": 2 * BATCH * HIDDEN * 4, "budget": args.budget}
        if plain:  # beyond --plain-max, memory only
            row.update(_times(n, args.repeats, args.budget, plain))
        row["memory"] = {}
        row["torch_budget_chunks"] = _budget_chunks(n, args.budget)
        for method in ["checkpoint_scan", "torch-checkpoint-chunks",
                       "torch-checkpoint-budget"] + (
                ["plain", "torch-checkpoint"] if plain else []):
            done = subprocess.run([sys.executable, __file__, "--budget", args.budget,
                                   "--batch", str(BATCH), "--hidden", str(HIDDEN),
                                   "--memory-of", method, str(n)],
                                  capture_output=True, text=True, check=True)
            row["memory"][method] = json.loads(done.stdout.strip().splitlines()[-1])
        print(json.dumps(row), flush=True)
        record("bench_torch", row, ["bench", "n", "batch", "hidden", "budget"], args=args)


if __name__ == "__main__":
    main()
