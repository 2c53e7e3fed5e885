"""One (method, length) measurement in its own process: ``python -m experiments.lstm.worker``.

Prints one JSON line: the minimum time of k forward+backward passes, the process's peak resident
memory (VmHWM, as ``time`` reports it), what the method kept outside the process (tmpfs, page
cache), the recompute factor and a hash of the gradients.
"""
from __future__ import annotations

import argparse
import json
import resource
import threading
import time
from pathlib import Path

import numpy as np
import xxhash

from .corpus import load_corpus
from .kernels import KERNELS
from .methods import JAX, METHODS, parse_interval, run_method
from .model import LSTM

__all__ = ["main", "peak_rss_bytes", "reset_peak_rss"]


def peak_rss_bytes() -> int:
    """The process's peak resident set (VmHWM; ru_maxrss where /proc is missing)."""
    try:
        for line in Path("/proc/self/status").read_text().splitlines():
            if line.startswith("VmHWM:"):
                return int(line.split()[1]) * 1024
    except OSError:
        pass
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024


def reset_peak_rss() -> bool:
    """Reset the process's peak resident set to what it holds now (Linux 4.0 and later), so
    that a later :func:`peak_rss_bytes` measures from here rather than from the imports'
    transient peak; return whether it could."""
    try:
        Path("/proc/self/clear_refs").write_text("5")
    except OSError:
        return False
    return True


def _meminfo(field: str) -> int:
    try:
        for line in Path("/proc/meminfo").read_text().splitlines():
            if line.startswith(field + ":"):
                return int(line.split()[1]) * 1024
    except OSError:
        pass
    return 0


class OutsideMemory:
    """Samples the growth of /dev/shm (Shmem) and the page cache (Cached) every 20 ms."""

    def __init__(self) -> None:
        self.base_shmem = _meminfo("Shmem")
        self.base_cached = _meminfo("Cached")
        self.shmem = self.cached = 0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._sample, name="experiment-meminfo", daemon=True)

    def _sample(self) -> None:
        while not self._stop.wait(0.02):
            self.shmem = max(self.shmem, _meminfo("Shmem") - self.base_shmem)
            self.cached = max(self.cached, _meminfo("Cached") - self.base_cached)

    def __enter__(self) -> "OutsideMemory":
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join()


def device_peak_bytes(model: LSTM) -> int:
    """Device memory at its peak: what CuPy's memory pool holds (it keeps what it once
    allocated), or the stand-in's peak of runtime buffers; 0 on the host."""
    if model.device == "cuda":
        import cupy

        return int(cupy.get_default_memory_pool().total_bytes())
    if model.device == "standin":
        return model.standin.peak_bytes
    return 0


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--method", required=True, choices=sorted(METHODS))
    parser.add_argument("--n", type=int, required=True)
    parser.add_argument("--hidden", type=int, default=128)
    parser.add_argument("--batch", type=int, default=16)
    parser.add_argument("--slots", type=int, default=10)
    parser.add_argument("--interval", type=parse_interval, default=1)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--kernels", choices=KERNELS, default="numba")
    parser.add_argument("--level2-dir", default=None)
    parser.add_argument("--device", choices=["cpu", "cuda", "standin"], default="cpu")
    args = parser.parse_args(argv)

    corpus = load_corpus()
    # compile the kernels and import the method's modules before measuring anything
    warm = LSTM(corpus, 4, hidden=args.hidden, batch=args.batch, kernels=args.kernels,
                device=args.device)
    run_method(args.method, warm, slots=min(args.slots, 3), interval=1, level2_dir=args.level2_dir)
    del warm

    model = LSTM(corpus, args.n, hidden=args.hidden, batch=args.batch, kernels=args.kernels,
                 device=args.device)
    times, extra = [], {}
    with OutsideMemory() as outside:
        for _ in range(args.repeats):
            model.reset()
            start = time.perf_counter()
            extra = run_method(args.method, model, slots=args.slots, interval=args.interval,
                               level2_dir=args.level2_dir)
            times.append(time.perf_counter() - start)
    gradients = model.gradient_vector()
    if args.method in JAX and args.level2_dir:
        # the JAX methods' gradients are compared after the runs (see jax_gradient_errors)
        np.save(Path(args.level2_dir) / f"gradient-{args.method}-{args.n}.npy", gradients)
    model.rmsprop()  # the training step, after the measured pass
    result = {
        "method": args.method,
        "n": args.n,
        "time_s": min(times),
        "times_s": times,
        "peak_rss_bytes": peak_rss_bytes(),
        "shmem_growth_bytes": outside.shmem,
        "page_cache_growth_bytes": outside.cached,
        "recompute_factor": (model.steps_computed - args.n) / args.n,
        "gradient_xxh3": xxhash.xxh3_64_hexdigest(np.ascontiguousarray(gradients)),
        "loss": model.loss,
        "hidden": args.hidden,
        "batch": args.batch,
        "slots": args.slots,
        "kernels": model.kernels,
        "device": args.device,
        "device_peak_bytes": device_peak_bytes(model),
        **extra,
    }
    print(json.dumps(result))


if __name__ == "__main__":
    main()
