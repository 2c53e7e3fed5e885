"""A descriptor whose arrays hold another dtype than the one it declares, stored as pyrevolve
stores it: each state cast to the declared dtype (so rounded, where that one is narrower) and
cast back into the live arrays when it is restored."""
from __future__ import annotations

import warnings
from typing import Any

import numpy as np

from ..checkpoint import as_dtype, check_copyable

__all__ = ["DeclaredDtype", "Settling", "declared_dtype"]


def declared_dtype(checkpoint: Any, first: list[Any]) -> "DeclaredDtype | None":
    """``checkpoint`` stored at its declared dtype, where ``first`` (u_0's arrays) holds numpy
    arrays of another (with one warning naming both and what it costs); None where every array
    has the declared dtype, or is not a numpy array (the runtime's checks then speak)."""
    declared = as_dtype(checkpoint.dtype)
    if not isinstance(first, (list, tuple)) or not first:
        return None
    if not all(isinstance(a, np.ndarray) for a in first):
        return None
    for i, array in enumerate(first):  # cast or not, a state's arrays are copied as bytes
        check_copyable(array, f"checkpoint.get_data(0)[{i}]")
    held = sorted({str(a.dtype) for a in first if a.dtype != declared})
    if not held:
        return None
    warnings.warn(
        f"the checkpoint declares dtype {declared} but its arrays hold {', '.join(held)}: "
        f"stored as {declared}, as pyrevolve stores them, so every restored state is rounded "
        f"to {declared} (asyncckpt.AsyncCheckpointer refuses such a descriptor; declare the "
        "arrays' dtype to keep states exact)", UserWarning, stacklevel=4)
    return DeclaredDtype(checkpoint, declared)


class DeclaredDtype:
    """``checkpoint`` with every state cast to ``dtype``: :meth:`get_data` gives cast copies,
    :meth:`get_data_location` arrays of ``dtype`` that :meth:`settle` casts into the live
    arrays (the operators call it first: see :class:`Settling`)."""

    #: no location asked for ahead of a load (see :func:`asyncckpt._execution.link.link_for`)
    locations_checked_in_run = True

    def __init__(self, checkpoint: Any, dtype: np.dtype) -> None:
        self.checkpoint = self.__wrapped__ = checkpoint  # what the taping decision reads
        self.size, self.dtype = checkpoint.size, dtype
        self._restored: list[tuple[np.ndarray, np.ndarray]] = []

    def settle(self) -> None:
        """Cast the states restored since the last call into the live arrays."""
        for staged, live in self._restored:
            np.copyto(live, staged, casting="unsafe")
        self._restored.clear()

    def get_data(self, timestep: int) -> list[np.ndarray]:
        self.settle()
        return [a if a.dtype == self.dtype else a.astype(self.dtype)
                for a in self.checkpoint.get_data(timestep)]

    def get_data_location(self, timestep: int) -> list[np.ndarray]:
        self.settle()
        locations = []
        for i, live in enumerate(self.checkpoint.get_data_location(timestep)):
            check_copyable(live, f"checkpoint.get_data_location({timestep})[{i}]")
            if live.dtype == self.dtype:
                locations.append(live)
            else:
                staged = np.empty(live.shape, self.dtype)
                self._restored.append((staged, live))
                locations.append(staged)
        return locations


class Settling:
    """``operator``, whose calls first settle the states ``declared`` restored."""

    def __init__(self, operator: Any, declared: DeclaredDtype) -> None:
        self.operator, self.declared = operator, declared
        self.__wrapped__ = operator  # what the taping decision reads

    def apply(self, **kwargs: Any) -> Any:
        self.declared.settle()
        return self.operator.apply(**kwargs)
