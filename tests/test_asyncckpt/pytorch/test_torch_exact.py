"""The torch adapters are exact or raise: steps that draw random numbers, parameters reached
through helpers, modules that update buffers, autocast. Each gradient, buffer and the random
generator's state after forward+backward equal plain autograd's bit for bit, with the same
seed."""
from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")

from asyncckpt.errors import InvalidValueError  # noqa: E402
from asyncckpt.torch import checkpoint_scan, checkpoint_sequential  # noqa: E402
from asyncckpt.torch.preserve import UnlistedLeafError  # noqa: E402


def scan_plain(step, carry, xs, n):
    ys = []
    for t in range(n):
        carry, y = step(carry, None if xs is None else xs[t])
        ys.append(y)
    return carry, (torch.stack(ys) if ys[0] is not None else None)


def run(loss_of, tensors, modules=(), seed=0):
    """Gradients of ``tensors``, the modules' buffers and the generator's state after one
    forward+backward from ``seed``."""
    for t in tensors:
        t.grad = None
    torch.manual_seed(seed)
    loss_of().backward()
    grads = [None if t.grad is None else t.grad.clone() for t in tensors]
    buffers = [b.clone() for m in modules for b in m.buffers()]
    return grads, buffers, torch.get_rng_state()


def assert_same(ours, reference) -> None:
    (grads, buffers, rng), (ref_grads, ref_buffers, ref_rng) = ours, reference
    for a, b in zip(grads, ref_grads):
        assert b is not None and a is not None, "a gradient is missing"
        assert a.dtype == b.dtype and a.numpy().tobytes() == b.numpy().tobytes()
    for a, b in zip(buffers, ref_buffers):
        assert a.numpy().tobytes() == b.numpy().tobytes()
    assert torch.equal(rng, ref_rng), "the caller's generator is not where autograd leaves it"


def exact_scan(step, carry, xs, n, tensors, modules=(), **options):
    def loss_of(scan):
        def go():
            if scan:
                final, ys = checkpoint_scan(step, carry, xs, n_steps=None if xs is not None
                                            else n, **options)
            else:
                final, ys = scan_plain(step, carry, xs, n)
            final = final if isinstance(final, torch.Tensor) else final[0]
            return (final ** 2).sum() + (ys * torch.linspace(0.5, 1.5, n)[:, None]).sum()
        return go
    # ours first: a reference run first would leave buffers the scan starts from changed
    state = [b.clone() for m in modules for b in m.buffers()]
    ours = run(loss_of(True), tensors, modules)
    with torch.no_grad():
        for b, saved in zip([b for m in modules for b in m.buffers()], state):
            b.copy_(saved)
    reference = run(loss_of(False), tensors, modules)
    assert_same(ours, reference)


@pytest.mark.parametrize("cell_type", ["LSTMCell", "GRUCell"])
@pytest.mark.parametrize("options", [{"l1_slots": 2, "interval": 3}, {"segments": 1},
                                     {"memory_budget": "64KiB"}])
def test_dropout_in_a_recurrent_step_recomputes_the_same_mask(cell_type, options):
    torch.manual_seed(1)
    n, batch, hidden = 40, 3, 8
    cell = getattr(torch.nn, cell_type)(hidden, hidden)
    drop = torch.nn.Dropout(0.5)
    xs = torch.randn(n, batch, hidden, requires_grad=True)

    def step(carry, x):
        if cell_type == "LSTMCell":
            h, c = cell(drop(x), carry)
            return (h, c), drop(h).sum(-1)
        h = cell(drop(x), carry[0])
        return (h,), drop(h).sum(-1)

    carry = ((torch.zeros(batch, hidden),) * (2 if cell_type == "LSTMCell" else 1))
    exact_scan(step, carry, xs, n, [xs, *cell.parameters()], **options)


def test_a_step_drawing_noise_itself_an_sde():
    torch.manual_seed(2)
    n, dt = 60, 0.05
    drift = torch.nn.Linear(4, 4)
    sigma = torch.tensor(0.3, requires_grad=True)

    def step(x, _):  # Euler-Maruyama
        x = x + torch.tanh(drift(x)) * dt + sigma * dt ** 0.5 * torch.randn_like(x)
        return x, x.sum(-1)

    exact_scan(step, torch.ones(2, 4), None, n, [sigma, *drift.parameters()],
               l1_slots=2, interval=4)


