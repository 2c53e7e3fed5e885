"""Level-1 in device memory, Level-2 in pinned host memory: what checkpointing costs the forward
sweep of a device-resident stencil, how fast Level-2 is written beside it, and whether device
memory stays flat in n. One JSON line on stdout (a readable summary on stderr).

- ``forward_over_bare``: the checkpointed forward sweep (taping-free, ``interval="auto"``, every
  I-th state copied device-to-device, then device-to-pinned-host on a stream of its own) over
  the same sweep without checkpointing, medians of interleaved repeats (goal <= 1.05 at 64 MiB).
- ``write_over_raw_d2h``: the sustained Level-2 write rate of a sweep that stores every state
  of a near-free step (bytes written / sweep time) over a raw device-to-pinned copy measured by
  events on one stream (goal >= 0.8).
- ``device_bytes`` at n and at 4n (goal: equal), and with CuPy the memory pool's bytes in use
  after each run.
- the gradient of the checkpointed run equals the store-all one bit for bit (``bitwise``).

Usage: python benchmarks/bench_gpu.py [--device cuda|standin] [--mib 64] [--n 400] [--repeats 5]
On a machine without a GPU, ``--device standin`` runs the same path on asyncckpt's CPU stand-in
(smaller defaults), which checks the benchmark, not the hardware.
"""
from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from typing import Any

from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _common import Fwd, Rev  # noqa: E402
from _results import add_flag, record  # noqa: E402

from asyncckpt import AsyncCheckpointer  # noqa: E402
from asyncckpt._execution.link import DeviceLink  # noqa: E402


class Stencil:
    """u_{t+1} = u_t + c Lap(u_t) (``passes`` times per step) on an m^3 float32 grid held on the
    device; its adjoint reads the live u_t (taping-free) and accumulates dJ/dc on the device."""

    def __init__(self, xp: Any, make: Any, m: int, passes: int) -> None:
        rng = np.random.default_rng(0)
        self.xp, self.passes, self.c = xp, passes, np.float32(0.01)
        self.u0 = make(rng.standard_normal((m, m, m)).astype(np.float32))
        self.u = make(np.zeros((m, m, m), np.float32))
        self.lap_out = make(np.zeros((m, m, m), np.float32))
        self.lam = make(np.zeros((m, m, m), np.float32))
        self.grad = make(np.zeros((), np.float32))
        self.size, self.dtype = self.u.size, np.dtype(np.float32)

    def get_data(self, t: int) -> list[Any]:
        return [self.u]

    get_data_location = get_data

    def reset(self) -> None:
        self.u[...] = self.u0
        self.lam[...] = 1.0
        self.grad[...] = 0.0

    def lap(self, x: Any) -> Any:
        out = self.lap_out
        out[1:-1, 1:-1, 1:-1] = (x[2:, 1:-1, 1:-1] + x[:-2, 1:-1, 1:-1] + x[1:-1, 2:, 1:-1]
                                 + x[1:-1, :-2, 1:-1] + x[1:-1, 1:-1, 2:] + x[1:-1, 1:-1, :-2]
                                 - 6 * x[1:-1, 1:-1, 1:-1])
        return out

    def step(self) -> None:
        for _ in range(self.passes):
            self.u += self.c * self.lap(self.u)

    def reverse_step(self) -> None:
        self.grad += (self.lam * self.lap(self.u)).sum()
        self.lam += self.c * self.lap(self.lam)


def setup(device: str) -> tuple[Any, Any, Any]:
    """The array module, a maker of device arrays and a full synchronisation."""
    if device == "cuda":
        import cupy

        return cupy, cupy.asarray, cupy.cuda.Device().synchronize
    from asyncckpt.devices import StandInDevice

    standin = StandInDevice()
    return np, standin.array, lambda: None


def store_all(w: Stencil, n: int, sync: Any) -> np.ndarray:
    """The reference: every state kept on the device, reversed taping-free."""
    w.reset()
    states = []
    for _ in range(n):
        states.append(w.u.copy())
        w.step()
    for t in range(n - 1, -1, -1):
        w.u[...] = states[t]
        w.reverse_step()
    sync()
    return np.asarray(w.grad.get() if hasattr(w.grad, "get") else w.grad).copy()


def write_rate(w: Stencil, options: dict[str, Any], repeats: int, n: int = 64) -> dict[str, Any]:
    """Level-2 writes of a sweep that stores each of ``n`` near-free steps, and where their time
    goes: per state, the I/O thread's busy time (D2H copy by events, checksum, hand-over), the
    part of it spent pinning fresh host memory, and the caller's waits for a staging buffer."""
    rows = []
    with AsyncCheckpointer(w, Fwd(w), Rev(w), n, interval=1, **options) as ckp:
        for _ in range(repeats):
            w.reset()
            ckp.apply_forward()
            s = ckp.stats
            rows.append((s.bytes_written / s.forward_s, 1e3 * s.write_busy_s / s.l2_writes,
                         1e3 * s.write_fresh_s / s.l2_writes, 1e3 * s.write_stall_s / s.l2_writes))
            ckp.apply_reverse()
    rate, busy, fresh, stall = (statistics.median(column) for column in zip(*rows))
    return {"gb_s": rate / 1e9, "busy_ms_per_state": busy, "fresh_ms_per_state": fresh,
            "stall_ms_per_state": stall}


