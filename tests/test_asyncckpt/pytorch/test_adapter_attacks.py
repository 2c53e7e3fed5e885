"""The adapter profile of the attack suite: random steps for ``checkpoint_scan`` and random
stacks for ``checkpoint_sequential``, drawn from dropout, noise drawn by the step, parameters
reached through nested helpers, BatchNorm in training mode, carries of mixed dtypes and
modules switched to eval mode between the forward and the backward, under random plans
(segments, slots, intervals, budgets). Every gradient, every buffer and the random generator
after forward+backward must equal plain autograd's with the same seed, bit for bit,
or the call raise a clear error.

CI draws 40 of each, the same ones every time; ``ASYNCCKPT_ADAPTER_ATTACKS=N`` draws N at
random (docs/reliability.md quotes the last long run).
"""
from __future__ import annotations

import os

import pytest
from hypothesis import given, note
from hypothesis import strategies as st
from profiles import profile

torch = pytest.importorskip("torch")

from asyncckpt.torch import checkpoint_scan, checkpoint_sequential  # noqa: E402
from test_torch_exact import sequential_plain  # noqa: E402

EXAMPLES = int(os.environ.get("ASYNCCKPT_ADAPTER_ATTACKS", "40"))
VARIABLE = "ASYNCCKPT_ADAPTER_ATTACKS"


PLANS = st.one_of(
    st.fixed_dictionaries({"l1_slots": st.integers(1, 3), "interval": st.integers(1, 6)}),
    st.fixed_dictionaries({"segments": st.integers(1, 40), "l1_slots": st.integers(1, 3),
                           "interval": st.integers(1, 4)}),
    st.fixed_dictionaries({"memory_budget": st.sampled_from(["32KiB", "64KiB", "1MiB"])}))

FEATURES = ("dropout", "noise", "helpers", "batchnorm", "mixed", "eval")


def gradients(loss_of, tensors, modules, seed, switch=()):
    """After one forward+backward from ``seed``, the modules of ``switch`` put in eval mode
    between the two (the backward recomputes as the forward ran) and back in training mode
    after."""
    for t in tensors:
        t.grad = None
    torch.manual_seed(seed)
    loss = loss_of()
    for m in switch:
        m.eval()
    loss.backward()
    for m in switch:
        m.train()
    return ([None if t.grad is None else t.grad.clone() for t in tensors],
            [b.clone() for m in modules for b in m.buffers()], torch.get_rng_state())


def same(ours, reference) -> None:
    for a, b in zip(ours[0], reference[0]):
        assert (a is None) == (b is None), "a gradient is missing"
        if a is not None:
            assert a.numpy().tobytes() == b.numpy().tobytes(), "a gradient differs"
    for a, b in zip(ours[1], reference[1]):
        assert a.numpy().tobytes() == b.numpy().tobytes(), "a buffer differs"
    assert torch.equal(ours[2], reference[2]), "the generator differs"


def reset(modules, state) -> None:
    with torch.no_grad():
        for b, saved in zip([b for m in modules for b in m.buffers()], state):
            b.copy_(saved)


@st.composite
def scans(draw):
    features = draw(st.sets(st.sampled_from(FEATURES)))
    n = draw(st.integers(1, 40))
    width, batch = draw(st.integers(2, 6)), draw(st.integers(2, 4))
    return features, n, width, batch, draw(PLANS), draw(st.integers(0, 2**16))


