"""A character-level LSTM in numpy, written as pyrevolve-style forward and reverse operators.

Under pyrevolve's protocol the state to checkpoint is (h, c). The forward operator keeps the last
step's activations as scratch, so a reverse step must directly follow its taping step. The
taping-free protocol (:class:`StepCheckpoint` and its operators) checkpoints that scratch instead:
u_t holds what the reverse of step t reads, so no taping step is needed. Inputs and targets are
read by index from the corpus, so nothing grows with the sequence length but what a method stores.

On a device (``device="cuda"``: CuPy; ``"standin"``: asyncckpt's CPU stand-in) every array lives
in device memory and the model runs its numpy kernels through the device's array module; the
loss is kept on the device so that a step never waits for it.
"""
from __future__ import annotations

import numpy as np

from .corpus import Corpus
from .kernels import load

__all__ = ["LSTM", "ForwardOperator", "ReverseOperator", "StepCheckpoint", "StepForwardOperator",
           "StepReverseOperator"]


class LSTM:
    """Parameters, live state, one step's scratch and the gradients of a batch of sequences.

    Parameters
    ----------
    corpus : Corpus
        Characters to read inputs and targets from.
    n_steps : int
        Sequence length (time steps).
    hidden : int
        Hidden size H.
    batch : int
        Sequences per batch B, starting at evenly spread corpus offsets.
    kernels : {"numba", "numpy"}
        Elementwise kernels ("numpy" on a device).
    seed : int
        Parameter initialisation.
    device : {"cpu", "cuda", "standin"}
        Where the arrays live: host memory, the current CUDA device (CuPy), or asyncckpt's CPU
        stand-in for a device.
    """

    def __init__(self, corpus: Corpus, n_steps: int, *, hidden: int = 128, batch: int = 16,
                 kernels: str = "numba", seed: int = 0, device: str = "cpu") -> None:
        if device != "cpu":
            kernels = "numpy"  # numba compiles for host arrays only
        self.kernels = kernels
        rng = np.random.default_rng(seed)
        vocab = corpus.vocab_size
        self.corpus = corpus.codes
        self.n_steps = n_steps
        self.hidden, self.batch, self.vocab = hidden, batch, vocab
        self.starts = (np.arange(batch) * (len(corpus) // batch)).astype(np.int64)
        scale = 1.0 / np.sqrt(hidden + vocab)
        self.params = {
            "W": rng.standard_normal((vocab + hidden, 4 * hidden)) * scale,
            "b": np.zeros(4 * hidden),
            "Wy": rng.standard_normal((hidden, vocab)) / np.sqrt(hidden),
            "by": np.zeros(vocab),
        }
        self.params["b"][hidden:2 * hidden] = 1.0  # forget-gate bias: remember by default
        self.grads = {k: np.zeros_like(v) for k, v in self.params.items()}
        self.rms = {k: np.zeros_like(v) for k, v in self.params.items()}
        self._forward_kernel, self._backward_kernel = load(kernels)
        shape = (batch, hidden)
        # live state
        self.h = np.zeros(shape)
        self.c = np.zeros(shape)
        # scratch of the last forward step
        self.h_prev = np.zeros(shape)
        self.c_prev = np.zeros(shape)
        self.z = np.zeros((batch, 4 * hidden))
        self.act = np.zeros((batch, 4 * hidden))
        self.tc = np.zeros(shape)
        self.logits = np.zeros((batch, vocab))
        self.probs = np.zeros((batch, vocab))
        self.inputs = np.zeros(batch, dtype=np.int64)
        self.targets = np.zeros(batch, dtype=np.int64)
        self.scratch_step = -1
        # adjoint state
        self.dh = np.zeros(shape)
        self.dc = np.zeros(shape)
        self.dz = np.zeros((batch, 4 * hidden))
        self.dlogits = np.zeros((batch, vocab))
        # bookkeeping: steps computed (for the recompute factor) and the loss of the forward sweep
        self.steps_computed = 0
        self._loss = np.zeros(())
        self._loss_steps = 0
        self.rows = np.arange(batch)
        self.corpus = np.asarray(self.corpus)
        self.xp, self.device = np, device
        self._onehot: np.ndarray | None = None
        if device != "cpu":
            self._to_device(device)

    def _to_device(self, device: str) -> None:
        """Move every array to ``device``; take the array module that runs there."""
        if device == "cuda":
            import cupy

            self.xp, move = cupy, cupy.asarray
            # a one-hot product instead of a scatter-add, whose atomics add in no fixed order
            self._onehot = cupy.zeros((self.batch, self.vocab))
        elif device == "standin":
            from asyncckpt.devices import StandInDevice

            self.standin = StandInDevice()
            move = self.standin.array
        else:
            raise ValueError(f"device must be 'cpu', 'cuda' or 'standin', got {device!r}")
        for group in (self.params, self.grads, self.rms):
            for name in group:
                group[name] = move(group[name])
        for name, value in list(vars(self).items()):
            if isinstance(value, np.ndarray) and name != "_onehot":
                setattr(self, name, move(value))

    @property
    def loss(self) -> float:
        """The loss of the forward sweep (mean over the batch, summed over the steps)."""
        return float(self._loss)

    # -- checkpoint descriptor (pyrevolve protocol) ---------------------------------------------
    @property
    def size(self) -> int:
        return self.h.size + self.c.size

    @property
    def dtype(self) -> np.dtype:
        return self.h.dtype

    @property
    def nbytes(self) -> int:
        return self.h.nbytes + self.c.nbytes

    def get_data(self, timestep: int) -> list[np.ndarray]:
        return [self.h, self.c]

    def get_data_location(self, timestep: int) -> list[np.ndarray]:
        return [self.h, self.c]

    # -- one iteration ---------------------------------------------------------------------------
    def reset(self) -> None:
        """Zero the state, the adjoint, the gradients and the loss: ready for a new iteration."""
        for array in (self.h, self.c, self.dh, self.dc):
            array.fill(0.0)
        for grad in self.grads.values():
            grad.fill(0.0)
        self.steps_computed = 0
        self._loss.fill(0.0)
        self._loss_steps = 0
        self.scratch_step = -1

    def step(self, t: int) -> None:
        """Forward step t: u_t -> u_{t+1}, keeping the step's activations as scratch."""
        p, xp = self.params, self.xp
        vocab = self.vocab
        self._read_corpus(t)
        self.h_prev[...] = self.h
        self.c_prev[...] = self.c
        xp.matmul(self.h, p["W"][vocab:], out=self.z)
        self.z += p["W"][self.inputs]  # the one-hot input times W is a row lookup
        self.z += p["b"]
        self._forward_kernel(self.z, self.c, self.act, self.tc, self.h)
        xp.matmul(self.h, p["Wy"], out=self.logits)
        self.logits += p["by"]
        self.logits -= self.logits.max(axis=1, keepdims=True)
        xp.exp(self.logits, out=self.probs)
        self.probs /= self.probs.sum(axis=1, keepdims=True)
        self.scratch_step = t
        self.steps_computed += 1
        if t == self._loss_steps:  # count each step's loss once, in the first sweep that reaches it
            self._loss -= xp.log(self.probs[self.rows, self.targets]).sum() / self.batch
            self._loss_steps += 1

    def _read_corpus(self, t: int) -> None:
        position = self.starts + t
        self.xp.take(self.corpus, position % len(self.corpus), out=self.inputs)
        self.xp.take(self.corpus, (position + 1) % len(self.corpus), out=self.targets)

    def adjoint(self, t: int) -> None:
        """Reverse step t: accumulate the gradients of step t, move the adjoint to u_t."""
        if self.scratch_step != t:
            raise RuntimeError(f"reverse step {t} needs the scratch of step {t}, "
                               f"holding step {self.scratch_step}: the taping step is missing")
        p, g = self.params, self.grads
        vocab = self.vocab
        d = self.dlogits
        d[...] = self.probs
        d[self.rows, self.targets] -= 1.0
        d /= self.batch
        g["Wy"] += self.h.T @ d
        g["by"] += d.sum(axis=0)
        self.dh += d @ p["Wy"].T
        self._backward_kernel(self.dh, self.dc, self.act, self.tc, self.c_prev, self.dz)
        g["W"][vocab:] += self.h_prev.T @ self.dz
        if self._onehot is None:
            np.add.at(g["W"], self.inputs, self.dz)
        else:
            self._onehot.fill(0.0)
            self._onehot[self.rows, self.inputs] = 1.0
            g["W"][:vocab] += self._onehot.T @ self.dz
        g["b"] += self.dz.sum(axis=0)
        self.xp.matmul(self.dz, p["W"][vocab:].T, out=self.dh)
        self.scratch_step = -1

    def adjoint_from_scratch(self, t: int) -> None:
        """Reverse step t, the arrays of :data:`STEP_SCRATCH` holding step t's scratch (restored
        from a taping-free checkpoint, not left by a forward step)."""
        self._read_corpus(t)
        self.scratch_step = t
        self.adjoint(t)

    def gradient_vector(self) -> np.ndarray:
        """All gradients, concatenated (for bitwise comparison and finite differences)."""
        joined = self.xp.concatenate([g.ravel() for g in self.grads.values()])
        return joined.get() if hasattr(joined, "get") else np.asarray(joined).view(np.ndarray)

    def rmsprop(self, learning_rate: float = 1e-2, decay: float = 0.9, eps: float = 1e-8) -> None:
        """One RMSProp update of the parameters from the accumulated gradients."""
        for name, param in self.params.items():
            grad, rms = self.grads[name], self.rms[name]
            rms *= decay
            rms += (1.0 - decay) * grad * grad
            param -= learning_rate * grad / (self.xp.sqrt(rms) + eps)

    # -- scratch save/restore for standard backpropagation --------------------------------------
    #: the float arrays that a reverse step reads, as the forward step of the same t leaves them
    STEP_SCRATCH = ("h_prev", "c_prev", "act", "tc", "probs", "h", "c")
    _SCRATCH = STEP_SCRATCH + ("inputs", "targets")

    def save_activations(self) -> tuple[np.ndarray, ...]:
        """Copies of everything the reverse step of the last forward step reads."""
        return tuple(getattr(self, name).copy() for name in self._SCRATCH)

    def restore_activations(self, saved: tuple[np.ndarray, ...], t: int) -> None:
        """Put back what :meth:`save_activations` returned for step t."""
        for name, array in zip(self._SCRATCH, saved):
            getattr(self, name)[...] = array
        self.scratch_step = t


class ForwardOperator:
    """``apply(t_start, t_end)``: advance the LSTM from u_{t_start} to u_{t_end}."""

    def __init__(self, model: LSTM) -> None:
        self.model = model

    def apply(self, *, t_start: int, t_end: int) -> None:
        for t in range(t_start, t_end):
            self.model.step(t)


class ReverseOperator:
    """``apply(t_start, t_start + 1)``: the adjoint of one step."""

    def __init__(self, model: LSTM) -> None:
        self.model = model

    def apply(self, *, t_start: int, t_end: int) -> None:
        for t in range(t_end - 1, t_start - 1, -1):
            self.model.adjoint(t)


class StepCheckpoint:
    """Checkpoint descriptor of the taping-free protocol: u_t is step t's scratch.

    That is (h_t, c_t) as ``h_prev``, ``c_prev``, the gates, tanh of the new cell, the output
    probabilities and (h_{t+1}, c_{t+1}) as ``h``, ``c``: everything the reverse of step t reads
    but the inputs and targets, which are read from the corpus by t. u_0 exists once step 0 has
    run, so a run calls ``model.step(0)`` before handing this to a checkpointer.
    """

    def __init__(self, model: LSTM) -> None:
        self.model = model
        self._arrays = [getattr(model, name) for name in LSTM.STEP_SCRATCH]

    @property
    def size(self) -> int:
        return sum(a.size for a in self._arrays)

    @property
    def dtype(self) -> np.dtype:
        return self.model.h.dtype

    @property
    def nbytes(self) -> int:
        return sum(a.nbytes for a in self._arrays)

    def get_data(self, timestep: int) -> list[np.ndarray]:
        return self._arrays

    def get_data_location(self, timestep: int) -> list[np.ndarray]:
        return self._arrays


class StepForwardOperator:
    """``apply(t_start, t_end)``: u_{t_start} -> u_{t_end} of :class:`StepCheckpoint`, that is,
    forward steps t_start + 1 to t_end. u_n, which no reverse step reads, is left as u_{n-1}:
    step n does not exist."""

    def __init__(self, model: LSTM) -> None:
        self.model = model

    def apply(self, *, t_start: int, t_end: int) -> None:
        for t in range(t_start + 1, min(t_end, self.model.n_steps - 1) + 1):
            self.model.step(t)


class StepReverseOperator:
    """``apply(t, t + 1)`` with u_t of :class:`StepCheckpoint` live: the adjoint of step t."""

    def __init__(self, model: LSTM) -> None:
        self.model = model

    def apply(self, *, t_start: int, t_end: int) -> None:
        if t_end != t_start + 1:
            raise ValueError(f"the taping-free reverse runs one step at a time, got t_start = "
                             f"{t_start}, t_end = {t_end}")
        self.model.adjoint_from_scratch(t_start)
