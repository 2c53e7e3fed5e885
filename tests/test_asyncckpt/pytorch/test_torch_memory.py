"""The torch front end's memory promise, in processes of their own: a first call grows by at
most ``budget + 1% + 4 MiB`` once the program's own tensors are resident and torch has paid
what one plain step of the model costs it, or the call is refused naming the bytes its
tightest plan needs; gradients stay plain autograd's."""
from __future__ import annotations

import sys

import pytest

torch = pytest.importorskip("torch")

from torch_budgeted import run_torch_in_process  # noqa: E402

MiB = 2**20
GRU = {"vocab": 256, "hidden": 128, "batch": 32, "n": 2000}


def bound(budget: int) -> float:
    return budget * 1.01 + 4 * MiB


def against_plain(workload: str, budget: int, tmp_path, **sizes: int) -> tuple[dict, dict]:
    """The reports of one call under ``memory_budget=budget`` and of plain autograd, each in a
    process of its own, once their parameters' gradients are found equal bit for bit."""
    report = run_torch_in_process(workload, options={"memory_budget": budget},
                                  grads_path=str(tmp_path / "ours.pt"), **sizes)
    plain = run_torch_in_process(workload, plain=True, grads_path=str(tmp_path / "plain.pt"),
                                 **sizes)
    ours, reference = torch.load(tmp_path / "ours.pt"), torch.load(tmp_path / "plain.pt")
    assert all(a.numpy().tobytes() == b.numpy().tobytes() for a, b in zip(ours, reference))
    return report, plain


@pytest.mark.skipif(sys.platform != "linux", reason="peak resident set from /proc")
def test_a_scans_first_call_stays_within_its_budget(tmp_path):
    # the first call imported sympy through torch.autograd.grad's shape check (38 MiB) and
    # planned a segment's graph at what autograd saves alone: 48 MiB under 8 MiB
    budget = 8 * MiB
    report, plain = against_plain("gru", budget, tmp_path, **GRU)
    assert report["calls"][0] <= bound(budget), report
    assert report["calls"][0] < plain["calls"][0]


@pytest.mark.skipif(sys.platform != "linux", reason="peak resident set from /proc")
def test_a_stack_whose_layer_does_not_fit_the_budget_is_refused_naming_the_bytes():
    # 4 MiB activations under 8 MiB: a segment of one layer was accepted and grew 36 MiB
    # beyond the budget
    report = run_torch_in_process("cnn", options={"memory_budget": 8 * MiB}, batch=8,
                                  channels=32, size=64, depth=4)
    assert report["calls"] == [], report
    assert report["error"].startswith("MemoryBudgetError: checkpoint_sequential: "
                                      "memory_budget=8388608 bytes is below the "), report
    assert "tightest plan needs" in report["error"] and "give at least" in report["error"]


CNN = {"batch": 8, "channels": 32, "size": 64, "depth": 8}  # 4 MiB activations


@pytest.mark.skipif(sys.platform != "linux", reason="peak resident set from /proc")
def test_a_stack_of_convolutions_is_refused_below_one_layers_backward():
    # the plan charged a segment's graph at 1.5 times the bytes autograd saves: at 48 MiB it
    # kept 5 slots and segments of up to 4 layers, and the first call grew 57.8 MiB, beyond
    # 48 + 1% + 4 (a convolution's backward holds two activations of workspace beside its
    # input's gradient, and the backward's seed stays while the layers before take theirs)
    report = run_torch_in_process("cnn", options={"memory_budget": 48 * MiB}, **CNN)
    assert report["calls"] == [], report
    assert report["error"].startswith("MemoryBudgetError: checkpoint_sequential: "
                                      "memory_budget=50331648 bytes is below the 50368640 "
                                      "bytes its tightest plan needs"), report


@pytest.mark.skipif(sys.platform != "linux", reason="peak resident set from /proc")
def test_a_stack_of_convolutions_stays_within_its_budget(tmp_path):
    # the same plan as at 48 MiB (5 slots, 4-layer segments) grew 57.8 MiB under 52 MiB
    budget = 52 * MiB
    report, _ = against_plain("cnn", budget, tmp_path, **CNN)
    assert report["calls"][0] <= bound(budget), report


def test_the_first_pass_holds_no_layers_graph_after_it():
    # a layer's output saved as itself by the pass's hook held its graph in a cycle: the
    # whole stack's activations stayed alive after the pass
    import gc
    import weakref

    from asyncckpt.torch.passes import meta_pass

    layers = [torch.nn.Linear(16, 16), torch.nn.ReLU(), torch.nn.Linear(16, 16), torch.nn.ReLU()]
    outputs = []
    for layer in layers:
        layer.register_forward_hook(lambda module, args, out: outputs.append(weakref.ref(out)))
    meta_pass(layers, torch.randn(4, 16))
    gc.collect()
    assert len(outputs) == 4 and all(ref() is None for ref in outputs)


MLP = {"batch": 64, "width": 512, "depth": 40}  # 40 Linear layers of 1 MiB, 128 KiB activations


@pytest.mark.skipif(sys.platform != "linux", reason="peak resident set from /proc")
@pytest.mark.parametrize("budget_mib", [4, 8])
def test_a_stack_adds_its_parameters_gradients_into_grad_as_it_goes(tmp_path, budget_mib):
    # the backward returned every parameter's gradient at once beside .grad (40 MiB for this
    # stack) whatever the budget, where torch's checkpoint adds them in one layer at a time
    budget = budget_mib * MiB
    report, _ = against_plain("mlp", budget, tmp_path, **MLP)
    assert report["calls"][0] <= bound(budget), report
