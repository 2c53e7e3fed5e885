"""The LSTM's elementwise kernels, in numba (compiled ``nogil`` so the I/O thread keeps running)
and in plain numpy. Both read and write preallocated arrays only."""
from __future__ import annotations

import numpy as np

__all__ = ["KERNELS"]


def _sigmoid(x: np.ndarray, out: np.ndarray) -> np.ndarray:
    np.negative(x, out=out)
    np.exp(out, out=out)
    out += 1.0
    np.reciprocal(out, out=out)
    return out


def gates_forward_numpy(z: np.ndarray, c: np.ndarray, act: np.ndarray, tc: np.ndarray,
                        h: np.ndarray) -> None:
    """From pre-activations z (B, 4H) and the cell c (B, H, updated in place): gate activations
    act = [i, f, o, g], tanh of the new cell tc, and the new hidden state h."""
    hidden = c.shape[1]
    _sigmoid(z[:, : 3 * hidden], act[:, : 3 * hidden])
    np.tanh(z[:, 3 * hidden:], out=act[:, 3 * hidden:])
    i, f, o, g = (act[:, k * hidden:(k + 1) * hidden] for k in range(4))
    c *= f
    c += i * g
    np.tanh(c, out=tc)
    np.multiply(o, tc, out=h)


def gates_backward_numpy(dh: np.ndarray, dc: np.ndarray, act: np.ndarray, tc: np.ndarray,
                         c_prev: np.ndarray, dz: np.ndarray) -> None:
    """From dh and the incoming dc (updated in place to the cell adjoint of the previous step):
    the pre-activation adjoint dz (B, 4H)."""
    hidden = c_prev.shape[1]
    i, f, o, g = (act[:, k * hidden:(k + 1) * hidden] for k in range(4))
    dc += dh * o * (1.0 - tc * tc)
    dz[:, 0:hidden] = dc * g * i * (1.0 - i)
    dz[:, hidden:2 * hidden] = dc * c_prev * f * (1.0 - f)
    dz[:, 2 * hidden:3 * hidden] = dh * tc * o * (1.0 - o)
    dz[:, 3 * hidden:] = dc * i * (1.0 - g * g)
    dc *= f


def _numba_kernels():
    import numba

    @numba.njit(nogil=True, cache=True)
    def gates_forward(z, c, act, tc, h):  # pragma: no cover - compiled
        batch, hidden = c.shape
        for b in range(batch):
            for j in range(hidden):
                i = 1.0 / (1.0 + np.exp(-z[b, j]))
                f = 1.0 / (1.0 + np.exp(-z[b, hidden + j]))
                o = 1.0 / (1.0 + np.exp(-z[b, 2 * hidden + j]))
                g = np.tanh(z[b, 3 * hidden + j])
                act[b, j] = i
                act[b, hidden + j] = f
                act[b, 2 * hidden + j] = o
                act[b, 3 * hidden + j] = g
                cell = f * c[b, j] + i * g
                c[b, j] = cell
                t = np.tanh(cell)
                tc[b, j] = t
                h[b, j] = o * t

    @numba.njit(nogil=True, cache=True)
    def gates_backward(dh, dc, act, tc, c_prev, dz):  # pragma: no cover - compiled
        batch, hidden = c_prev.shape
        for b in range(batch):
            for j in range(hidden):
                i = act[b, j]
                f = act[b, hidden + j]
                o = act[b, 2 * hidden + j]
                g = act[b, 3 * hidden + j]
                t = tc[b, j]
                d_cell = dc[b, j] + dh[b, j] * o * (1.0 - t * t)
                dz[b, j] = d_cell * g * i * (1.0 - i)
                dz[b, hidden + j] = d_cell * c_prev[b, j] * f * (1.0 - f)
                dz[b, 2 * hidden + j] = dh[b, j] * t * o * (1.0 - o)
                dz[b, 3 * hidden + j] = d_cell * i * (1.0 - g * g)
                dc[b, j] = d_cell * f

    return gates_forward, gates_backward


def load(name: str):
    """Return (gates_forward, gates_backward) for ``name`` in {"numba", "numpy"}."""
    if name == "numpy":
        return gates_forward_numpy, gates_backward_numpy
    if name == "numba":
        return _numba_kernels()
    raise ValueError(f"kernels must be 'numba' or 'numpy', got {name!r}")


KERNELS = ("numba", "numpy")