def checksum_rate(nbytes: int, repeats: int = 5) -> float:
    """GB/s of the host checksum (xxh3) on this host: what bounded the Level-2 writes of device
    states before their checksum moved to the device."""
    from asyncckpt._execution.link import HostLink

    data = np.random.default_rng(0).integers(0, 255, nbytes, dtype=np.uint8)
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        HostLink.checksum(data)
        times.append(time.perf_counter() - start)
    return nbytes / statistics.median(times) / 1e9


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--device", choices=["cuda", "standin"], default="cuda")
    parser.add_argument("--mib", type=float, help="state size (default 64 on cuda, 2 stand-in)")
    parser.add_argument("--n", type=int, help="steps (default 400 on cuda, 60 stand-in)")
    parser.add_argument("--passes", type=int, default=4, help="stencil passes per step")
    parser.add_argument("--slots", type=int, default=8)
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--io-threads", type=int, default=1)
    add_flag(parser)
    args = parser.parse_args(argv)
    cuda = args.device == "cuda"
    mib = args.mib or (64 if cuda else 2)
    n = args.n or (400 if cuda else 60)
    m = max(8, round((mib * 2**20 / 4) ** (1 / 3)))
    xp, make, sync = setup(args.device)
    w = Stencil(xp, make, m, args.passes)
    want = store_all(w, min(n, 40), sync)

    def bare() -> float:
        w.reset()
        sync()
        start = time.perf_counter()
        Fwd(w).apply(t_start=0, t_end=n)
        sync()
        return time.perf_counter() - start

    options = dict(l1_slots=args.slots, taping=False, io_threads=args.io_threads)
    bares, forwards = [], []
    with AsyncCheckpointer(w, Fwd(w), Rev(w), n, interval="auto", **options) as ckp:
        for i in range(args.repeats + 1):  # the first run calibrates "auto"
            bares.append(bare())
            w.reset()
            ckp.apply_forward()
            forwards.append(ckp.stats.forward_s)
            ckp.apply_reverse()
        chosen = ckp.stats.interval
        assert ckp.device is not None
        link = DeviceLink(ckp.device)
        try:
            d2h, _ = link.measure(ckp.nbytes)
        finally:
            link.close()
    with AsyncCheckpointer(w, Fwd(w), Rev(w), min(n, 40), interval=3, **options) as ckp:
        w.reset()
        ckp.apply_forward()
        ckp.apply_reverse()
        sync()
        got = np.asarray(w.grad.get() if hasattr(w.grad, "get") else w.grad).copy()
    pool = (lambda: int(xp.get_default_memory_pool().used_bytes())) if cuda else (lambda: 0)
    held = {}
    for steps in (n, 4 * n):  # the same plan, n and 4n steps
        with AsyncCheckpointer(w, Fwd(w), Rev(w), steps, interval=chosen or 1, **options) as ckp:
            w.reset()
            ckp.apply_forward()
            ckp.apply_reverse()
            held[steps] = ckp.stats.device_bytes, pool()
    (device_n, pool_n), (device_4n, pool_4n) = held[n], held[4 * n]
    saved_passes, w.passes = w.passes, 0  # a near-free step: the sweep is Level-2 bound
    variants = {"as run": {}, "io_threads=2": {"io_threads": 2},
                "staging_buffers=8": {"staging_buffers": 8}, "verify=False": {"verify": False}}
    writes = {name: write_rate(w, {**options, **extra}, args.repeats)
              for name, extra in variants.items()}
    w.passes = saved_passes
    rates = [writes["as run"]["gb_s"] * 1e9]
    nbytes = w.u.nbytes
    result = {
        "device": ckp.stats.device, "state_mib": nbytes / 2**20, "n": n, "passes": args.passes,
        "interval": chosen, "slots": args.slots, "io_threads": args.io_threads,
        "bare_s": statistics.median(bares[1:]), "forward_s": statistics.median(forwards[1:]),
        "forward_over_bare": statistics.median(forwards[1:]) / statistics.median(bares[1:]),
        "raw_d2h_gb_s": nbytes / d2h / 1e9 if d2h > 0 else None,
        "write_gb_s": statistics.median(rates) / 1e9, "writes": writes,
        "host_checksum_gb_s": checksum_rate(nbytes),
        "write_over_raw_d2h": statistics.median(rates) * d2h / nbytes if d2h > 0 else None,
        "device_bytes_n": device_n, "device_bytes_4n": device_4n, "pool_bytes_n": pool_n,
        "pool_bytes_4n": pool_4n,
        "bitwise": got.tobytes() == want.tobytes(),
    }
    print(f"{result['device']}: {mib:.0f} MiB states, I = {chosen}: forward/bare "
          f"{result['forward_over_bare']:.3f}; Level-2 writes {result['write_gb_s']:.1f} GB/s "
          f"against raw D2H {result['raw_d2h_gb_s'] or 0:.1f} GB/s; device bytes n "
          f"{device_n} / 4n {device_4n}; bitwise {result['bitwise']}", file=sys.stderr)
    print(json.dumps(result))
    record("bench_gpu", result, ["device", "state_mib", "n", "passes", "slots", "io_threads"],
           args=args)
    return 0


if __name__ == "__main__":
    sys.exit(main())
