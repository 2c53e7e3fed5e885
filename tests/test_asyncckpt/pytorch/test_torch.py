"""asyncckpt.torch.checkpoint_scan: gradients bit for bit those of plain autograd through the
same steps, with carries through Level-2 and Revolve, and clear errors for bad input."""
from __future__ import annotations

import numpy as np
import pytest

torch = pytest.importorskip("torch")

from asyncckpt.storage import HostMemoryStorage  # noqa: E402
from asyncckpt.torch import (  # noqa: E402
    checkpoint_scan, checkpoint_sequential, closed_over_parameters)


class CountingStorage(HostMemoryStorage):
    """DRAM Level-2 that counts the states written to it."""

    def __init__(self) -> None:
        super().__init__()
        self.puts = 0

    def put(self, key: int, buf: np.ndarray) -> None:
        self.puts += 1
        super().put(key, buf)


def scan_plain(step, carry, xs, n):
    """The reference: the same steps under plain autograd, every graph kept."""
    ys = []
    for t in range(n):
        carry, y = step(carry, None if xs is None else xs[t])
        ys.append(y)
    return carry, (torch.stack(ys) if ys[0] is not None else None)


def gradients(loss_of, tensors):
    for t in tensors:
        t.grad = None
    loss = loss_of()
    loss.backward()
    return loss.detach(), [t.grad.clone() for t in tensors]


def assert_bitwise(ours, reference) -> None:
    for a, b in zip(ours, reference):
        assert a.dtype == b.dtype and a.shape == b.shape
        assert a.numpy().tobytes() == b.numpy().tobytes()


@pytest.mark.parametrize("n", [1, 7, 150])
def test_lstm_language_model_gradients_are_autograds_bit_for_bit(n):
    torch.manual_seed(0)
    batch, hidden, vocab = 3, 16, 20
    cell, embed = torch.nn.LSTMCell(hidden, hidden), torch.nn.Embedding(vocab, hidden)
    head = torch.nn.Linear(hidden, vocab)
    tokens = torch.randint(0, vocab, (n, batch))
    params = [*cell.parameters(), *embed.parameters(), *head.parameters()]
    storage = CountingStorage()

    def step(carry, x):
        h, c = cell(x, carry)
        return (h, c), h

    def loss_of(scan):
        def run():
            carry = (torch.zeros(batch, hidden), torch.zeros(batch, hidden))
            if scan:  # room for 4 carries: the rest go through Level-2 and Revolve
                _, hs = checkpoint_scan(step, carry, embed(tokens), l1_slots=2,
                                        interval=min(3, n), storage=storage)
            else:
                _, hs = scan_plain(step, carry, embed(tokens), n)
            logits = head(hs).reshape(-1, vocab)
            return torch.nn.functional.cross_entropy(logits, tokens.roll(-1, 0).reshape(-1))
        return run

    loss, reference = gradients(loss_of(False), params)
    scanned_loss, ours = gradients(loss_of(True), params)
    assert torch.equal(loss, scanned_loss)
    assert_bitwise(ours, reference)
    if n > 3:  # (with one step from h = 0, the recurrent weights get no gradient)
        assert all(g.abs().max() > 0 for g in ours)
        assert storage.puts > 0


