"""The attack suite's JAX profile: scans nobody listed, against ``jax.lax.scan``.

Each draw builds a step from parts: a tanh recurrence, noise drawn from a PRNG key scanned in
``xs`` (``jax.random.fold_in`` per step), a pytree carry of mixed float dtypes (float64 and
float32 leaves, one of them a dict), closed-over arrays reached through nested helpers, and
outputs or none; a plan (a fixed interval or "auto", a budget or none, reverse or not) and a
length. The final carry and the outputs must equal ``lax.scan``'s bit for bit, and the
gradients of the carry and ``xs`` too where ``lax.scan``'s own forward is the same
differentiated or not; the closed-over arrays' within the ulps a segment's association of the
same sums allows (docs/jax.md).

CI draws 8, the same every time (each compiles its own scans: seconds a draw); ``ASYNCCKPT_ADAPTER_ATTACKS=N`` draws N at random.
"""
from __future__ import annotations

import os

import numpy as np
import pytest

pytest.importorskip("jax.numpy")
jax = pytest.importorskip("jax")

import jax.numpy as jnp  # noqa: E402
from hypothesis import given  # noqa: E402
from hypothesis import strategies as st  # noqa: E402
from profiles import profile  # noqa: E402
from test_jax import PARAM_RTOL, lax_scan_differs_when_differentiated  # noqa: E402

from asyncckpt.jax import checkpoint_scan  # noqa: E402

jax.config.update("jax_enable_x64", True)

EXAMPLES = int(os.environ.get("ASYNCCKPT_ADAPTER_ATTACKS", "8"))
HIDDEN = 8


def build(noise: bool, mixed: bool, nested: bool, outputs: bool, seed: int):
    """A maker of the step from its closed-over arrays, the initial carry, the key data and
    the closed-over arrays themselves, drawn from parts."""
    rng = np.random.default_rng(seed)
    side_dtype = jnp.float32 if mixed else jnp.float64
    W = jnp.asarray(rng.standard_normal((HIDDEN, HIDDEN)) * 0.3)
    V = jnp.asarray(rng.standard_normal((HIDDEN,)) * 0.1, side_dtype)

    def make_step(W, V):
        def mix(h, x):  # reached through two helpers where nested
            return jnp.tanh(h @ W + x)

        def helper(h, x):
            return mix(h, x)

        def step(carry, x):
            h, side = carry["h"], carry["side"]
            h_new = (helper if nested else mix)(h, x["u"])
            if noise:
                key = jax.random.wrap_key_data(x["key"])
                h_new = h_new + 0.05 * jax.random.normal(key, h.shape)
            side_new = 0.9 * side + V * h_new.astype(side.dtype)
            return {"h": h_new, "side": side_new}, \
                (jnp.sum(h_new ** 2, axis=-1) if outputs else None)
        return step

    carry = {"h": jnp.asarray(rng.standard_normal((2, HIDDEN))),
             "side": jnp.asarray(rng.standard_normal((2, HIDDEN)), side_dtype)}
    return make_step, carry, (W, V)


@pytest.mark.timeout(max(300, 20 * EXAMPLES))
@profile(EXAMPLES, "ASYNCCKPT_ADAPTER_ATTACKS")
@given(n=st.integers(2, 40), noise=st.booleans(), mixed=st.booleans(), nested=st.booleans(),
       outputs=st.booleans(), interval=st.sampled_from([1, 2, 3, 7, "auto"]),
       budget=st.sampled_from([None, "32KiB", "256KiB"]), reverse=st.booleans(),
       seed=st.integers(0, 2**16))
def test_jax_scans_nobody_listed_equal_lax_scan(n, noise, mixed, nested, outputs, interval,
                                                budget, reverse, seed) -> None:
    make_step, carry, params = build(noise, mixed, nested, outputs, seed)
    rng = np.random.default_rng(seed + 1)
    u = jnp.asarray(rng.standard_normal((n, 2, HIDDEN)))
    keys = jax.random.key_data(jax.random.split(jax.random.key(seed), n))

    def loss(scan, carry, u, params, **kwargs):
        final, ys = scan(make_step(*params), carry, {"u": u, "key": keys}, reverse=reverse,
                         **kwargs)
        total = jnp.sum(final["h"] ** 2) + jnp.sum(final["side"].astype(jnp.float64) ** 2)
        return total + (jnp.sum(ys) if ys is not None else 0.0), (final, ys)

    options = {"interval": interval, "memory_budget": budget}
    (_, ours), (o_carry, o_u, o_params) = jax.value_and_grad(
        lambda *a: loss(checkpoint_scan, *a, **options), argnums=(0, 1, 2),
        has_aux=True)(carry, u, params)
    (_, reference), (r_carry, r_u, r_params) = jax.value_and_grad(
        lambda *a: loss(jax.lax.scan, *a), argnums=(0, 1, 2), has_aux=True)(carry, u, params)
    leaves = jax.tree_util.tree_leaves
    for a, b in zip(leaves(ours), leaves(reference)):  # the final carry and the outputs
        assert np.asarray(a).tobytes() == np.asarray(b).tobytes()
    step = make_step(*params)
    bit_for_bit = not lax_scan_differs_when_differentiated(
        lambda c, _: (step(c, {"u": u[0], "key": keys[0]})[0], None), carry, 1)
    for a, b in zip(leaves((o_carry, o_u)), leaves((r_carry, r_u))):
        assert a.dtype == b.dtype and a.shape == b.shape
        if bit_for_bit:
            assert np.asarray(a).tobytes() == np.asarray(b).tobytes()
        _assert_close(a, b)
    for a, b in zip(leaves(o_params), leaves(r_params)):  # sums over every step
        assert a.dtype == b.dtype
        if bit_for_bit:
            assert np.asarray(a).tobytes() == np.asarray(b).tobytes()
        _assert_close(a, b)


def _assert_close(ours, reference) -> None:
    """Within the ulps a forward that XLA compiles otherwise differentiated allows."""
    tolerance = PARAM_RTOL[np.float32 if reference.dtype == jnp.float32 else np.float64]
    scale = float(jnp.max(jnp.abs(reference))) or 1.0
    assert float(jnp.max(jnp.abs(ours - reference))) <= tolerance * scale * 10
