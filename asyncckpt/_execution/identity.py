"""What a run directory's run is (a later checkpointer resumes it only where they agree), and
what wrote it."""
from __future__ import annotations

import os
import socket
from typing import Any

import numpy as np

from .._version import __version__
from ..checkpoint import ArrayCheckpoint

__all__ = ["identity_of", "writer"]


def _arrays(descriptor: Any) -> list[Any]:
    """The arrays of ``descriptor`` as its program sees them (an ArrayCheckpoint of several
    dtypes gives views of their bytes to store)."""
    if isinstance(descriptor, ArrayCheckpoint):
        return descriptor.arrays
    return list(descriptor.get_data(0))


def _shapes(descriptor: Any) -> list[list[int]]:
    return [list(np.shape(a)) for a in _arrays(descriptor)]


def _dtypes(descriptor: Any) -> list[str] | None:
    return None if descriptor is None else [str(a.dtype) for a in _arrays(descriptor)]


def identity_of(n: int, checkpoint: Any, nbytes: int, dtype: np.dtype, outputs: Any,
                adjoint: Any) -> dict[str, Any]:
    """What a run directory's run is: a later checkpointer resumes it only where they agree.
    Each array's dtype is part of it: a descriptor's own (an ArrayCheckpoint's uint8 bytes)
    does not tell an int64 field from a float64 one."""
    return {"n_timesteps": n, "nbytes": nbytes, "dtype": str(dtype),
            "shapes": _shapes(checkpoint),
            "outputs": None if outputs is None else _shapes(outputs),
            "adjoint": None if adjoint is None else _shapes(adjoint),
            "dtypes": [_dtypes(checkpoint), _dtypes(outputs), _dtypes(adjoint)]}


def writer() -> str:
    """What writes a run directory: the version, the process and the host."""
    return f"asyncckpt {__version__} (pid {os.getpid()} on {socket.gethostname()})"
