"""Two workloads with different state layouts, each with a store-everything reference.

- :class:`RecurrentCell`: a state of two arrays (h, c) and per-step scratch kept by the forward
  operator for the reverse step, like an LSTM.
- :class:`Leapfrog`: a nonlinear wave solver whose state holds two time levels in a circular buffer
  of three, so ``get_data(t)`` depends on t.

Both follow the pyrevolve protocol; their reverse steps fail loudly when called out of protocol.
"""
from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np


class ProtocolError(AssertionError):
    """The runtime broke the pyrevolve protocol."""


@dataclass
class Trace:
    """Every call the operators saw, in order: ("fwd", t_start, t_end) or ("rev", t)."""

    calls: list[tuple] = field(default_factory=list)

    def forward_steps(self) -> int:
        return sum(c[2] - c[1] for c in self.calls if c[0] == "fwd")

    def check_protocol(self, n: int) -> None:
        """Each reverse step once, n-1 down to 0, each directly after a forward call ending at t+1."""
        expected = n - 1
        for i, call in enumerate(self.calls):
            if call[0] != "rev":
                continue
            t = call[1]
            if t != expected:
                raise ProtocolError(f"reverse of {t} where {expected} was due")
            prev = self.calls[i - 1] if i else None
            if prev is None or prev[0] != "fwd" or prev[2] != t + 1:
                raise ProtocolError(f"reverse of {t} follows {prev}, not a forward call ending at {t + 1}")
            expected -= 1
        if expected != -1:
            raise ProtocolError(f"steps {expected}..0 never reversed")


class RecurrentCell:
    """h_{t+1} = tanh(W h_t + c_t), c_{t+1} = 0.5 c_t + 0.1 h_t * x_t, batch x hidden, float64."""

    def __init__(self, n: int, batch: int = 3, hidden: int = 5, seed: int = 0,
                 dtype: type = np.float64) -> None:
        rng = np.random.default_rng(seed)
        self.n = n
        self.W = (rng.standard_normal((hidden, hidden)) * 0.5).astype(dtype)
        self.x = rng.standard_normal((37, batch, hidden)).astype(dtype)  # inputs read by index
        self.h0 = rng.standard_normal((batch, hidden)).astype(dtype)
        self.c0 = rng.standard_normal((batch, hidden)).astype(dtype)
        self.h = self.h0.copy()
        self.c = self.c0.copy()
        self.trace = Trace()
        self._scratch_step = -1
        self._pre = np.zeros_like(self.h)
        self._h_in = np.zeros_like(self.h)
        self._c_in = np.zeros_like(self.c)
        self.reset_adjoint()

    # the descriptor
    @property
    def size(self) -> int:
        return self.h.size + self.c.size

    @property
    def dtype(self) -> np.dtype:
        return self.h.dtype

    def get_data(self, t: int) -> list[np.ndarray]:
        return [self.h, self.c]

    def get_data_location(self, t: int) -> list[np.ndarray]:
        return [self.h, self.c]

    def reset(self) -> None:
        self.h[...] = self.h0
        self.c[...] = self.c0
        self.reset_adjoint()

    def reset_adjoint(self) -> None:
        self.gW = np.zeros_like(self.W)
        self.lam_h = np.ones_like(self.h)
        self.lam_c = np.ones_like(self.c)

    def step(self, t: int) -> None:
        self._h_in[...] = self.h
        self._c_in[...] = self.c
        np.matmul(self.h, self.W, out=self._pre)
        self._pre += self.c
        self.c *= 0.5
        self.c += 0.1 * self._h_in * self.x[t % len(self.x)]
        np.tanh(self._pre, out=self.h)
        self._scratch_step = t

    def adjoint(self, t: int) -> None:
        if self._scratch_step != t:
            raise ProtocolError(f"reverse of step {t} with scratch of step {self._scratch_step}")
        d_pre = self.lam_h * (1.0 - self.h * self.h)
        self.gW += self._h_in.T @ d_pre
        lam_h = d_pre @ self.W.T + 0.1 * self.lam_c * self.x[t % len(self.x)]
        lam_c = d_pre + 0.5 * self.lam_c
        self.lam_h, self.lam_c = lam_h, lam_c
        self._scratch_step = -1

    def gradients(self) -> list[np.ndarray]:
        return [self.gW.copy(), self.lam_h.copy(), self.lam_c.copy()]