def test_initial_carry_xs_and_a_module_step_get_their_gradients():
    torch.manual_seed(1)
    n, width = 40, 8

    class Cell(torch.nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.w = torch.nn.Parameter(torch.randn(width, width) / width)
            self.u = torch.nn.Parameter(torch.randn(width, width) / width)

        def forward(self, h, x):
            h = torch.tanh(h @ self.w + x @ self.u)
            return h, h.sum(dim=-1)

    cell = Cell()
    h0 = torch.randn(2, width, requires_grad=True)
    xs = torch.randn(n, 2, width, requires_grad=True)
    tensors = [h0, xs, cell.w, cell.u]

    def loss_of(scan):
        def run():
            h, ys = (checkpoint_scan(cell, h0, xs, l1_slots=3, interval=5) if scan
                     else scan_plain(cell, h0, xs, n))
            return (h ** 2).sum() + (ys * torch.linspace(0, 1, n)[:, None]).sum()
        return run

    _, reference = gradients(loss_of(False), tensors)
    _, ours = gradients(loss_of(True), tensors)
    assert_bitwise(ours, reference)
    assert closed_over_parameters(cell) == [cell.w, cell.u]


def test_a_dict_carry_of_mixed_dtypes_and_no_xs():
    w = torch.tensor(0.9, requires_grad=True)

    def step(carry, x):
        assert x is None
        return {"v": carry["v"] * w + 1.0, "t": carry["t"] + 1}, None

    carry = {"v": torch.ones(5), "t": torch.zeros((), dtype=torch.int64)}
    final, ys = checkpoint_scan(step, carry, n_steps=30, l1_slots=2, interval=4)
    assert ys is None and int(final["t"]) == 30
    final["v"].sum().backward()
    ours = w.grad.clone()
    w.grad = None
    reference, _ = scan_plain(step, carry, None, 30)
    reference["v"].sum().backward()
    assert ours.numpy().tobytes() == w.grad.numpy().tobytes()


def step_tanh(h, x):
    return torch.tanh(h + x), h


@pytest.mark.parametrize("call, error, match", [
    (lambda: checkpoint_scan(step_tanh, [torch.zeros(2), 3.0], torch.zeros(4, 2)),
     TypeError, "carry leaf 1 is a float"),
    (lambda: checkpoint_scan(step_tanh, torch.zeros(2), (torch.zeros(4, 2), torch.zeros(5, 2))),
     ValueError, "share their first dimension"),
    (lambda: checkpoint_scan(step_tanh, torch.zeros(2)), ValueError, "n >= 1 steps"),
    (lambda: checkpoint_scan(step_tanh, torch.zeros(2), torch.zeros(4, 2), n_steps=5),
     ValueError, "n_steps=5 but xs hold 4"),
    (lambda: checkpoint_scan(lambda h, x: torch.cat([h, x]), torch.zeros(2), torch.zeros(4, 2)),
     TypeError, "step 0 returned a Tensor, expected a pair"),
    (lambda: checkpoint_scan(lambda h, x: (torch.cat([h, x]) if h.numel() < 4 else h, h),
                             torch.zeros(2), torch.zeros(4, 2)),
     ValueError, r"step 0 returned carry leaf 0 of shape \(4,\)"),
    (lambda: checkpoint_scan(lambda h, x: ((h, h), h), torch.zeros(2), torch.zeros(4, 2)),
     ValueError, "step 0 returned a carry of structure"),
    (lambda: checkpoint_scan(lambda h, x: (h.double(), h), torch.zeros(2), torch.zeros(4, 2)),
     ValueError, "torch.float64"),
])
def test_bad_input_is_named(call, error, match):
    with pytest.raises(error, match=match):
        call()


def test_backward_twice_is_autograds_error_not_a_hang():
    w = torch.tensor(0.5, requires_grad=True)
    h, _ = checkpoint_scan(lambda h, x: (h * w + x, None), torch.ones(3), torch.ones(20, 3),
                           l1_slots=2, interval=4)
    loss = h.sum()
    loss.backward(retain_graph=True)
    with pytest.raises(RuntimeError, match="second time"):
        loss.backward()


def test_a_step_failing_in_the_reverse_sweep_reaches_the_caller():
    w = torch.tensor(0.5, requires_grad=True)
    calls = []

    def step(h, x):
        calls.append(torch.is_grad_enabled())
        if torch.is_grad_enabled() and len(calls) > 30:
            raise FloatingPointError("step blew up")
        return h * w + x, None

    h, _ = checkpoint_scan(step, torch.ones(3), torch.ones(20, 3), l1_slots=2, interval=4)
    with pytest.raises(FloatingPointError, match="blew up"):
        h.sum().backward()
    # the autouse leak check of conftest.py: no asyncckpt thread is left


def test_without_gradients_it_is_a_plain_scan_and_lets_go_at_once():
    w = torch.tensor(0.5, requires_grad=True)
    step = (lambda h, x: (h * w + x, h.sum()))
    reference, ys_reference = scan_plain(step, torch.ones(3), torch.ones(12, 3), 12)
    with torch.no_grad():
        h, ys = checkpoint_scan(step, torch.ones(3), torch.ones(12, 3), l1_slots=2, interval=4,
                                storage=None)
    assert torch.equal(h, reference.detach()) and torch.equal(ys, ys_reference.detach())
    assert not h.requires_grad
    # the autouse leak check of conftest.py: the checkpointer closed without a backward


def test_carries_through_a_disk_level2(tmp_path):
    w = torch.tensor(0.7, requires_grad=True)

    def step(h, x):
        return torch.sin(h * w + x), None

    xs = torch.linspace(0, 1, 50)[:, None].repeat(1, 64)
    h, _ = checkpoint_scan(step, torch.zeros(64), xs, l1_slots=2, interval=5,
                           storage=str(tmp_path))
    h.sum().backward()
    ours = w.grad.clone()
    w.grad = None
    reference, _ = scan_plain(step, torch.zeros(64), xs, 50)
    reference.sum().backward()
    assert ours.numpy().tobytes() == w.grad.numpy().tobytes()
    assert list(tmp_path.iterdir()) == []  # the Level-2 files went with the checkpointer


# -- checkpoint_sequential: layers whose activations differ in size


def sequential_gradients(run, tensors):
    for t in tensors:
        t.grad = None
    run().square().sum().backward()
    return [t.grad.clone() for t in tensors]


@pytest.mark.parametrize("slots, interval", [(2, 3), (1, 1), (3, "auto")])
def test_sequential_layers_of_different_widths_get_autograds_gradients(slots, interval):
    from asyncckpt.torch import checkpoint_sequential

    torch.manual_seed(2)
    shared = torch.nn.Linear(64, 64)  # used twice: its gradient sums two layers' parts
    net = torch.nn.Sequential(
        torch.nn.Conv1d(1, 4, 5), torch.nn.Tanh(), torch.nn.Flatten(),  # a view of its input
        torch.nn.Linear(4 * 60, 64), shared, torch.nn.ReLU(), shared, torch.nn.Linear(64, 8))
    x = torch.randn(6, 1, 64, requires_grad=True)
    tensors = [x, *net.parameters()]
    reference = sequential_gradients(lambda: net(x), tensors)
    ours = sequential_gradients(
        lambda: checkpoint_sequential(net, x, l1_slots=slots, interval=interval), tensors)
    assert_bitwise(ours, reference)


def test_sequential_of_callables_and_an_input_without_grad():
    from asyncckpt.torch import checkpoint_sequential

    w = torch.randn(10, 30, requires_grad=True)
    layers = [lambda h: h @ w, torch.tanh, lambda h: h[:, :7] * 2.0]
    x = torch.randn(4, 10)
    out = checkpoint_sequential(layers, x, l1_slots=1, interval=1)
    out.sum().backward()
    ours = w.grad.clone()
    w.grad = None
    reference = x
    for layer in layers:
        reference = layer(reference)
    reference.sum().backward()
    assert torch.equal(out.detach(), reference.detach())
    assert ours.numpy().tobytes() == w.grad.numpy().tobytes()


def test_sequential_bad_input_and_backward_twice():
    from asyncckpt.torch import checkpoint_sequential

    with pytest.raises(ValueError, match="at least one layer"):
        checkpoint_sequential([], torch.zeros(3))
    with pytest.raises(TypeError, match="input must be a tensor"):
        checkpoint_sequential([torch.tanh], [0.0])
    with pytest.raises(TypeError, match="layer 1 returned a tuple"):
        checkpoint_sequential([torch.tanh, lambda h: (h, h)], torch.zeros(3))
    lin = torch.nn.Linear(3, 3)
    out = checkpoint_sequential([lin, torch.tanh, lin], torch.ones(2, 3), l1_slots=1,
                                interval=1)
    out.sum().backward(retain_graph=True)
    with pytest.raises(RuntimeError, match="checkpoint_sequential a second time"):
        out.sum().backward()


# -- checkpoint_sequential's segments: a step is a run of layers, back-propagated in one call


def test_segments_split_the_layers_as_asked_or_by_the_bytes_their_graphs_keep():
    from asyncckpt.torch.segments import segment_starts

    assert segment_starts([5] * 10, 3, None) == [0, 3, 6, 10]  # torch's even split
    assert segment_starts([5] * 10, 20, None) == list(range(11))  # a layer a segment at most
    # at most 12 bytes of graph a segment; a layer keeping more is a segment alone
    assert segment_starts([4, 4, 4, 4, 30, 4], None, 12) == [0, 3, 4, 5, 6]
    # without a budget, sqrt(layers) segments of equal graphs
    assert segment_starts([1] * 100, None, None) == list(range(0, 101, 10))
    for bad in (0, -1, 2.0, True):
        with pytest.raises(ValueError, match="segments must be a positive int or None"):
            segment_starts([1, 1], bad, None)


def test_the_meta_pass_counts_what_each_layer_keeps_for_its_backward():
    from asyncckpt.torch.sequential import meta_pass

    layers = [torch.nn.Linear(8, 16), torch.nn.Tanh(), torch.nn.Linear(16, 2)]
    shapes, graph, _, ends = meta_pass(layers, torch.randn(4, 8))
    assert [tuple(shape) for shape, _ in shapes] == [(4, 8), (4, 16), (4, 16), (4, 2)]
    # the first Linear keeps its input (128 bytes), tanh its output (256), and the second
    # Linear that same output again: counted once; parameters and their views never
    assert graph == [4 * 8 * 4, 4 * 16 * 4, 0]
    assert ends == [(4 * 8 * 4, 0), (0, 4 * 16 * 4), (0, 0)]  # of them, inputs and outputs
    # a parameter's meta copy, freed, must not lend its id to a later layer's saved tensor
    # (before the copies were held, 2 passes in 300 dropped tanh's output)
    for _ in range(300):
        layers = [torch.nn.Linear(8, 16), torch.nn.Tanh(), torch.nn.Linear(16, 2)]
        assert meta_pass(layers, torch.randn(4, 8))[1] == graph


@pytest.mark.parametrize("segments", [1, 3, 8, None])
def test_segments_of_any_length_get_autograds_gradients(segments):
    from asyncckpt.torch import checkpoint_sequential

    torch.manual_seed(3)
    shared = torch.nn.Linear(32, 32)  # twice in one segment or in two
    net = torch.nn.Sequential(torch.nn.Linear(16, 32), torch.nn.Tanh(), shared, torch.nn.ReLU(),
                              shared, torch.nn.Tanh(), torch.nn.Linear(32, 4), torch.nn.Tanh())
    x = torch.randn(5, 16, requires_grad=True)
    tensors = [x, *net.parameters()]
    reference = sequential_gradients(lambda: net(x), tensors)
    ours = sequential_gradients(
        lambda: checkpoint_sequential(net, x, segments=segments, l1_slots=1, interval=1),
        tensors)
    assert_bitwise(ours, reference)


def test_a_budget_holds_the_checkpoints_and_one_segments_graph():
    from asyncckpt.torch import checkpoint_sequential
    from asyncckpt.torch.sequential import meta_pass

    torch.manual_seed(4)
    net = torch.nn.Sequential(*[layer for _ in range(12)
                                for layer in (torch.nn.Linear(256, 256), torch.nn.Tanh())])
    x = torch.randn(64, 256, requires_grad=True)  # 64 KiB activations
    budget = 2**21
    out = checkpoint_sequential(net, x, memory_budget=budget)
    run = out.grad_fn.run
    _, graph, _, _ = meta_pass(list(net), x)
    # the live activation, the output returned, the activation's gradients in and out, the
    # checkpoints (their least: Level-2 takes the rest beyond the budget) and the segment that
    # holds most: what autograd saves beyond its input, its output, the backward's seed and
    # one layer's parameters' parts (autograd adds each into .grad as the backward goes)
    from asyncckpt.planning import engine_buffers, state_bytes

    rest = budget - 4 * 2**16
    least = (engine_buffers() + 1) * state_bytes(2**16)
    assert run.checkpointer.memory_budget == least
    params = 256 * 257 * 4
    for a, b in zip(run.starts, run.starts[1:]):
        linears = (b - a + a % 2) // 2
        seed = 2**16 if b - a > 1 else 0
        held = sum(graph[a:b]) - (graph[a] if a == 0 else 0) + seed \
            + (params if linears else 0) + (0 if (b - 1) % 2 else 2**16)
        assert held <= rest - least
    assert len(run.starts) - 1 < len(net)
    tensors = [x, *net.parameters()]
    ours = sequential_gradients(lambda: out, tensors)
    assert_bitwise(ours, sequential_gradients(lambda: net(x), tensors))


@pytest.mark.parametrize("segments", [1, 4, 40])
def test_scan_segments_of_any_length_get_autograds_gradients(segments):
    torch.manual_seed(5)
    cell = torch.nn.GRUCell(8, 8)
    xs = torch.randn(40, 2, 8, requires_grad=True)
    params = [*cell.parameters(), xs]

    def step(h, x):
        h = cell(x, h)
        return h, h.square().sum()

    def loss_of(scan):
        def run():
            h0 = torch.zeros(2, 8)
            if scan:
                h, ys = checkpoint_scan(step, h0, xs, segments=segments, l1_slots=1,
                                        interval=1)
            else:
                h, ys = scan_plain(step, h0, xs, 40)
            return h.sum() + ys.sum()
        return run

    assert_bitwise(gradients(loss_of(True), params)[1], gradients(loss_of(False), params)[1])


def test_scan_segments_hold_as_many_step_graphs_as_three_quarters_of_the_budget_take():
    torch.manual_seed(6)
    w = torch.randn(64, 64, requires_grad=True)
    h0 = torch.randn(64, 64)

    def step(h, x):  # its graph keeps h (the previous step's output) and tanh's output
        return torch.tanh(h @ w), None

    h, _ = checkpoint_scan(step, h0, n_steps=1000, memory_budget="512KiB")
    scan = h.grad_fn.run
    # step 0 keeps tanh's output, 16 KiB; the carry it was given is the checkpoint's
    assert scan.graph_bytes() == 64 * 64 * 4
    # beside the live carry (16 KiB) and a segment's gradients (w's twice, the carry's in and
    # out: 64 KiB), a quarter of the rest for the checkpoints, three quarters for a segment's
    # graph as it is resident (1.5 times what autograd saves); at least sqrt(1000) segments
    rest = 2**19 - 2**14 - 4 * 2**14
    assert scan.checkpointer.memory_budget == rest // 4
    lengths = [b - a for a, b in zip(scan.starts, scan.starts[1:])]
    assert rest * 3 // 4 - 2**14 * 1.5 < max(lengths) * 2**14 * 1.5 <= rest * 3 // 4
    assert len(lengths) >= 32 and sum(lengths) == 1000
    (ours,) = gradients(lambda: h.sum(), [w])[1]
    (reference,) = gradients(lambda: scan_plain(step, h0, None, 1000)[0].sum(), [w])[1]
    assert ours.numpy().tobytes() == reference.numpy().tobytes()


@pytest.mark.parametrize("segments", [1, 7, 200, None])
def test_a_weight_used_twice_a_step_sums_as_autograd_does(segments):
    torch.manual_seed(1)
    w = torch.randn(16, 16, requires_grad=True)
    xs = torch.randn(200, 4, 16)

    def step(h, x):
        return torch.tanh(torch.tanh(h @ w + x) @ w * 0.5), None

    (reference,) = gradients(lambda: scan_plain(step, torch.ones(4, 16), xs, 200)[0].sum(),
                             [w])[1]
    # interval 3 is longer than one segment's run: it becomes the run's length
    (ours,) = gradients(lambda: checkpoint_scan(step, torch.ones(4, 16), xs, segments=segments,
                                                l1_slots=2, interval=3)[0].sum(), [w])[1]
    assert ours.numpy().tobytes() == reference.numpy().tobytes()


def test_a_second_call_on_the_same_stack_reuses_itsmeta_pass(monkeypatch):
    import asyncckpt.torch as asyncckpt_torch
    import asyncckpt.torch.sequential as sequential

    passes = []
    meta_pass = sequential.meta_pass
    monkeypatch.setattr(sequential, "meta_pass",
                        lambda *args: passes.append(1) or meta_pass(*args))
    torch.manual_seed(7)
    net = torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.Tanh(), torch.nn.Linear(16, 4))
    x = torch.randn(3, 8, requires_grad=True)
    tensors = [x, *net.parameters()]
    reference = sequential_gradients(lambda: net(x), tensors)
    for _ in range(2):
        ours = sequential_gradients(
            lambda: asyncckpt_torch.checkpoint_sequential(net, x, l1_slots=1), tensors)
        assert_bitwise(ours, reference)
    assert len(passes) == 1
    # another input shape, or a parameter of another shape, is another stack
    asyncckpt_torch.checkpoint_sequential(net, torch.randn(5, 8), l1_slots=1)
    net[2] = torch.nn.Linear(16, 6)
    assert asyncckpt_torch.checkpoint_sequential(net, x, l1_slots=1).shape == (3, 6)
    assert len(passes) == 3


