"""``checkpoint_scan`` and ``checkpoint_sequential`` on CUDA tensors: Level-1 in device memory,
Level-2 in pinned host memory, gradients bit for bit plain autograd's under deterministic
algorithms. Skipped unless torch and CuPy both see a CUDA device (scripts/gpu_check.sh runs
them on a lent GPU)."""
from __future__ import annotations

import gc
import os

import pytest

torch = pytest.importorskip("torch")
cupy = pytest.importorskip("cupy")

from asyncckpt.torch import checkpoint_scan, checkpoint_sequential  # noqa: E402

pytestmark = pytest.mark.skipif(not torch.cuda.is_available(),
                                reason="torch sees no CUDA device")


@pytest.fixture(autouse=True)
def deterministic():
    """cuBLAS and torch's kernels in their deterministic forms, for bitwise comparisons."""
    os.environ.setdefault("CUBLAS_WORKSPACE_CONFIG", ":4096:8")
    before = torch.are_deterministic_algorithms_enabled()
    torch.use_deterministic_algorithms(True)
    yield
    torch.use_deterministic_algorithms(before)


def language_model(n: int, hidden: int = 256, batch: int = 8, vocab: int = 50):
    torch.manual_seed(0)
    cell = torch.nn.LSTMCell(hidden, hidden).cuda()
    embed = torch.nn.Embedding(vocab, hidden).cuda()
    head = torch.nn.Linear(hidden, vocab).cuda()
    tokens = torch.randint(0, vocab, (n + 1, batch), device="cuda")
    params = [*cell.parameters(), *embed.parameters(), *head.parameters()]

    def step(carry, x):
        h, c = cell(embed(x[0]), carry)
        return (h, c), torch.nn.functional.cross_entropy(head(h), x[1])

    def carry():
        return (torch.zeros(batch, hidden, device="cuda"),
                torch.zeros(batch, hidden, device="cuda"))

    return step, carry, (tokens[:-1], tokens[1:]), params


def plain_gradients(step, carry, xs, params):
    for p in params:
        p.grad = None
    losses = []
    for t in range(len(xs[0])):
        carry, loss = step(carry, (xs[0][t], xs[1][t]))
        losses.append(loss)
    torch.stack(losses).sum().backward()
    return [p.grad.clone() for p in params]


def scan_gradients(step, carry, xs, params, **options):
    for p in params:
        p.grad = None
    _, losses = checkpoint_scan(step, carry, xs, params=params, **options)
    losses.sum().backward()
    return [p.grad.clone() for p in params]


@pytest.mark.parametrize("options", [
    {"memory_budget": "4MiB"},
    {"memory_budget": "4MiB", "interval": 1},
    {"segments": 40, "l1_slots": 3, "interval": 5},
    {"segments": 1},
])
def test_scan_on_cuda_is_plain_autograd_bit_for_bit(options):
    step, carry, xs, params = language_model(200)
    reference = plain_gradients(step, carry(), xs, params)
    ours = scan_gradients(step, carry(), xs, params, **options)
    assert all(a.device.type == "cuda" for a in ours)
    assert all(torch.equal(a, b) for a, b in zip(ours, reference))


def test_scan_on_cuda_holds_device_memory_flat_in_n():
    """The device's peak for the gradient is the same at n and 4n, the outputs aside, once a
    segment's graph reaches its share of the budget (sqrt(n) segments at least below it)."""
    seen = []
    for n in (500, 2000, 8000):  # the first, unmeasured: cuBLAS's and the pools' first blocks
        step, carry, xs, params = language_model(n)
        pool = cupy.get_default_memory_pool()
        gc.collect()  # an earlier run's cycles, freed mid-run, would lower the peak's base
        pool.free_all_blocks()
        torch.cuda.synchronize()
        torch.cuda.reset_peak_memory_stats()
        before = torch.cuda.memory_allocated()
        _, losses = checkpoint_scan(step, carry(), xs, params=params, memory_budget="1MiB")
        run = losses.grad_fn.run
        losses.sum().backward()
        torch.cuda.synchronize()
        stats = run.checkpointer.stats
        seen.append({"n": n, "torch_peak": torch.cuda.max_memory_allocated() - before,
                     "cupy_pool": pool.total_bytes(), "segments": len(run.starts) - 1,
                     "interval": stats.interval, "l1_slots": stats.l1_slots,
                     "device_bytes": stats.device_bytes})
    peaks = [s["torch_peak"] + s["cupy_pool"] for s in seen[1:]]
    outputs = 6000 * 4 * 3  # 6000 more steps: the stacked losses, their gradient, a copy
    assert peaks[1] <= peaks[0] + outputs + 2**18, seen


def test_sequential_on_cuda_is_plain_autograd_bit_for_bit():
    torch.manual_seed(0)
    layers = []
    for i in range(12):
        wide, narrow = (64, 256) if i % 2 == 0 else (256, 64)
        layers += [torch.nn.Linear(wide, narrow), torch.nn.Tanh()]
    net = torch.nn.Sequential(*layers).cuda()
    x = torch.randn(16, 64, device="cuda", requires_grad=True)
    net(x).square().sum().backward()
    reference = [p.grad.clone() for p in (*net.parameters(), x)]
    for p in (*net.parameters(), x):
        p.grad = None
    checkpoint_sequential(net, x, memory_budget="1MiB").square().sum().backward()
    ours = [p.grad for p in (*net.parameters(), x)]
    assert all(torch.equal(a, b) for a, b in zip(ours, reference))


def test_a_step_failing_on_cuda_in_the_reverse_reaches_the_caller():
    step, carry, xs, params = language_model(50)
    calls = {"n": 0}

    def failing(c, x):
        calls["n"] += 1
        if calls["n"] > 60:  # in the reverse sweep's recomputation
            raise RuntimeError("step failed on the device")
        return step(c, x)

    _, losses = checkpoint_scan(failing, carry(), xs, params=params, memory_budget="1MiB")
    with pytest.raises(RuntimeError, match="step failed on the device"):
        losses.sum().backward()
