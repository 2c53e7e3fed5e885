"""The LSTM experiment: every method's gradients equal standard backpropagation's bit for bit,
backpropagation matches finite differences, nothing grows with n, and the runner runs."""
from __future__ import annotations

import importlib.util
import json
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from experiments.lstm.corpus import load_corpus
from experiments.lstm.methods import JAX, METHODS, TORCH, run_method
from experiments.lstm.model import LSTM
from conftest import ROOT

CORPUS = load_corpus()

#: the methods that run pyrevolve itself, the baseline (the 'experiments' extra installs it)
PYREVOLVE = ("store-all", "revolve", "revolve-budget")
needs_pyrevolve = pytest.mark.skipif(importlib.util.find_spec("pyrevolve") is None,
                                     reason="needs the 'experiments' extra (pyrevolve)")


def gradients(method: str, n: int, kernels: str, level2_dir: Path, **kwargs) -> np.ndarray:
    model = LSTM(CORPUS, n, hidden=16, batch=3, kernels=kernels,
                 device=kwargs.get("device", "cpu"))
    model.reset()
    run_method(method, model, slots=kwargs.get("slots", 3), interval=kwargs.get("interval", 1),
               level2_dir=str(level2_dir))
    return model.gradient_vector()


@pytest.mark.parametrize("kernels", ["numpy", "numba"])
@pytest.mark.parametrize("n", [1, 2, 17, 60])
def test_every_method_equals_backprop_bit_for_bit(kernels: str, n: int, disk_dir: Path) -> None:
    reference = gradients("backprop", n, kernels, disk_dir)
    assert np.isfinite(reference).all() and np.abs(reference).sum() > 0
    for method in (m for m in METHODS if m not in TORCH + JAX + PYREVOLVE):
        got = gradients(method, n, kernels, disk_dir)
        assert got.tobytes() == reference.tobytes(), method
    for interval in (1, 5, n):
        got = gradients("async-dram", n, kernels, disk_dir, interval=min(interval, n))
        assert got.tobytes() == reference.tobytes()


@needs_pyrevolve
@pytest.mark.parametrize("kernels", ["numpy", "numba"])
@pytest.mark.parametrize("n", [1, 2, 17, 60])
def test_pyrevolves_methods_equal_backprop_bit_for_bit(kernels: str, n: int,
                                                        disk_dir: Path) -> None:
    reference = gradients("backprop", n, kernels, disk_dir)
    for method in PYREVOLVE:
        got = gradients(method, n, kernels, disk_dir)
        assert got.tobytes() == reference.tobytes(), method


@pytest.mark.parametrize("n", [1, 2, 17, 60])
def test_the_torch_methods_equal_torch_autograd_bit_for_bit_and_numpy_closely(
        n: int, disk_dir: Path) -> None:
    """The same LSTM in PyTorch: plain autograd, torch's per-step checkpoint and asyncckpt's
    checkpoint_scan give one gradient bit for bit, and it is numpy backprop's to rounding
    (torch's kernels round differently)."""
    pytest.importorskip("torch")
    reference = gradients("torch-backprop", n, "numpy", disk_dir)
    for method in TORCH[1:]:
        got = gradients(method, n, "numpy", disk_dir)
        assert got.tobytes() == reference.tobytes(), method
    numpy_reference = gradients("backprop", n, "numpy", disk_dir)
    np.testing.assert_allclose(reference, numpy_reference, rtol=1e-9, atol=1e-12)


@pytest.mark.parametrize("n", [1, 17, 60])
def test_the_jax_methods_equal_numpy_backprop_to_rounding(n: int, disk_dir: Path) -> None:
    """The same LSTM in JAX: jax.grad of lax.scan and asyncckpt's checkpoint_scan (its
    parameter cotangents summed segment by segment: a few ulps from lax.scan's), both numpy
    backprop's to rounding (XLA's kernels round differently)."""
    pytest.importorskip("jax.numpy")
    reference = gradients("jax-scan", n, "numpy", disk_dir)
    got = gradients("jax-checkpoint-scan", n, "numpy", disk_dir)
    np.testing.assert_allclose(got, reference, rtol=0, atol=1e-13 * np.abs(reference).max())
    numpy_reference = gradients("backprop", n, "numpy", disk_dir)
    np.testing.assert_allclose(reference, numpy_reference, rtol=1e-9, atol=1e-12)


@pytest.mark.parametrize("n", [1, 23])
def test_on_the_device_stand_in_every_method_equals_host_backprop(n: int, disk_dir: Path) -> None:
    """``--device``: the model's arrays in (stand-in) device memory, Level-1 there, Level-2
    page-locked; each method that runs on a device gives the host's gradients bit for bit."""
    from experiments.lstm.methods import ON_DEVICE

    reference = gradients("backprop", n, "numpy", disk_dir)
    for method in ON_DEVICE:
        got = gradients(method, n, "numpy", disk_dir, device="standin", interval=min(3, n))
        assert got.tobytes() == reference.tobytes(), method
    with pytest.raises(ValueError, match="host only"):
        gradients("revolve", n, "numpy", disk_dir, device="standin")


def test_numba_and_numpy_kernels_agree_closely(disk_dir: Path) -> None:
    a = gradients("backprop", 30, "numpy", disk_dir)
    b = gradients("backprop", 30, "numba", disk_dir)
    np.testing.assert_allclose(a, b, rtol=1e-9, atol=1e-12)