class Leapfrog:
    """u^{t+1} = 2u^t - u^{t-1} + c Lap(u^t) - k (u^t)^3 on a periodic 1-d grid.

    The state u_t is (u^t, u^{t-1}), held in a circular buffer of three time levels.
    """

    def __init__(self, n: int, points: int = 16, seed: int = 1, dtype: type = np.float32) -> None:
        rng = np.random.default_rng(seed)
        self.n = n
        self.k = 0.05
        self.coef = 0.2
        self.levels = np.zeros((3, points), dtype=dtype)
        self.init = rng.standard_normal((2, points)).astype(dtype) * 0.5
        self.trace = Trace()
        self.reset()

    @property
    def size(self) -> int:
        return 2 * self.levels.shape[1]

    @property
    def dtype(self) -> np.dtype:
        return self.levels.dtype

    def get_data(self, t: int) -> list[np.ndarray]:
        return [self.levels[t % 3], self.levels[(t - 1) % 3]]

    def get_data_location(self, t: int) -> list[np.ndarray]:
        return self.get_data(t)

    def reset(self) -> None:
        self.levels[...] = 0
        self.levels[0] = self.init[0]       # u^0
        self.levels[2] = self.init[1]       # u^{-1}
        self.reset_adjoint()

    def reset_adjoint(self) -> None:
        self.adj_cur = np.ones(self.levels.shape[1], dtype=self.levels.dtype)   # for u^{t+1}
        self.adj_prev = np.zeros(self.levels.shape[1], dtype=self.levels.dtype)  # for u^t
        self.grad_k = self.levels.dtype.type(0)

    def _lap(self, u: np.ndarray) -> np.ndarray:
        return np.roll(u, 1) - 2 * u + np.roll(u, -1)

    def step(self, t: int) -> None:
        cur, prev = self.levels[t % 3], self.levels[(t - 1) % 3]
        self.levels[(t + 1) % 3] = 2 * cur - prev + self.coef * self._lap(cur) - self.k * cur ** 3

    def adjoint(self, t: int) -> None:
        # the live state is u_{t+1} = (u^{t+1}, u^t): u^t sits at index t % 3
        u_t = self.levels[t % 3]
        a = self.adj_cur
        self.grad_k = self.grad_k - np.sum(a * u_t ** 3)
        new_cur = self.adj_prev + 2 * a + self.coef * self._lap(a) - 3 * self.k * u_t ** 2 * a
        self.adj_prev = -a
        self.adj_cur = new_cur

    def gradients(self) -> list[np.ndarray]:
        return [self.adj_cur.copy(), self.adj_prev.copy(), np.array([self.grad_k])]


