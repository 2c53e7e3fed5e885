"""The checkpoint descriptor: which arrays make up a state, and how to copy them in and out."""
from __future__ import annotations

import abc
from collections.abc import Sequence
from typing import Any

import numpy as np

from .devices.standin import StandInArray
from .errors import InvalidTypeError, InvalidValueError

__all__ = ["Checkpoint", "ArrayCheckpoint", "as_dtype", "check_descriptor", "check_arrays",
           "check_copyable"]

_REQUIRED = ("size", "dtype", "get_data", "get_data_location")


class Checkpoint(abc.ABC):
    """Abstract descriptor of a state, compatible with pyrevolve's ``Checkpoint``.

    Subclasses give ``size`` (elements), ``dtype``, ``get_data(t)`` (the live arrays holding
    u_t, copied out of on a store) and ``get_data_location(t)`` (the arrays a stored u_t is copied
    into on a load). ``nbytes`` is derived.
    """

    @property
    @abc.abstractmethod
    def size(self) -> int:
        """Elements in one state."""

    @property
    @abc.abstractmethod
    def dtype(self) -> np.dtype:
        """The element type (numpy-compatible)."""

    @abc.abstractmethod
    def get_data(self, timestep: int) -> Sequence[np.ndarray]:
        """Return the live arrays that hold u_timestep."""

    @abc.abstractmethod
    def get_data_location(self, timestep: int) -> Sequence[np.ndarray]:
        """Return the arrays a stored u_timestep is copied back into."""

    @property
    def nbytes(self) -> int:
        """Bytes in one state: ``size * dtype.itemsize``."""
        return int(self.size) * np.dtype(self.dtype).itemsize


class ArrayCheckpoint(Checkpoint):
    """A state made of a fixed list of arrays, stored and restored in place.

    Parameters
    ----------
    arrays : sequence of arrays
        The live arrays: numpy arrays, or arrays of one dtype on one device (CuPy arrays,
        torch CUDA tensors, the stand-in's). Numpy arrays of different dtypes (a float field
        beside an integer step counter) are stored as their bytes, through views that share
        their memory, so they must be contiguous; the descriptor's dtype is then uint8. They
        are the same for every step; for states whose arrays depend on t (a circular buffer of
        time levels), subclass :class:`Checkpoint` instead.

    Examples
    --------
    A float64 field beside an int64 step counter, stored as their bytes:

    >>> import numpy as np
    >>> from asyncckpt import ArrayCheckpoint
    >>> field, step = np.zeros((100, 100)), np.zeros(1, dtype=np.int64)
    >>> checkpoint = ArrayCheckpoint([field, step])
    >>> checkpoint
    ArrayCheckpoint([(100, 100) float64, (1,) int64])
    >>> checkpoint.nbytes, checkpoint.dtype
    (80008, dtype('uint8'))
    """

    def __init__(self, arrays: Sequence[np.ndarray]) -> None:
        if not isinstance(arrays, (list, tuple)):
            raise InvalidTypeError(
                f"ArrayCheckpoint takes a list of the arrays that make up a state, got a "
                f"{type(arrays).__name__}; for one array write ArrayCheckpoint([array])")
        arrays = list(arrays)
        if not arrays:
            raise InvalidValueError("ArrayCheckpoint needs at least one array, got an empty sequence")
        from .devices import device_of

        for i, array in enumerate(arrays):
            if not isinstance(array, np.ndarray) and device_of([array]) is None:
                raise InvalidTypeError(f"arrays[{i}] must be a numpy.ndarray or a device array, "
                                       f"got {type(array).__name__}")
            check_copyable(array, f"arrays[{i}]")
        dtypes = {as_dtype(a.dtype) for a in arrays}
        self._shown = arrays
        if len(dtypes) > 1:  # stored as their bytes, through views that share their memory
            arrays = [_bytes_of(a, f"arrays[{i}]", dtypes) for i, a in enumerate(arrays)]
        self._arrays = arrays
        self._dtype = as_dtype(arrays[0].dtype)
        self._size = sum(_elements(a) for a in arrays)

    @property
    def arrays(self) -> list[Any]:
        """The live arrays, as given (a state of several dtypes is stored through views of
        their bytes, which :meth:`get_data` gives)."""
        return list(self._shown)

    @property
    def size(self) -> int:
        return self._size

    @property
    def dtype(self) -> np.dtype:
        return self._dtype

    def get_data(self, timestep: int) -> list[np.ndarray]:
        return self._arrays

    def get_data_location(self, timestep: int) -> list[np.ndarray]:
        return self._arrays

    def __repr__(self) -> str:
        shapes = ", ".join(f"{a.shape} {as_dtype(a.dtype)}" for a in self._shown)
        return f"ArrayCheckpoint([{shapes}])"


def _bytes_of(array: Any, name: str, dtypes: set[np.dtype]) -> np.ndarray:
    """A contiguous host array as a flat view of its bytes (a state of several dtypes).

    Raises
    ------
    InvalidTypeError
        A device array, or one whose elements are not contiguous in memory.
    """
    if not isinstance(array, np.ndarray):
        raise InvalidTypeError(
            f"ArrayCheckpoint arrays of different dtypes ({', '.join(sorted(map(str, dtypes)))}) "
            f"are stored as their bytes, which takes numpy arrays: {name} is a "
            f"{type(array).__name__}; give device arrays of one dtype")
    if not (array.flags.c_contiguous or array.flags.f_contiguous):
        raise InvalidTypeError(
            f"ArrayCheckpoint arrays of different dtypes are stored as their bytes, which takes "
            f"contiguous arrays: {name} (shape {array.shape}, strides {array.strides}) is not; "
            "pass np.ascontiguousarray(...) and keep that array as the live one")
    return array.reshape(-1, order="A").view(np.uint8)