@profile(EXAMPLES, VARIABLE)
@given(scans())
def test_scan_is_autograd_bit_for_bit(drawn):
    features, n, width, batch, plan, seed = drawn
    note(f"features={sorted(features)} n={n} width={width} batch={batch} plan={plan}")
    torch.manual_seed(seed)
    lin, out = torch.nn.Linear(width, width), torch.nn.Linear(width, 1)
    norm = torch.nn.BatchNorm1d(width)
    drop = torch.nn.Dropout(0.3)
    sigma = torch.tensor(0.2, requires_grad=True)
    xs = torch.randn(n, batch, width, requires_grad=True)

    def inner(h):
        return lin(h)

    def helper(h):  # two levels of helpers down to the parameters
        return torch.tanh(inner(h))

    def step(carry, x):
        h, count = carry["h"], carry.get("count")
        h = (helper if "helpers" in features else lambda v: torch.tanh(lin(v)))(h + x)
        if "batchnorm" in features:
            h = norm(h)
        if "dropout" in features:
            h = drop(h)
        if "noise" in features:
            h = h + sigma * torch.randn_like(h)
        new = {"h": h}
        if count is not None:
            new["count"] = count + 1  # an integer leaf beside the float carry
        return new, out(h).squeeze(-1)

    carry = {"h": torch.zeros(batch, width)}
    if "mixed" in features:
        carry["count"] = torch.zeros((), dtype=torch.int64)
    tensors = [xs, sigma, *lin.parameters(), *out.parameters(), *norm.parameters()]

    def loss_of(scan):
        def go():
            if scan:
                final, ys = checkpoint_scan(step, carry, xs, **plan)
            else:
                c, steps = carry, []
                for t in range(n):
                    c, y = step(c, xs[t])
                    steps.append(y)
                final, ys = c, torch.stack(steps)
            return (final["h"] ** 2).sum() + (ys * torch.linspace(0.5, 1.5, n)[:, None]).sum()
        return go

    state = [b.clone() for b in norm.buffers()]
    switch = [lin, out, norm, drop] if "eval" in features else []
    ours = gradients(loss_of(True), tensors, [norm], seed, switch)
    reset([norm], state)
    same(ours, gradients(loss_of(False), tensors, [norm], seed, switch))


@st.composite
def stacks(draw):
    width = draw(st.integers(2, 6))
    kinds = draw(st.lists(st.sampled_from(["linear", "tanh", "dropout", "noise", "batchnorm",
                                           "helper", "double"]), min_size=1, max_size=30))
    return (kinds, width, draw(st.integers(2, 5)), draw(PLANS), draw(st.integers(0, 2**16)),
            draw(st.booleans()))


@profile(EXAMPLES, VARIABLE)
@given(stacks())
def test_sequential_is_autograd_bit_for_bit(drawn):
    kinds, width, batch, plan, seed, switched = drawn
    note(f"kinds={kinds} width={width} batch={batch} plan={plan} eval={switched}")
    torch.manual_seed(seed)
    shared = torch.nn.Linear(width, width)  # reached by a callable through a helper

    def through(y):
        return shared(y)

    make = {"linear": lambda: torch.nn.Linear(width, width), "tanh": torch.nn.Tanh,
            "dropout": lambda: torch.nn.Dropout(0.25),
            "noise": lambda: (lambda y: y + 0.1 * torch.randn_like(y)),
            "batchnorm": lambda: torch.nn.BatchNorm1d(width),
            "helper": lambda: (lambda y: torch.tanh(through(y))),
            "double": lambda: shared}
    layers = [make[kind]() for kind in kinds]
    modules = [m for m in layers if isinstance(m, torch.nn.BatchNorm1d)]
    tensors = [*{id(p): p for layer in [*layers, shared] if isinstance(layer, torch.nn.Module)
                 for p in layer.parameters()}.values()]
    x = torch.randn(batch, width, requires_grad=True)
    tensors.append(x)

    state = [b.clone() for m in modules for b in m.buffers()]
    switch = [m for m in [*layers, shared] if isinstance(m, torch.nn.Module)] if switched else []
    ours = gradients(lambda: checkpoint_sequential(layers, x, **plan).square().sum(), tensors,
                     modules, seed, switch)
    reset(modules, state)
    same(ours, gradients(lambda: sequential_plain(layers, x), tensors, modules, seed, switch))