class Pyramid:
    """A network whose states differ in size: u_{t+1} = tanh(a_t resize(u_t) + b), with widths
    that halve three times (a state shrinking 8x) and grow back, over and over.

    Shrinking averages neighbours, growing repeats them; the live state is the front of one
    buffer of the largest width, so ``get_data(t)`` is a view whose size depends on t.
    """

    #: width exponents: 8x narrower at the bottom of each cycle
    LEVELS = (0, 1, 2, 3, 2, 1)

    def __init__(self, n: int, width: int = 64, seed: int = 2, dtype: type = np.float64) -> None:
        rng = np.random.default_rng(seed)
        self.n = n
        self.width = width
        self.a = (0.5 + rng.random(n)).astype(dtype)
        self.b = (0.1 * rng.standard_normal(width)).astype(dtype)
        self.u0 = rng.standard_normal(width).astype(dtype)
        self.u = self.u0.copy()
        self.trace = Trace()
        self._scratch_step = -1
        self._x = np.zeros(width, dtype)
        self.reset_adjoint()

    def widths(self, t: int) -> int:
        return self.width >> self.LEVELS[t % len(self.LEVELS)]

    @property
    def size(self) -> int:
        return self.width

    @property
    def dtype(self) -> np.dtype:
        return self.u.dtype

    def get_data(self, t: int) -> list[np.ndarray]:
        return [self.u[: self.widths(t)]]

    def get_data_location(self, t: int) -> list[np.ndarray]:
        return [self.u[: self.widths(t)]]

    def reset(self) -> None:
        self.u[...] = self.u0
        self.reset_adjoint()

    def reset_adjoint(self) -> None:
        self.ga = np.zeros_like(self.a)
        self.lam = np.ones(self.widths(self.n), self.u.dtype)

    def _resize(self, x: np.ndarray, width: int) -> np.ndarray:
        if width < x.size:
            return x.reshape(width, -1).mean(axis=1)
        return np.repeat(x, width // x.size)

    def step(self, t: int) -> None:
        w_in, w_out = self.widths(t), self.widths(t + 1)
        self._x[:w_in] = self.u[:w_in]
        y = self._resize(self._x[:w_in], w_out)
        self.u[:w_out] = np.tanh(self.a[t] * y + self.b[:w_out])
        self._scratch_step = t

    def adjoint(self, t: int) -> None:
        if self._scratch_step != t:
            raise ProtocolError(f"reverse of step {t} with scratch of step {self._scratch_step}")
        w_in, w_out = self.widths(t), self.widths(t + 1)
        x = self._x[:w_in]
        y = self._resize(x, w_out)
        d_z = self.lam * (1.0 - self.u[:w_out] ** 2)
        self.ga[t] += d_z @ y
        d_y = d_z * self.a[t]
        if w_out < w_in:  # the adjoint of a mean over groups
            self.lam = np.repeat(d_y, w_in // w_out) / (w_in // w_out)
        else:  # the adjoint of a repeat: sum over the copies
            self.lam = d_y.reshape(w_in, -1).sum(axis=1)
        self._scratch_step = -1

    def gradients(self) -> list[np.ndarray]:
        return [self.ga.copy(), self.lam.copy()]


class Forward:
    """The forward operator of a workload, tracing its calls."""

    def __init__(self, model) -> None:
        self.model = model

    def apply(self, *, t_start: int, t_end: int) -> None:
        self.model.trace.calls.append(("fwd", t_start, t_end))
        for t in range(t_start, t_end):
            self.model.step(t)


class Reverse:
    """The reverse operator of a workload, tracing its calls."""

    def __init__(self, model) -> None:
        self.model = model

    def apply(self, *, t_start: int, t_end: int) -> None:
        if t_end != t_start + 1:
            raise ProtocolError(f"reverse called for steps [{t_start}, {t_end})")
        self.model.trace.calls.append(("rev", t_start))
        self.model.adjoint(t_start)


def forward_reverse(model, driver) -> list[np.ndarray]:
    """One forward and reverse sweep of ``driver`` (a checkpointer or a Revolver) on ``model``
    from u_0, with a fresh trace and adjoint; return the gradients."""
    model.reset()
    model.trace.calls.clear()
    driver.apply_forward()
    model.reset_adjoint()
    driver.apply_reverse()
    return model.gradients()


def store_all_reference(model) -> list[np.ndarray]:
    """The gradients by storing every state: restore u_t, tape step t, reverse step t."""
    model.reset()
    fwd, rev = Forward(model), Reverse(model)
    states = []
    for t in range(model.n):
        states.append([a.copy() for a in model.get_data(t)])
        fwd.apply(t_start=t, t_end=t + 1)
    rev.apply(t_start=model.n - 1, t_end=model.n)
    for t in range(model.n - 2, -1, -1):
        for dst, src in zip(model.get_data_location(t), states[t]):
            dst[...] = src
        fwd.apply(t_start=t, t_end=t + 1)
        rev.apply(t_start=t, t_end=t + 1)
    return model.gradients()
