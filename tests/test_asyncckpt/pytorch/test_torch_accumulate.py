"""How a stack's backward hands its gradients over: added into ``.grad`` segment by segment
under ``backward()`` as autograd's own nodes add them, returned where autograd captures them
(``torch.autograd.grad``, ``inputs=``), and its last segment back-propagated through the graph
the forward sweep built, never recomputed."""
from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")


def mlp(seed: int = 0, depth: int = 6) -> torch.nn.Sequential:
    torch.manual_seed(seed)
    return torch.nn.Sequential(*[layer for _ in range(depth)
                                 for layer in (torch.nn.Linear(32, 32), torch.nn.Tanh())])


class Counting(torch.nn.Module):
    """The identity, counting its calls."""

    def __init__(self) -> None:
        super().__init__()
        self.calls = 0

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        self.calls += 1
        return x * 1.0


@pytest.mark.parametrize("segments", [1, 3])
def test_the_last_segment_is_not_run_again_in_the_backward(segments):
    # the backward ran every segment again, the last one too, where torch's
    # checkpoint_sequential keeps the last segment's graph from the forward
    from asyncckpt.torch import checkpoint_sequential

    net = mlp()
    first, last = Counting(), Counting()
    layers = [first, *net, last]
    x = torch.randn(8, 32, requires_grad=True)
    checkpoint_sequential(layers, x, segments=segments, l1_slots=4)  # its first pass, kept
    first.calls = last.calls = 0
    x.grad = None
    checkpoint_sequential(layers, x, segments=segments, l1_slots=4).sum().backward()
    assert last.calls == 1
    assert first.calls == (1 if segments == 1 else 2)
    ours = [x.grad.clone(), *(p.grad.clone() for p in net.parameters())]
    x.grad = None
    net.zero_grad(set_to_none=True)
    torch.nn.Sequential(*layers)(x).sum().backward()
    plain = [x.grad, *(p.grad for p in net.parameters())]
    assert all(torch.equal(a, b) for a, b in zip(ours, plain))


def test_a_stack_under_no_grad_keeps_no_graph():
    from asyncckpt.torch import checkpoint_sequential

    net = mlp()
    x = torch.randn(8, 32)
    with torch.no_grad():
        out = checkpoint_sequential(net, x, segments=3, l1_slots=4)
    assert not out.requires_grad and out.grad_fn is None
    assert torch.equal(out, net(x).detach())


def test_autograd_grad_returns_the_stacks_gradients_and_leaves_grad_alone():
    from asyncckpt.torch import checkpoint_sequential

    net = mlp(1)
    params = list(net.parameters())
    x = torch.randn(8, 32, requires_grad=True)
    ours = torch.autograd.grad(checkpoint_sequential(net, x, memory_budget="1MiB").sum(),
                               [x, *params])
    assert all(p.grad is None for p in params)
    plain = torch.autograd.grad(net(x).sum(), [x, *params])
    assert all(torch.equal(a, b) for a, b in zip(ours, plain))


def test_backward_with_inputs_adds_into_those_alone():
    from asyncckpt.torch import checkpoint_sequential

    net = mlp(2)
    params = list(net.parameters())
    x = torch.randn(8, 32, requires_grad=True)
    checkpoint_sequential(net, x, segments=3, l1_slots=4).sum().backward(
        inputs=[x, params[0]])
    assert all(p.grad is None for p in params[1:])
    ours = (x.grad.clone(), params[0].grad.clone())
    x.grad, params[0].grad = None, None
    net(x).sum().backward(inputs=[x, params[0]])
    assert torch.equal(ours[0], x.grad) and torch.equal(ours[1], params[0].grad)


def test_gradients_add_into_a_grad_that_holds_a_sum_and_hooks_see_them_once():
    # as autograd's AccumulateGrad: .grad += the backward's part; a parameter's hooks see
    # its gradient once, as under plain autograd (not once more as None)
    from asyncckpt.torch import checkpoint_sequential

    net = mlp(3)
    params = list(net.parameters())
    x = torch.randn(8, 32)
    posts = []
    params[2].register_post_accumulate_grad_hook(lambda p: posts.append(p.grad.clone()))
    sums = [torch.randn_like(p) for p in params]

    def run(stack) -> list[torch.Tensor]:
        for p, total in zip(params, sums):
            p.grad = total.clone()
        stack().sum().backward()
        return [p.grad.clone() for p in params]

    ours = run(lambda: checkpoint_sequential(net, x, segments=4, l1_slots=4))
    plain = run(lambda: net(x))
    assert all(torch.equal(a, b) for a, b in zip(ours, plain))
    assert len(posts) == 2 and torch.equal(posts[0], posts[1])
