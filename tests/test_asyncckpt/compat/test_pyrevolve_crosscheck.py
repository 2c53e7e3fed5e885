"""Revolve's totals against pyrevolve's C++ Revolve, counted through its Revolver."""
from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from schedules import Revolve, simulate

pyrevolve = pytest.importorskip("pyrevolve")


class CountingOperator:
    """Counts the steps its ``apply`` is asked to advance."""

    def __init__(self) -> None:
        self.steps = 0

    def apply(self, *, t_start: int, t_end: int) -> None:
        self.steps += t_end - t_start


class TinyCheckpoint:
    """One float64 per state, enough for pyrevolve's storage to run."""

    def __init__(self) -> None:
        self.data = np.zeros(1)
        self.size = 1
        self.dtype = np.float64
        self.nbytes = 8

    def get_data(self, timestep: int) -> list[np.ndarray]:
        return [self.data]

    def get_data_location(self, timestep: int) -> list[np.ndarray]:
        return [self.data]


def pyrevolve_forward_steps(n: int, s: int) -> int:
    forward = CountingOperator()
    revolver = pyrevolve.Revolver(TinyCheckpoint(), forward, CountingOperator(), s, n)
    revolver.apply_forward()
    revolver.apply_reverse()
    return forward.steps


@settings(max_examples=60, deadline=None)
@given(n=st.integers(2, 3000), s=st.integers(1, 40))
def test_revolve_total_equals_pyrevolve(n: int, s: int) -> None:
    if s >= n:
        s = n - 1  # pyrevolve refuses more checkpoints than steps
    assert simulate(Revolve(n, s)).forward_steps == pyrevolve_forward_steps(n, s)


@pytest.mark.parametrize(("n", "s"), [(2000, 10), (2000, 50), (1000, 10)])
def test_revolve_total_equals_pyrevolve_at_anchor_sizes(n: int, s: int) -> None:
    assert simulate(Revolve(n, s)).forward_steps == pyrevolve_forward_steps(n, s)
