"""The torch adapters are exact or raise: steps that draw random numbers, parameters reached
through helpers, modules that update buffers, autocast. Each gradient, buffer and the random
generator's state after forward+backward equal plain autograd's bit for bit, with the same
seed."""
from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")

from asyncckpt.errors import InvalidValueError, UsageError  # noqa: E402
from asyncckpt.torch import checkpoint_scan, checkpoint_sequential  # noqa: E402
from asyncckpt.torch.preserve import UnlistedLeafError  # noqa: E402
from test_torch import scan_plain  # noqa: E402


def sequential_plain(layers, x):
    """The reference of a stack: its layers under plain autograd, and the loss."""
    y = x
    for layer in layers:
        y = layer(y)
    return y.square().sum()


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
    assert_same(ours, run(lambda: sequential_plain(layers, x), tensors, modules))


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


def test_a_second_derivative_through_the_adapters_is_refused_by_name():
    torch.manual_seed(12)
    lin = torch.nn.Linear(4, 4).double()
    xs = torch.randn(8, 2, 4, dtype=torch.float64)

    def step(h, x):
        return torch.tanh(lin(h) + x), None

    h, _ = checkpoint_scan(step, torch.ones(2, 4, dtype=torch.float64), xs, segments=2)
    cube = lin.weight.pow(3).sum()  # a part outside, whose second derivative autograd has
    (g,) = torch.autograd.grad(h.pow(2).sum() + cube, [lin.weight], create_graph=True)
    with pytest.raises(UsageError, match=r"checkpoint_scan computes first derivatives only"):
        g.pow(2).sum().backward()
    # the first derivative is autograd's, create_graph or not
    h, _ = checkpoint_scan(step, torch.ones(2, 4, dtype=torch.float64), xs, segments=2)
    (g,) = torch.autograd.grad(h.pow(2).sum(), [lin.weight], create_graph=True)
    y = torch.ones(2, 4, dtype=torch.float64)
    for t in range(8):
        y, _ = step(y, xs[t])
    (reference,) = torch.autograd.grad(y.pow(2).sum(), [lin.weight])
    assert torch.equal(g.detach(), reference)
    # where only parameters carry the second derivative: the seed needs no gradient
    layers = [torch.nn.Linear(4, 4).double(), torch.nn.Tanh(), torch.nn.Linear(4, 4).double()]
    out = checkpoint_sequential(layers, torch.randn(2, 4, dtype=torch.float64), segments=2)
    (g,) = torch.autograd.grad(out.sum(), [layers[0].weight], create_graph=True)
    with pytest.raises(UsageError, match=r"checkpoint_sequential computes first derivatives"):
        g.pow(2).sum().backward()


def between(forward, change, backward):
    """``backward(forward())`` with ``change()`` between, the loss's gradients returned."""
    loss = forward()
    change()
    return backward(loss)


@pytest.mark.parametrize("layer", ["dropout", "batchnorm"])
def test_modules_switched_to_eval_before_the_backward_recompute_as_the_forward_ran(layer):
    def model():
        torch.manual_seed(13)
        lin = torch.nn.Linear(5, 5)
        return torch.nn.Sequential(lin, torch.nn.Dropout(0.3) if layer == "dropout"
                                   else torch.nn.BatchNorm1d(5))

    def outcome(scan, stack):
        m = model()
        xs = torch.randn(12, 4, 5)
        step = lambda h, x: (torch.tanh(m(h) + x), None)  # noqa: E731
        torch.manual_seed(14)

        def forward():
            if stack:
                layers = [m, torch.nn.Tanh(), m, torch.nn.Tanh(), m]
                if scan:
                    return checkpoint_sequential(layers, xs[0], segments=5).square().sum()
                y = xs[0]
                for f in layers:
                    y = f(y)
                return y.square().sum()
            h = torch.ones(4, 5)
            if scan:
                h, _ = checkpoint_scan(step, h, xs, segments=4)
            else:
                for t in range(12):
                    h, _ = step(h, xs[t])
            return h.square().sum()

        def backward(loss):
            loss.backward()
            assert not any(module.training for module in m.modules())  # the caller's modes
            return [p.grad for p in m.parameters()] + list(m.buffers())

        return between(forward, m.eval, backward)

    for stack in (False, True):
        ours, reference = outcome(True, stack), outcome(False, stack)
        assert all(torch.equal(a, b) for a, b in zip(ours, reference))


