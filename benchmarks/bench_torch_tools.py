"""asyncckpt's torch adapters against the tool their users already have, at equal memory.

``checkpoint_sequential`` against ``torch.utils.checkpoint.checkpoint_sequential``
(``use_reentrant=False``) on an MLP and a stack of transformer blocks, and ``checkpoint_scan``
against ``torch.utils.checkpoint.checkpoint`` over chunks of a GRU's steps. For each setting of
torch's tool (its segments, or its chunk length), the peak resident growth of its gradient is
measured, and asyncckpt is given that as ``memory_budget``; the peaks of both are reported, the
time of each as the median of interleaved repeats, and the ratio torch / asyncckpt. Every
gradient is compared with plain autograd's, bit for bit.

The process re-runs itself with glibc's mmap threshold fixed (``MALLOC_MMAP_THRESHOLD_``), and
lowers it to a page while a peak is measured, so a peak is what a gradient allocates, not what
malloc's heaps kept from the one before; the
parameters' gradients are allocated before each measure (the program's own). Prints one JSON
line per row.

    python benchmarks/bench_torch_tools.py [--repeats 5] [--only mlp,transformer,gru]
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time
from collections.abc import Callable
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(Path(__file__).resolve().parent))
from _results import add_flag, record  # noqa: E402

MMAP_THRESHOLD = str(128 << 10)
#: the keys of a row that name its setting (the results page keeps the latest row of each)
CONFIG = ("workload", "torch_segments", "torch_chunk")
MiB = 2**20


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--only", default="mlp,transformer,gru")
    parser.add_argument("--threads", type=int, default=1)
    add_flag(parser)
    args = parser.parse_args()
    if os.environ.get("MALLOC_MMAP_THRESHOLD_") != MMAP_THRESHOLD:
        os.execve(sys.executable, [sys.executable, *sys.argv],
                  {**os.environ, "MALLOC_MMAP_THRESHOLD_": MMAP_THRESHOLD})
    import torch

    torch.set_num_threads(args.threads)
    for name in args.only.split(","):
        for row in WORKLOADS[name](args.repeats):
            print(json.dumps(row), flush=True)
            record("bench_torch_tools", row, [k for k in row if k in CONFIG], args=args)


def _mmap_threshold(nbytes: int) -> None:
    import ctypes

    ctypes.CDLL("libc.so.6").mallopt(-3, nbytes)  # M_MMAP_THRESHOLD


def peak_growth(fn: Callable[[], None]) -> int:
    """Peak resident growth of ``fn()`` from a reset just before it, every block of a page or
    more mapped while it runs (a GRU's 32 KiB tensors freed into malloc's heaps would
    otherwise be reused unseen by the next gradient)."""
    from experiments.lstm.worker import peak_rss_bytes, reset_peak_rss

    _mmap_threshold(4096)
    try:
        reset_peak_rss()
        base = peak_rss_bytes()
        fn()
        return peak_rss_bytes() - base
    finally:
        _mmap_threshold(int(MMAP_THRESHOLD))


def compare(label: str, params: list, plain: Callable[[], None], torch_run: Callable[[], None],
            ours: Callable[[], None], repeats: int, **row: object) -> dict:
    """One row: torch's tool and ours at torch's peak, timed interleaved, gradients checked."""
    import torch

    def grads(fn: Callable[[], None]) -> list:
        for p in params:
            p.grad = torch.zeros_like(p)
        fn()
        return [p.grad.clone() for p in params]

    reference = grads(plain)
    bitwise = {}
    for side, fn in (("torch", torch_run), ("ours", ours)):
        got = grads(fn)
        bitwise[side] = all(torch.equal(a, b) for a, b in zip(got, reference))
    peaks = {}
    for side, fn in (("torch", torch_run), ("ours", ours)):
        for p in params:
            p.grad = torch.zeros_like(p)
        peaks[side] = peak_growth(fn)
    times: dict[str, list[float]] = {"plain": [], "torch": [], "ours": []}
    for _ in range(repeats):
        for side, fn in (("plain", plain), ("torch", torch_run), ("ours", ours)):
            for p in params:
                p.grad = torch.zeros_like(p)
            start = time.perf_counter()
            fn()
            times[side].append(time.perf_counter() - start)
    med = {k: statistics.median(v) for k, v in times.items()}
    from asyncckpt.torch import last_stats

    stats = last_stats()
    return {"bench": "torch_tools", "workload": label, **row,
            "torch_peak_mib": round(peaks["torch"] / MiB, 1),
            "ours_peak_mib": round(peaks["ours"] / MiB, 1),
            "plain_s": round(med["plain"], 4), "torch_s": round(med["torch"], 4),
            "ours_s": round(med["ours"], 4),
            "torch_over_ours": round(med["torch"] / med["ours"], 3),
            "ours_over_plain": round(med["ours"] / med["plain"], 3),
            "bitwise": bitwise,
            "plan": None if stats is None else {"interval": stats.interval,
                                                "l1_peak_slots": stats.l1_peak_slots,
                                                "l2_writes": stats.l2_writes,
                                                "forward_steps": stats.forward_steps}}


def stack_rows(label: str, net, x, segment_counts: list[int], repeats: int) -> list[dict]:
    import torch
    import torch.utils.checkpoint as tc

    from asyncckpt.torch import checkpoint_sequential

    params = list(net.parameters())
    rows = []
    for k in segment_counts:
        def torch_run(k: int = k) -> None:
            tc.checkpoint_sequential(net, k, x, use_reentrant=False).sum().backward()

        for p in params:
            p.grad = torch.zeros_like(p)
        torch_run()  # warm
        for p in params:
            p.grad = torch.zeros_like(p)
        budget = peak_growth(torch_run)

        def ours(budget: int = budget) -> None:
            checkpoint_sequential(net, x, memory_budget=budget).sum().backward()

        try:
            ours()
        except Exception as error:  # a budget below our tightest plan
            rows.append({"bench": "torch_tools", "workload": label, "torch_segments": k,
                         "torch_peak_mib": round(budget / MiB, 1),
                         "ours": f"{type(error).__name__}: {str(error)[:160]}"})
            continue
        rows.append(compare(label, params, lambda: net(x).sum().backward(), torch_run, ours,
                            repeats, torch_segments=k, budget_mib=round(budget / MiB, 2)))
    return rows


def mlp(repeats: int) -> list[dict]:
    import torch

    torch.manual_seed(0)
    layers = []
    for _ in range(80):
        layers += [torch.nn.Linear(512, 512), torch.nn.Tanh()]
    net = torch.nn.Sequential(*layers)  # 160 layers, width 512
    x = torch.randn(64, 512)
    return stack_rows("mlp 160 layers, width 512, batch 64", net, x, [160, 40, 17, 8, 4, 2],
                      repeats)


def transformer(repeats: int) -> list[dict]:
    import torch

    torch.manual_seed(0)
    net = torch.nn.Sequential(*[torch.nn.TransformerEncoderLayer(
        128, 4, 256, dropout=0.0, batch_first=True) for _ in range(16)])
    x = torch.randn(16, 64, 128)
    return stack_rows("transformer 16 blocks, d 128, seq 64, batch 16", net, x,
                      [16, 8, 4, 2], repeats)


def gru(repeats: int) -> list[dict]:
    import torch
    import torch.utils.checkpoint as tc

    from asyncckpt.torch import checkpoint_scan

    torch.manual_seed(0)
    cell = torch.nn.GRUCell(64, 256)
    head = torch.nn.Linear(256, 1)
    params = [*cell.parameters(), *head.parameters()]
    n, batch = 1000, 32
    xs = torch.randn(n, batch, 64)
    h0 = torch.zeros(batch, 256)

    def step(h, x):
        h = cell(x, h)
        return h, head(h).square().mean()

    def chunk(h, xs_chunk):
        losses = []
        for x in xs_chunk:
            h, y = step(h, x)
            losses.append(y)
        return h, torch.stack(losses)

    def plain() -> None:
        chunk(h0, xs)[1].sum().backward()

    rows = []
    for length in (1000, 100, 32, 10, 1):
        def torch_run(length: int = length) -> None:
            h, total = h0, 0
            for start in range(0, n, length):
                h, ys = tc.checkpoint(chunk, h, xs[start:start + length], use_reentrant=False)
                total = total + ys.sum()
            total.backward()

        for p in params:
            p.grad = torch.zeros_like(p)
        torch_run()
        for p in params:
            p.grad = torch.zeros_like(p)
        budget = peak_growth(torch_run)

        def ours(budget: int = budget) -> None:
            checkpoint_scan(step, h0, xs, memory_budget=budget)[1].sum().backward()

        try:
            ours()
        except Exception as error:
            rows.append({"bench": "torch_tools", "workload": "gru", "torch_chunk": length,
                         "torch_peak_mib": round(budget / MiB, 1),
                         "ours": f"{type(error).__name__}: {str(error)[:160]}"})
            continue
        rows.append(compare(f"gru hidden 256, batch 32, n {n}", params, plain, torch_run, ours,
                            repeats, torch_chunk=length, budget_mib=round(budget / MiB, 2)))
    return rows


WORKLOADS = {"mlp": mlp, "transformer": transformer, "gru": gru}

if __name__ == "__main__":
    main()