def test_backprop_matches_finite_differences() -> None:
    n = 6
    model = LSTM(CORPUS, n, hidden=5, batch=2, kernels="numpy", seed=3)

    def loss() -> float:
        model.reset()
        for t in range(n):
            model.step(t)
        return model.loss

    model.reset()
    run_method("backprop", model)
    analytic = {name: grad.copy() for name, grad in model.grads.items()}
    rng = np.random.default_rng(0)
    eps = 1e-6
    for name, param in model.params.items():
        for index in {tuple(rng.integers(0, s) for s in param.shape) for _ in range(6)}:
            saved = param[index]
            param[index] = saved + eps
            up = loss()
            param[index] = saved - eps
            down = loss()
            param[index] = saved
            numeric = (up - down) / (2 * eps)
            assert analytic[name][index] == pytest.approx(numeric, rel=1e-5, abs=1e-8), (name, index)


def test_the_reverse_step_refuses_to_run_without_its_taping_step() -> None:
    model = LSTM(CORPUS, 4, hidden=4, batch=2, kernels="numpy")
    model.reset()
    model.step(0)
    model.step(1)
    with pytest.raises(RuntimeError, match="taping step is missing"):
        model.adjoint(0)


def test_nothing_in_the_model_grows_with_n() -> None:
    def array_bytes(model: LSTM) -> int:
        return sum(v.nbytes for v in vars(model).values() if isinstance(v, np.ndarray)) + sum(
            a.nbytes for d in (model.params, model.grads, model.rms) for a in d.values())

    assert array_bytes(LSTM(CORPUS, 10, hidden=8, batch=2)) == array_bytes(
        LSTM(CORPUS, 100000, hidden=8, batch=2))


@pytest.mark.timeout(300)
def test_runner_writes_results_figures_and_a_table(tmp_path: Path) -> None:
    for extra, module in (("experiments", "matplotlib"), ("experiments", "pyrevolve"),
                          ("torch", "torch"), ("jax", "jax")):
        pytest.importorskip(module, reason=f"needs the '{extra}' extra ({module})")
    out = tmp_path / "out"
    done = subprocess.run(
        [sys.executable, "-m", "experiments.lstm", "--lengths", "8", "16", "--repeats", "1",
         "--hidden", "8", "--batch", "2", "--out", str(out), "--methods", "backprop", "revolve",
         "revolve-budget", "async-dram", "async-disk", "async-budget", "torch-backprop",
         "torch-scan", "jax-scan", "jax-checkpoint-scan"],
        capture_output=True, text=True, cwd=ROOT)
    assert done.returncode == 0, done.stderr
    results = json.loads((out / "results.json").read_text())
    assert len(results) == 20
    for family in (("backprop", "revolve", "revolve-budget", "async-dram", "async-disk",
                    "async-budget"),
                   ("torch-backprop", "torch-scan")):
        assert len({r["gradient_xxh3"] for r in results
                    if r["n"] == 16 and r["method"] in family}) == 1
    assert "torch-scan" in done.stdout and "How much time?" in done.stdout
    assert "How much memory?" in done.stdout and "gradients bit for bit" in done.stdout
    assert "revolve-budget / async-budget" in done.stdout  # pyrevolve at equal memory
    # a person's terminal: every line fits 100 columns, but those naming the (long) output path
    assert max(len(line) for line in done.stdout.splitlines() if str(out) not in line) <= 100
    assert (out / "fig4_memory.png").stat().st_size > 10000
    assert (out / "fig5_time.png").stat().st_size > 10000
    assert "numpy = backprop: yes" in done.stdout and "torch = torch-backprop: yes" in done.stdout
    assert "jax-checkpoint-scan = jax-scan within" in done.stdout
    assert all(r["grad_rel_to_jax_scan"] < 1e-12 for r in results
               if r["method"] == "jax-checkpoint-scan")
    assert [p.name for p in out.iterdir() if p.name.startswith("level2")] == []


def test_taping_free_checkpoint_holds_what_the_reverse_step_reads(disk_dir: Path) -> None:
    """The taping-free method equals backprop with any interval and recomputes nothing at
    interval 1; its reverse operator refuses a call over more than one step."""
    from experiments.lstm.model import StepCheckpoint, StepReverseOperator

    n = 23
    reference = gradients("backprop", n, "numpy", disk_dir)
    for interval, slots in ((1, 2), (4, 4), (4, 2), (23, 3), ("auto", 2)):
        model = LSTM(CORPUS, n, hidden=16, batch=3, kernels="numpy")
        model.reset()
        report = run_method("async-taping-free", model, slots=slots, interval=interval,
                            level2_dir=str(disk_dir))
        assert model.gradient_vector().tobytes() == reference.tobytes()
        if interval == 1:  # every state on Level-2: the reverse sweep recomputes nothing
            assert model.steps_computed == n and report["l2_writes"] == n
    model = LSTM(CORPUS, n, hidden=4, batch=2, kernels="numpy")
    assert StepCheckpoint(model).nbytes == sum(getattr(model, a).nbytes
                                               for a in LSTM.STEP_SCRATCH)
    with pytest.raises(ValueError, match="one step at a time"):
        StepReverseOperator(model).apply(t_start=3, t_end=5)