def test_a_step_that_draws_only_after_step_0_reruns_with_the_generators_in_the_carry():
    torch.manual_seed(3)
    n = 30
    w = torch.randn(4, 4, requires_grad=True)
    xs = torch.arange(n, dtype=torch.float32)[:, None].expand(n, 4).contiguous()

    def step(h, x):
        h = torch.tanh(h @ w)
        if x[0] > 0:
            h = torch.nn.functional.dropout(h, 0.3)
        return h, h.sum(-1)

    exact_scan(step, torch.ones(2, 4), xs, n, [w], l1_slots=2, interval=3)


def test_a_parameter_reached_through_two_helpers_gets_its_gradient():
    torch.manual_seed(4)
    lin = torch.nn.Linear(5, 5)

    def f(h):
        return lin(h)

    def g(h):
        return torch.tanh(f(h))

    def step(h, x):
        h = g(h + x)
        return h, h.sum(-1)

    xs = torch.randn(20, 2, 5)
    exact_scan(step, torch.zeros(2, 5), xs, 20, list(lin.parameters()), segments=4)


def test_a_parameter_left_out_of_params_is_named():
    lin, other = torch.nn.Linear(3, 3), torch.nn.Linear(3, 3)

    def step(h, x):
        h = other(lin(h))
        return h, None

    with pytest.raises(UnlistedLeafError, match=r"Linear\.weight .*requires grad.*params="):
        checkpoint_scan(step, torch.ones(1, 3), n_steps=5, params=list(lin.parameters()))


def test_a_parameter_first_reached_after_step_0_is_an_error_not_a_missing_gradient():
    a, b = torch.nn.Linear(3, 3), torch.nn.Linear(3, 3)
    xs = torch.arange(8.0)

    def step(h, x):
        h = (a if x < 4 else b)(h)
        return h, None

    h, _ = checkpoint_scan(step, torch.ones(1, 3), xs, segments=4)
    with pytest.raises(UnlistedLeafError, match=r"steps 6 to 7 reach Linear\.(weight|bias)"):
        h.sum().backward()


def test_batchnorm_running_statistics_end_as_autograds_in_a_scan():
    torch.manual_seed(5)
    norm, lin = torch.nn.BatchNorm1d(6), torch.nn.Linear(6, 6)
    xs = torch.randn(24, 4, 6)

    def step(h, x):
        h = torch.tanh(norm(lin(h) + x))
        return h, h.sum(-1)

    exact_scan(step, torch.zeros(4, 6), xs, 24, [*lin.parameters(), *norm.parameters()],
               [norm], l1_slots=2, interval=3)


