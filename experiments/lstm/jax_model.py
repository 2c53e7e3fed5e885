"""The experiment's LSTM written in JAX, for the JAX methods: the same parameters, corpus,
batch and loss as :class:`~experiments.lstm.model.LSTM`, one step as
``step((h, c), (inputs_t, targets_t)) -> ((h', c'), loss_t)``, the scan's form, in float64.

``jax-scan`` differentiates ``jax.lax.scan`` of it (every step's residuals kept: the JAX
methods' reference), ``jax-checkpoint-scan`` asyncckpt's ``checkpoint_scan`` within the
budget. After a pass the gradients, loss and step count are written into the numpy model, so
the experiment reports every method alike.
"""
from __future__ import annotations

from collections.abc import Callable
from typing import Any

import numpy as np

from .model import LSTM

__all__ = ["JaxLSTM"]


class JaxLSTM:
    """The step, parameters and inputs of ``model`` in JAX (float64, on the host).

    Parameters
    ----------
    model : LSTM
        The numpy model whose parameters are copied and whose gradients, loss and step count
        :meth:`report` fills in.
    """

    def __init__(self, model: LSTM) -> None:
        import jax
        import jax.numpy as jnp

        jax.config.update("jax_enable_x64", True)
        if model.device != "cpu":
            raise ValueError(f"the JAX methods run on the host, got device {model.device!r}")
        self.model = model
        self.params = {name: jnp.asarray(np.asarray(value))
                       for name, value in model.params.items()}
        self.hidden, self.vocab, self.batch = model.hidden, model.vocab, model.batch

    def initial_carry(self) -> tuple[Any, Any]:
        import jax.numpy as jnp

        shape = (self.batch, self.hidden)
        return jnp.zeros(shape, jnp.float64), jnp.zeros(shape, jnp.float64)

    def inputs(self) -> tuple[Any, Any]:
        """Each step's input and target characters, (n, batch) each."""
        import jax.numpy as jnp

        model = self.model
        corpus = np.asarray(model.corpus)
        positions = model.starts[None, :] + np.arange(model.n_steps)[:, None]
        return (jnp.asarray(corpus[positions % len(corpus)]),
                jnp.asarray(corpus[(positions + 1) % len(corpus)]))

    def step(self, params: dict[str, Any]) -> Callable[[Any, Any], Any]:
        """One step with ``params``: the gates [i, f, o, g] of ``h W_h + W[inputs] + b``, the
        new cell and hidden state, and the step's loss (cross-entropy summed over the batch,
        over its size)."""
        import jax
        import jax.numpy as jnp

        hidden, vocab, batch = self.hidden, self.vocab, self.batch

        def step(carry: Any, x: Any) -> Any:
            h, c = carry
            inputs, targets = x
            z = h @ params["W"][vocab:] + params["W"][inputs] + params["b"]
            i, f, o = jnp.split(jax.nn.sigmoid(z[:, :3 * hidden]), 3, axis=1)
            g = jnp.tanh(z[:, 3 * hidden:])
            c = f * c + i * g
            h = o * jnp.tanh(c)
            logits = h @ params["Wy"] + params["by"]
            picked = jnp.take_along_axis(jax.nn.log_softmax(logits), targets[:, None], axis=1)
            return (h, c), -jnp.sum(picked) / batch
        return step

    def report(self, grads: dict[str, Any], loss: Any, steps: int) -> None:
        """Write the pass's gradients, loss and step count into the numpy model."""
        model = self.model
        for name, grad in grads.items():
            model.grads[name][...] = np.asarray(grad)
        model._loss[...] = float(loss)
        model.steps_computed = steps
