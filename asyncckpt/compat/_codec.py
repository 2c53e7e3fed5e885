"""pyrevolve's ``compression_params`` as asyncckpt's ``compression=``, for the compat
``Revolver``."""
from __future__ import annotations

from typing import Any

import numpy as np

from ..checkpoint import as_dtype
from ..compression import CustomCodec
from ..errors import InvalidValueError
from .compression import CompressedObject

__all__ = ["compression_from_pyrevolve"]


class _PyrevolveCustom(CustomCodec):
    """pyrevolve's custom pair, called as pyrevolve calls it: ``compressor(params, array)``
    returning a :class:`CompressedObject` (or bytes), ``decompressor(params, CompressedObject)``
    returning the array."""

    def __init__(self, compressor: Any, decompressor: Any, params: dict[str, Any],
                 dtype: Any) -> None:
        super().__init__(compressor, decompressor, dtype=dtype)
        self.params = params

    def _compress(self, values: np.ndarray) -> Any:
        packed = self.compressor(self.params, values)
        return getattr(packed, "data", packed)

    def _decompress(self, packed: np.ndarray, count: int) -> Any:
        return self.decompressor(
            self.params, CompressedObject(packed.tobytes(), shape=(count,), dtype=self.dtype))


def compression_from_pyrevolve(params: dict[str, Any] | None, dtype: Any = None) -> Any:
    """asyncckpt's ``compression=`` for pyrevolve's ``compression_params``, for states of
    ``dtype``.

    ``{"scheme": None}`` or None: none. ``"blosc"``: lossless Blosc2 (LZ4 after a byte
    shuffle; ``chunk_size`` is not needed: each state is one frame). ``"zfp"``: zfp with the
    ``tolerance``, ``rate`` or ``precision`` given (pyrevolve's default tolerance 1e-7 where
    none is; ``parallel`` is ignored: the I/O threads run beside the computation). ``"custom"``:
    ``compressor(params, array)`` and ``decompressor(params, CompressedObject)``, called with
    the state as one 1-d array of the checkpoint's dtype, where pyrevolve calls them per array.
    """
    if params is None:
        return None
    if not isinstance(params, dict):
        raise InvalidValueError(f"compression_params must be a dict such as {{'scheme': 'zfp', "
                                f"'tolerance': 1e-6}}, got {params!r}")
    rest = dict(params)
    scheme = rest.pop("scheme", None)
    if scheme is None:
        return None
    if scheme == "blosc":
        return "lz4"
    if scheme == "zfp":
        bounds = {k: rest[k] for k in ("tolerance", "rate", "precision") if k in rest}
        return {"codec": "zfp", **(bounds or {"tolerance": 1e-7})}
    if scheme == "custom":
        compressor = rest.pop("compressor", None)
        decompressor = rest.pop("decompressor", None)
        return _PyrevolveCustom(compressor, decompressor, rest, as_dtype(dtype))
    raise InvalidValueError(f"compression_params scheme must be None, 'blosc', 'zfp' or "
                            f"'custom', got {scheme!r}")