def test_a_module_whose_outputs_read_a_buffer_it_changes_is_refused_by_name():
    class Counter(torch.nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.register_buffer("calls", torch.zeros(()))

        def forward(self, h):
            self.calls += 1
            return h * self.calls

    counter = Counter()
    w = torch.ones(3, requires_grad=True)
    with pytest.raises(InvalidValueError, match=r"module Counter .*buffer 'calls'"):
        checkpoint_scan(lambda h, x: (counter(h * w), None), torch.ones(3), n_steps=4)
    assert counter.calls.item() == 0  # step 0's probe put it back
    layers = [torch.nn.Linear(3, 3), Counter()]
    with pytest.raises(InvalidValueError, match=r"module Counter .*buffer 'calls'"):
        checkpoint_sequential(layers, torch.ones(2, 3))


def test_autocast_of_the_forward_holds_in_the_recomputation():
    # (with autocast's cache, plain autograd sums a cast weight's gradient over every step
    # in bfloat16, a segment's backward over its steps: the sums round differently)
    torch.manual_seed(6)
    lin = torch.nn.Linear(8, 8)
    xs = torch.randn(12, 2, 8)

    def step(h, x):
        h = torch.tanh(lin(h + x)).float()
        return h, h.sum(-1)

    def loss_of(scan):
        def go():
            with torch.autocast("cpu", dtype=torch.bfloat16, cache_enabled=False):
                h, ys = (checkpoint_scan(step, torch.zeros(2, 8), xs, l1_slots=2, interval=3)
                         if scan else scan_plain(step, torch.zeros(2, 8), xs, 12))
            return h.sum() + ys.sum()  # backward outside the autocast region
        return go

    assert_same(run(loss_of(True), list(lin.parameters())),
                run(loss_of(False), list(lin.parameters())))


def test_the_caller_generator_and_grad_mode_are_left_as_they_were_without_a_backward():
    torch.manual_seed(7)
    drop = torch.nn.Dropout(0.5)
    w = torch.ones(4, requires_grad=True)
    step = lambda h, x: (drop(h * w), None)  # noqa: E731
    torch.manual_seed(7)
    scan_plain(step, torch.ones(4), None, 10)
    expected = torch.get_rng_state()
    torch.manual_seed(7)
    with torch.no_grad():
        checkpoint_scan(step, torch.ones(4), n_steps=10, l1_slots=2)
    assert torch.is_grad_enabled()
    assert torch.equal(torch.get_rng_state(), expected)


def sequential_exact(layers, x, modules=(), **options):
    tensors = [p for layer in layers if isinstance(layer, torch.nn.Module)
               for p in layer.parameters()] + [x]
    state = [b.clone() for m in modules for b in m.buffers()]
    ours = run(lambda: checkpoint_sequential(layers, x, **options).square().sum(), tensors,
               modules)
    with torch.no_grad():
        for b, saved in zip([b for m in modules for b in m.buffers()], state):
            b.copy_(saved)

    def plain():
        y = x
        for layer in layers:
            y = layer(y)
        return y.square().sum()

    assert_same(ours, run(plain, tensors, modules))


@pytest.mark.parametrize("segments", [None, 1, 10, 120])
def test_sequential_linear_tanh_dropout_times_40(segments):
    torch.manual_seed(8)
    layers = [layer for _ in range(40) for layer in
              (torch.nn.Linear(6, 6), torch.nn.Tanh(), torch.nn.Dropout(0.2))]
    sequential_exact(layers, torch.randn(3, 6, requires_grad=True), segments=segments,
                     l1_slots=2, interval=2)


def test_sequential_with_a_late_dropout_and_a_noise_callable():
    torch.manual_seed(9)
    layers = [torch.nn.Linear(5, 5), torch.nn.Tanh(), torch.nn.Linear(5, 5),
              lambda y: y + 0.1 * torch.randn_like(y), torch.nn.Linear(5, 5)]
    sequential_exact(layers, torch.randn(2, 5, requires_grad=True), segments=5, l1_slots=1,
                     interval=2)


@pytest.mark.parametrize("segments", [None, 3, 12])
def test_sequential_batchnorm_in_training_mode_keeps_autograds_statistics(segments):
    torch.manual_seed(10)
    norms = [torch.nn.BatchNorm1d(6) for _ in range(4)]
    layers = [layer for norm in norms for layer in (torch.nn.Linear(6, 6), norm,
                                                    torch.nn.Tanh())]
    sequential_exact(layers, torch.randn(5, 6, requires_grad=True), norms, segments=segments,
                     l1_slots=1, interval=2)


def test_sequential_callable_reaching_a_module_through_a_helper():
    torch.manual_seed(11)
    lin = torch.nn.Linear(4, 4)

    def f(y):
        return lin(y)

    layers = [torch.nn.Linear(4, 4), lambda y: torch.tanh(f(y)), torch.nn.Linear(4, 4)]
    x = torch.randn(2, 4, requires_grad=True)
    grads, _, _ = run(lambda: checkpoint_sequential(layers, x, segments=3).sum(),
                      [*lin.parameters()])
    reference, _, _ = run(lambda: layers[2](layers[1](layers[0](x))).sum(), [*lin.parameters()])
    assert all(a is not None and torch.equal(a, b) for a, b in zip(grads, reference))
