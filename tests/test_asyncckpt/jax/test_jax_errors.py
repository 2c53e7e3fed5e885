"""JAX's way of reporting a host callback's failure, and of refusing vmap, told in asyncckpt's
words: the error a user sees first names asyncckpt's problem and what to do."""
from __future__ import annotations

import numpy as np
import pytest

# jax.numpy, not jax: without JAX, tests/test_asyncckpt/jax imports as a namespace "jax"

pytest.importorskip("jax.numpy")

jax = pytest.importorskip("jax")
import jax.numpy as jnp  # noqa: E402
from conftest import wait_no_threads  # noqa: E402
from faults import FaultyMixin  # noqa: E402

import asyncckpt.errors  # noqa: E402
from asyncckpt import FileStorage  # noqa: E402
from asyncckpt.jax import checkpoint_scan  # noqa: E402


class FailingFile(FaultyMixin, FileStorage):
    pass


def step(c, x):
    c = jnp.sin(c) * x + 0.1
    return c, jnp.sum(c * c)


def loss_of(**options):
    def loss(c0, xs):
        c, ys = checkpoint_scan(step, c0, xs, interval=4, **options)
        return jnp.sum(c) + jnp.sum(ys)
    return loss


@pytest.mark.parametrize("transform", [lambda f: f, jax.jit], ids=["eager", "jit"])
def test_a_level2_path_that_cannot_be_made_is_refused_in_asyncckpts_words(transform) -> None:
    grad = transform(jax.grad(loss_of(storage="/proc/no/such/dir")))
    with pytest.raises(asyncckpt.errors.InvalidValueError) as caught:
        grad(jnp.ones(8), jnp.ones((20, 8)))
    assert str(caught.value).startswith("FileStorage path '/proc/no/such/dir'")
    assert wait_no_threads() == []


def test_a_level2_failing_during_an_eager_run_raises_asyncckpts_error_first(tmp_path) -> None:
    storage = FailingFile(tmp_path / "failing", bad_keys=range(64))
    with pytest.raises(asyncckpt.errors.CheckpointError) as caught:
        # 50 carries of 16 KiB under 320 KiB: most go to the failing disk
        jax.grad(loss_of(storage=storage, memory_budget="320KiB"))(jnp.ones(2048),
                                                                    jnp.ones((200, 2048)))
    assert "CpuCallback" not in str(caught.value)
    assert "No space left on device" in str(caught.value)
    assert wait_no_threads() == []
    storage.close()


def test_vmap_is_refused_saying_to_put_the_batch_in_the_carry() -> None:
    batched = jax.vmap(jax.grad(loss_of()))
    with pytest.raises(asyncckpt.errors.UsageError, match="Put the batch in the carry"):
        batched(jnp.ones((3, 8)), jnp.ones((3, 20, 8)))


def test_the_batch_in_the_carry_gives_vmaps_gradients_bit_for_bit() -> None:
    rng = np.random.default_rng(0)
    c0, xs = rng.standard_normal((3, 8)), rng.standard_normal((3, 20, 8))

    def plain(c0, xs):
        c, ys = jax.lax.scan(step, c0, xs)
        return jnp.sum(c) + jnp.sum(ys)
    expected = jax.vmap(jax.grad(plain, argnums=(0, 1)))(c0, xs)

    def batched(c0, xs):  # the batch on the carry's first axis, on xs's second
        c, ys = checkpoint_scan(jax.vmap(step), c0, jnp.swapaxes(xs, 0, 1), interval=4)
        return jnp.sum(c) + jnp.sum(ys)
    got = jax.grad(batched, argnums=(0, 1))(c0, xs)
    for ours, reference in zip(got, expected):
        np.testing.assert_array_equal(np.asarray(ours), np.asarray(reference))