def test_a_layer_whose_output_changed_since_its_pass_runs_afresh():
    from asyncckpt.torch import checkpoint_sequential

    width = {"kept": 7}
    w = torch.randn(10, 30, requires_grad=True)
    layers = [lambda h: h @ w, torch.tanh, lambda h: h[:, :width["kept"]]]
    x = torch.randn(4, 10)
    assert checkpoint_sequential(layers, x, l1_slots=1).shape == (4, 7)
    width["kept"] = 5  # nothing the cache keys on changed: the forward sweep finds it out
    out = checkpoint_sequential(layers, x, l1_slots=1)
    assert out.shape == (4, 5)
    out.sum().backward()
    ours = w.grad.clone()
    w.grad = None
    torch.tanh(x @ w)[:, :5].sum().backward()
    assert ours.numpy().tobytes() == w.grad.numpy().tobytes()


def test_last_stats_tell_what_the_last_scan_and_stack_ran():
    from asyncckpt.torch import last_stats

    cell = torch.nn.GRUCell(4, 4)
    xs = torch.randn(30, 2, 4)
    _, ys = checkpoint_scan(lambda h, x: (cell(x, h),) * 2, torch.zeros(2, 4), xs,
                            memory_budget="64KiB", segments=30)
    ys.sum().backward()
    stats = last_stats()
    assert stats.n_timesteps == 30 and stats.reverse_steps == 30
    assert len(repr(stats)) < 600
    net = torch.nn.Sequential(*[torch.nn.Linear(4, 4) for _ in range(5)])
    checkpoint_sequential(net, torch.randn(3, 4, requires_grad=True), segments=5).sum().backward()
    assert last_stats().n_timesteps == 5


def test_a_layer_that_is_not_callable_is_named_by_its_index():
    with pytest.raises(TypeError, match=r"layer 1 is a str .*'relu'"):
        checkpoint_sequential([torch.nn.Linear(4, 4), "relu"], torch.randn(2, 4))
