"""pyrevolve's compression module: ``init_compression(params)`` gives a ``(compressor,
decompressor)`` pair for :class:`~asyncckpt.compat.storage.BytesStorage`; ``compressors`` and
``decompressors`` map each scheme to its functions of ``(params, data)``.

Schemes: None (raw bytes), "blosc" (Blosc2 with LZ4 after a byte shuffle, where pyrevolve uses
the older python-blosc), "zfp" (zfpy, where pyrevolve uses pyzfp: ``tolerance``, ``rate`` or
``precision``) and "custom" (``compressor`` and ``decompressor`` given). ``compressors_available``
lists the schemes whose package is installed. An unknown scheme or a missing package raises a
clear error (pyrevolve prints and asserts).
"""
from __future__ import annotations

import importlib.util
from functools import partial
from typing import Any

import numpy as np

from ..compression import MissingCodecError
from ..errors import InvalidValueError

__all__ = ["CompressedObject", "init_compression", "compressors_available", "compressors",
           "decompressors", "DEFAULTS"]


class CompressedObject:
    """What a compressor returns (``data``, bytes-like, and the array's ``shape`` and ``dtype``)
    and what its decompressor is given back."""

    def __init__(self, data: Any, shape: Any = None, dtype: Any = None,
                 metadata: dict[str, Any] | None = None) -> None:
        if metadata is not None:
            shape, dtype = metadata["shape"], metadata["dtype"]
        self.data, self.shape, self.dtype = data, shape, dtype
        self.metadata = {"shape": shape, "dtype": dtype}


#: Each scheme's default parameters (``parallel`` is accepted and ignored).
DEFAULTS: dict[Any, dict[str, Any]] = {None: {}, "blosc": {}, "zfp": {"tolerance": 1e-7}}
_PACKAGES = {"blosc": "blosc2", "zfp": "zfpy"}

compressors_available: list[Any] = [None] + [
    scheme for scheme, package in _PACKAGES.items() if importlib.util.find_spec(package)]


def _raw_in(params: dict[str, Any], array: np.ndarray) -> CompressedObject:
    array = np.ascontiguousarray(array)
    return CompressedObject(memoryview(array.tobytes()), shape=array.shape, dtype=array.dtype)


def _raw_out(params: dict[str, Any], packed: CompressedObject) -> np.ndarray:
    return np.frombuffer(packed.data, dtype=packed.dtype).reshape(packed.shape)


def _blosc_in(params: dict[str, Any], array: np.ndarray) -> CompressedObject:
    import blosc2
    array = np.ascontiguousarray(array)
    # one thread a call, as asyncckpt's BloscCodec (see its comment)
    data = blosc2.compress2(array, typesize=array.dtype.itemsize, codec=blosc2.Codec.LZ4,
                            filters=[blosc2.Filter.SHUFFLE], nthreads=1)
    return CompressedObject(data, shape=array.shape, dtype=array.dtype)


def _blosc_out(params: dict[str, Any], packed: CompressedObject) -> np.ndarray:
    import blosc2
    raw = blosc2.decompress2(bytes(packed.data), nthreads=1)
    return np.frombuffer(raw, dtype=packed.dtype).reshape(packed.shape)


def _zfp_bounds(params: dict[str, Any]) -> dict[str, Any]:
    return {k: params[k] for k in ("tolerance", "rate", "precision") if k in params}


def _zfp_in(params: dict[str, Any], array: np.ndarray) -> CompressedObject:
    import zfpy
    array = np.ascontiguousarray(array)
    data = zfpy.compress_numpy(array, **_zfp_bounds(params))
    return CompressedObject(data, shape=array.shape, dtype=array.dtype)


def _zfp_out(params: dict[str, Any], packed: CompressedObject) -> np.ndarray:
    import zfpy
    return np.asarray(zfpy.decompress_numpy(bytes(packed.data))).reshape(packed.shape)


compressors = {None: _raw_in, "blosc": _blosc_in, "zfp": _zfp_in}
decompressors = {None: _raw_out, "blosc": _blosc_out, "zfp": _zfp_out}


def init_compression(params: dict[str, Any]) -> tuple[Any, Any]:
    """The ``(compressor, decompressor)`` pair of ``params`` (``{"scheme": ..., ...}``), each
    taking one argument.

    Raises
    ------
    InvalidValueError
        An unknown scheme, or "custom" without callables.
    MissingCodecError
        The scheme's package is not installed (naming what to install).
    """
    if not isinstance(params, dict):
        raise InvalidValueError(f"compression params must be a dict such as {{'scheme': 'zfp'}}, "
                                f"got {params!r}")
    rest = dict(params)
    scheme = rest.pop("scheme", None)
    if scheme == "custom":
        compressor, decompressor = rest.pop("compressor", None), rest.pop("decompressor", None)
        if not callable(compressor) or not callable(decompressor):
            raise InvalidValueError("the 'custom' scheme needs callable 'compressor' and "
                                    f"'decompressor', got {compressor!r} and {decompressor!r}")
    elif scheme in compressors:
        if scheme not in compressors_available:
            raise MissingCodecError(
                f"compression scheme {scheme!r} needs {_PACKAGES[scheme]}: pip install "
                f"'asyncckpt[compression]'")
        compressor, decompressor = compressors[scheme], decompressors[scheme]
        rest = {**DEFAULTS[scheme], **rest}
    else:
        raise InvalidValueError(f"compression scheme must be None, 'blosc', 'zfp' or 'custom', "
                                f"got {scheme!r}")
    return partial(compressor, rest), partial(decompressor, rest)