def _elements(array: Any) -> int:
    """Elements of an array (torch's ``size`` is a method: its count is ``numel()``)."""
    numel = getattr(array, "numel", None)
    return int(numel()) if callable(numel) else int(array.size)


def check_descriptor(checkpoint: object) -> int:
    """Validate a duck-typed descriptor once and return its ``nbytes``.

    Raises
    ------
    TypeError
        Naming what the descriptor lacks, or a dtype of Python objects.
    ValueError
        If its size is not a positive integer.
    """
    missing = [name for name in _REQUIRED if not hasattr(checkpoint, name)]
    if missing:
        raise InvalidTypeError(
            f"checkpoint {type(checkpoint).__name__} lacks {', '.join(missing)}: a checkpoint "
            "descriptor needs size, dtype, get_data(t) and get_data_location(t)"
        )
    for name in ("get_data", "get_data_location"):
        if not callable(getattr(checkpoint, name)):
            raise InvalidTypeError(f"checkpoint.{name} must be callable")
    size = getattr(checkpoint, "size")
    if isinstance(size, bool) or not isinstance(size, (int, np.integer)) or size <= 0:
        raise InvalidValueError(f"checkpoint.size must be a positive int, got {size!r}")
    dtype = getattr(checkpoint, "dtype")
    try:
        declared = as_dtype(dtype)
    except TypeError as exc:
        raise InvalidTypeError(f"checkpoint.dtype {dtype!r} is not a numpy dtype") from exc
    if declared.hasobject:
        raise InvalidTypeError(f"checkpoint.dtype {declared} {_OBJECTS}")
    return int(size) * declared.itemsize


def as_dtype(dtype: Any) -> np.dtype:
    """``dtype`` as a numpy dtype; a torch dtype (``torch.float32``) by its name."""
    if type(dtype).__module__.startswith("torch"):
        dtype = str(dtype).removeprefix("torch.")
    return np.dtype(dtype)


_OBJECTS = ("holds Python object references, which cannot be copied as bytes: a state's "
            "arrays need a fixed-size dtype (float64, int32, a structured dtype of those)")


def check_copyable(array: Any, where: str) -> None:
    """Raise unless the checkpointer can copy ``array`` (named ``where``) as bytes and write a
    stored state back into it.

    Raises
    ------
    TypeError
        If its dtype holds Python objects (a byte copy would copy references, not values).
    ValueError
        If it is a read-only numpy array (a restored state could not be written into it, and
        an operator updating it in place would fail mid-run).
    """
    dtype = getattr(array, "dtype", None)
    if isinstance(dtype, np.dtype) and dtype.hasobject:
        raise InvalidTypeError(f"{where} has dtype {dtype}, which {_OBJECTS}")
    if isinstance(array, np.ndarray) and not array.flags.writeable:
        raise InvalidValueError(
            f"{where} is read-only (flags.writeable is False): the checkpointer writes stored "
            "states back into a state's arrays and the forward operator updates them in place; "
            "give writable arrays (not a read-only view, np.broadcast_to or a frombuffer of "
            "bytes)")


def check_arrays(arrays: Any, nbytes: int, dtype: np.dtype, where: str, *,
                 exact: bool = True, device: Any = None) -> list[np.ndarray]:
    """Check that ``arrays`` (from get_data or get_data_location) match the descriptor.

    ``exact``: their total size must be the descriptor's; otherwise at most that (states of
    different sizes, the descriptor's being the largest). ``device``: the
    :class:`~asyncckpt.devices.Device` they must live on (None: numpy arrays in host memory).

    Raises
    ------
    TypeError
        If they are not arrays of the descriptor's dtype where the state lives, or hold Python
        objects.
    ValueError
        If their total size differs from the descriptor's (exceeds it, unless ``exact``), or
        one is read-only.
    """
    if isinstance(arrays, np.ndarray) or (device is not None and device.owns(arrays)):
        raise InvalidTypeError(f"{where} must return a list of arrays, got a single array")
    arrays = list(arrays)
    total = 0
    for i, array in enumerate(arrays):
        if device is not None and not device.owns(array):
            raise InvalidTypeError(
                f"{where}[{i}] is a {type(array).__name__} outside {device.name}, where u_0 "
                "lives: every array of a state must be on the same device")
        if device is None and (not isinstance(array, np.ndarray)
                               or isinstance(array, StandInArray)):
            raise InvalidTypeError(f"{where}[{i}] is a {type(array).__name__}, expected "
                                   "numpy.ndarray (u_0 is in host memory)")
        check_copyable(array, f"{where}[{i}]")
        if array.dtype != dtype:
            raise InvalidTypeError(f"{where}[{i}] has dtype {array.dtype}, the checkpoint declares {dtype}")
        total += array.nbytes
    if total > nbytes:
        raise InvalidValueError(
            f"{where} holds {total} bytes, more than the checkpoint declares: {nbytes} "
            f"(size x itemsize of {np.dtype(dtype)}), which must be the largest state's"
        )
    if exact and total != nbytes:
        raise InvalidValueError(
            f"{where} holds {total} bytes, the checkpoint declares {nbytes} "
            f"(size x itemsize of {np.dtype(dtype)})"
        )
    return arrays
