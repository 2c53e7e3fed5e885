"""The experiment's LSTM written in torch, for the torch methods: the same parameters, corpus,
batch and loss as :class:`~experiments.lstm.model.LSTM`, one step as
``step((h, c), (inputs_t, targets_t)) -> ((h', c'), loss_t)``, the scan's form.

Its gradients equal each other's bit for bit across the torch methods (plain autograd, torch's
per-step checkpoint, asyncckpt's ``checkpoint_scan``), not the numpy model's: torch's matmul
and elementwise kernels round differently. After a pass they are written into the numpy
model's ``grads``, loss and step count, so the experiment reports every method alike.
"""
from __future__ import annotations

from typing import Any

import numpy as np
import torch

from .model import LSTM

__all__ = ["TorchLSTM"]


class TorchLSTM:
    """The step, parameters and inputs of ``model`` in torch (float64, on the host).

    Parameters
    ----------
    model : LSTM
        The numpy model whose parameters are copied (leaf tensors that require grad) and
        whose gradients, loss and step count :meth:`report` fills in.
    """

    def __init__(self, model: LSTM) -> None:
        if model.device != "cpu":
            raise ValueError(f"the torch methods run on the host, got device {model.device!r}")
        self.model = model
        self.params = {name: torch.tensor(np.asarray(value), requires_grad=True)
                       for name, value in model.params.items()}
        self.hidden, self.vocab, self.batch = model.hidden, model.vocab, model.batch
        self.steps = 0  # forward steps run, recomputed ones included

    def initial_carry(self) -> tuple[torch.Tensor, torch.Tensor]:
        """(h_0, c_0): zeros, as the numpy model starts."""
        shape = (self.batch, self.hidden)
        return torch.zeros(shape, dtype=torch.float64), torch.zeros(shape, dtype=torch.float64)

    def inputs(self) -> tuple[torch.Tensor, torch.Tensor]:
        """Each step's input and target characters, (n, batch) each, read as the numpy model
        reads them."""
        model = self.model
        corpus = torch.from_numpy(np.asarray(model.corpus))
        positions = (torch.from_numpy(model.starts)[None, :]
                     + torch.arange(model.n_steps)[:, None])
        return corpus[positions % len(corpus)], corpus[(positions + 1) % len(corpus)]

    def step(self, carry: tuple[torch.Tensor, torch.Tensor],
             x: tuple[torch.Tensor, torch.Tensor]) -> tuple[Any, torch.Tensor]:
        """One step: the gates [i, f, o, g] of ``h W_h + W[inputs] + b``, the new cell and
        hidden state, and the step's loss (cross-entropy summed over the batch, over its
        size)."""
        h, c = carry
        inputs, targets = x
        p, hidden, vocab = self.params, self.hidden, self.vocab
        self.steps += 1
        z = h @ p["W"][vocab:] + p["W"][inputs] + p["b"]
        i, f, o = torch.sigmoid(z[:, :3 * hidden]).split(hidden, dim=1)
        g = torch.tanh(z[:, 3 * hidden:])
        c = f * c + i * g
        h = o * torch.tanh(c)
        logits = h @ p["Wy"] + p["by"]
        loss = torch.nn.functional.cross_entropy(logits, targets, reduction="sum") / self.batch
        return (h, c), loss

    def report(self, losses: torch.Tensor) -> None:
        """Write the pass's gradients, loss and step count into the numpy model."""
        model = self.model
        for name, param in self.params.items():
            grad = param.grad
            model.grads[name][...] = 0.0 if grad is None else grad.numpy()
        model._loss[...] = float(losses.sum())
        model.steps_computed = self.steps
