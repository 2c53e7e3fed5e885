"""The README's example runs as written, and its gradient is the map's gradient."""
from __future__ import annotations

import re

import numpy as np

from conftest import ROOT

README = ROOT / "README.md"


def final_loss(u0: np.ndarray, a: float, n: int, dt: float) -> float:
    u = u0.copy()
    for _ in range(n):
        u = u + dt * a * np.cos(u)
    return float(u @ u) / 2


def test_readme_example_runs_and_its_gradient_matches_finite_differences(capsys) -> None:
    blocks = re.findall(r"```python\n(.*?)```", README.read_text(), flags=re.S)
    assert blocks, "the README has a python example"
    names: dict = {}
    exec(compile(blocks[0], str(README), "exec"), names)  # noqa: S102 - our own README
    printed = capsys.readouterr().out.split()
    assert float(printed[1]) == names["grad_a"][0]
    n, a, dt = names["n"], names["a"], names["dt"]
    u0 = np.linspace(0.0, 1.0, names["u"].size)
    h = 1e-6
    by_a = (final_loss(u0, a + h, n, dt) - final_loss(u0, a - h, n, dt)) / (2 * h)
    assert abs(names["grad_a"][0] - by_a) <= 1e-5 * abs(by_a)
    lam = names["lam"]
    for i in (0, 4321, u0.size - 1):  # the map acts on each element alone: J's terms split
        alone = u0[i:i + 1]
        by_u = (final_loss(alone + h, a, n, dt) - final_loss(alone - h, a, n, dt)) / (2 * h)
        assert abs(lam[i] - by_u) <= 1e-5 * max(abs(by_u), 1e-12), i


def test_readme_states_the_protocols_rules() -> None:
    text = README.read_text()
    for rule in ("Update in place", "Keywords", "What is live when"):
        assert rule in text
