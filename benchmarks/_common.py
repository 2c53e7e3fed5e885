"""Helpers shared by the benchmarks: a tunable numpy workload and median timing."""
from __future__ import annotations

import statistics
import time
from collections.abc import Callable

import numpy as np


class Workload:
    """A state of ``nbytes`` float64s and forward/reverse steps of a few ufunc passes each.

    ``passes`` sets the cost of a step (about 0.4 ms per pass over 4 MiB here). The reverse step
    reads the live state, so a wrong state gives a wrong adjoint.
    """

    def __init__(self, nbytes: int, passes: int = 4) -> None:
        self.state = np.full(nbytes // 8, 0.5)
        self.adjoint = np.zeros_like(self.state)
        self.tmp = np.zeros_like(self.state)
        self.passes = passes
        self.size = self.state.size
        self.dtype = self.state.dtype
        self.initial = self.state.copy()

    def get_data(self, t: int) -> list[np.ndarray]:
        return [self.state]

    def get_data_location(self, t: int) -> list[np.ndarray]:
        return [self.state]

    def reset(self) -> None:
        self.state[...] = self.initial
        self.adjoint[...] = 1.0

    def step(self) -> None:
        for _ in range(self.passes):
            np.multiply(self.state, 0.999, out=self.state)
            np.add(self.state, 1e-3, out=self.state)

    def reverse_step(self) -> None:
        np.multiply(self.state, 1e-6, out=self.tmp)
        for _ in range(self.passes - 1):
            np.multiply(self.adjoint, 0.999, out=self.adjoint)
        np.add(self.adjoint, self.tmp, out=self.adjoint)


class Fwd:
    def __init__(self, w: Workload) -> None:
        self.w = w

    def apply(self, *, t_start: int, t_end: int) -> None:
        for _ in range(t_start, t_end):
            self.w.step()


class Rev:
    def __init__(self, w: Workload) -> None:
        self.w = w

    def apply(self, *, t_start: int, t_end: int) -> None:
        self.w.reverse_step()


def median_time(fn: Callable[[], object], repeats: int) -> float:
    """Median wall time of ``repeats`` calls of ``fn``."""
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        fn()
        times.append(time.perf_counter() - start)
    return statistics.median(times)


def store_all(w: Workload, n: int, buffers: list[np.ndarray]) -> None:
    """Store every state in preallocated RAM, then reverse under the pyrevolve protocol."""
    w.reset()
    for t in range(n):
        np.copyto(buffers[t], w.state)
        w.step()
    w.reverse_step()
    for t in range(n - 2, -1, -1):
        np.copyto(w.state, buffers[t])
        w.step()
        w.reverse_step()


def pyrevolve_runner(w: Workload, slots: int, n: int) -> Callable[[], None]:
    """A function running one forward+reverse pass of ``w`` with pyrevolve's Revolver."""
    import pyrevolve

    class PyCheckpoint(pyrevolve.Checkpoint):
        size, dtype = w.size, w.dtype

        def get_data(self, t: int) -> list[np.ndarray]:
            return [w.state]

        def get_data_location(self, t: int) -> list[np.ndarray]:
            return [w.state]

    fwd, rev = Fwd(w), Rev(w)

    def run() -> None:
        w.reset()
        revolver = pyrevolve.Revolver(PyCheckpoint(), fwd, rev, slots, n)
        revolver.apply_forward()
        revolver.apply_reverse()

    return run


def gradient_error(grad: np.ndarray, reference: np.ndarray) -> dict[str, float]:
    """How far a lossy run moved a gradient: the relative L2 error, and the largest absolute
    difference over the reference's largest magnitude."""
    scale = float(np.abs(reference).max()) or 1.0
    return {"relative_l2": float(np.linalg.norm(grad - reference)
                                 / (np.linalg.norm(reference) or 1.0)),
            "max_abs_over_max": float(np.abs(grad - reference).max()) / scale}