def test_complex_carries_and_layers_get_autograds_gradients():
    def weights():
        torch.manual_seed(15)
        return torch.randn(5, 5, dtype=torch.complex128, requires_grad=True)

    xs = torch.randn(10, 5, dtype=torch.complex128)

    def gradient(scan, through_carry):
        w = weights()
        step = lambda h, x: (torch.tanh(h @ w * 0.3 + x), (h.abs() ** 2).sum())  # noqa: E731
        h = torch.ones(5, dtype=torch.complex128)
        if scan:
            h, ys = checkpoint_scan(step, h, xs, segments=5)
        else:
            steps = []
            for t in range(10):
                h, y = step(h, xs[t])
                steps.append(y)
            ys = torch.stack(steps)
        ((h.abs() ** 2).sum() if through_carry else ys.sum()).backward()
        return w.grad

    for through_carry in (False, True):
        assert torch.equal(gradient(True, through_carry), gradient(False, through_carry))

    def stack_gradients(checkpointed):
        torch.manual_seed(16)
        layers = [torch.nn.Linear(4, 4, dtype=torch.complex128) for _ in range(4)]
        x = torch.randn(3, 4, dtype=torch.complex128, requires_grad=True)
        y = checkpoint_sequential(layers, x, segments=2) if checkpointed else \
            layers[3](layers[2](layers[1](layers[0](x))))
        (y.abs() ** 2).sum().backward()
        return [x.grad, *(p.grad for layer in layers for p in layer.parameters())]

    assert all(torch.equal(a, b) for a, b in zip(stack_gradients(True), stack_gradients(False)))


def test_a_parameter_or_xs_modified_in_place_before_the_backward_is_named():
    lin = torch.nn.Linear(3, 3)
    xs = torch.randn(6, 2, 3)
    step = lambda h, x: (torch.tanh(lin(h) * x), None)  # noqa: E731
    h, _ = checkpoint_scan(step, torch.ones(2, 3), xs, segments=3)
    with torch.no_grad():
        lin.weight.mul_(2)
    with pytest.raises(UsageError, match=r"checkpoint_scan: Linear\.weight .*modified in place"):
        h.sum().backward()
    h, _ = checkpoint_scan(step, torch.ones(2, 3), xs, segments=3)
    xs.mul_(2)
    with pytest.raises(UsageError, match=r"checkpoint_scan: xs leaf 0 was modified in place"):
        h.sum().backward()
    out = checkpoint_sequential([lin, torch.nn.Tanh(), lin], torch.ones(2, 3), segments=2)
    with torch.no_grad():
        lin.bias.add_(1)
    with pytest.raises(UsageError, match=r"checkpoint_sequential: Linear\.bias .*in place"):
        out.sum().backward()


def test_a_bfloat16_carry():
    def gradients(scan):
        torch.manual_seed(17)
        lin = torch.nn.Linear(5, 5).bfloat16()
        xs = torch.randn(6, 3, 5, dtype=torch.bfloat16)
        step = lambda h, x: (torch.tanh(lin(h) + x), None)  # noqa: E731
        h = torch.ones(3, 5, dtype=torch.bfloat16)
        if scan:
            h, _ = checkpoint_scan(step, h, xs, segments=3)
        else:
            for t in range(6):
                h, _ = step(h, xs[t])
        h.float().sum().backward()
        return [p.grad for p in lin.parameters()]

    assert all(torch.equal(a, b) for a, b in zip(gradients(True), gradients(False)))


def test_a_tensor_computed_outside_the_steps_goes_in_params():
    def gradients(params):
        torch.manual_seed(18)
        a = torch.randn(5, 2, dtype=torch.float64, requires_grad=True)
        b = torch.randn(2, 5, dtype=torch.float64, requires_grad=True)
        w = a @ b
        xs = torch.randn(10, 3, 5, dtype=torch.float64)
        step = lambda h, x: (torch.tanh(h @ w + x), None)  # noqa: E731
        h = torch.ones(3, 5, dtype=torch.float64)
        if params is None:
            for t in range(10):
                h, _ = step(h, xs[t])
        else:
            h, _ = checkpoint_scan(step, h, xs, segments=5, params=[w] if params else None)
        h.sum().backward()
        return a.grad, b.grad

    with pytest.raises(InvalidValueError, match=r"computed outside the steps.*MmBackward0"
                                                r".*pass that tensor in params="):
        gradients(False)
    assert all(torch.equal(x, y) for x, y in zip(gradients(True), gradients(None)))
