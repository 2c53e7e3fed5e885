"""Codecs for Level-2 states: lossless (Blosc2: LZ4 or Zstd after a byte or bit shuffle) and
error-bounded lossy (zfp), or a user's pair of functions; and :func:`make_codec`, which reads
what a user writes as ``compression=``.

A codec runs on the transfer engine's I/O threads, beside the computation, so it should release
the GIL while it works: Blosc2 does once told to (:class:`BloscCodec` tells it);
``benchmarks/bench_codecs.py`` measures how much each codec lets the caller's thread run. No
codec package is imported until a codec that needs it is made.
"""
from __future__ import annotations

import abc
import math
from typing import Any, ClassVar

import numpy as np

from .errors import CheckpointError, InvalidTypeError, InvalidValueError

__all__ = ["Codec", "BloscCodec", "ZfpCodec", "CustomCodec", "MissingCodecError", "make_codec",
           "parse_compression"]


class MissingCodecError(CheckpointError, ImportError):
    """A codec's package is not installed (``pip install 'asyncckpt[compression]'``)."""


def _require(module: str, codec: str) -> Any:
    try:
        return __import__(module)
    except ImportError as exc:
        raise MissingCodecError(
            f"compression codec {codec!r} needs the {module} package, which is not installed: "
            f"pip install 'asyncckpt[compression]' (or pip install {module})") from exc


class Codec(abc.ABC):
    """Turns one state's bytes into fewer bytes and back.

    Subclass it for a codec of your own and pass an instance as ``compression=``. ``encode``
    and ``decode`` run on the I/O threads, several at once for distinct states.
    """

    #: What ``get_config()["codec"]`` names and :func:`make_codec` reads.
    name: ClassVar[str] = ""
    #: Whether ``decode(encode(x))`` gives x bit for bit. A lossy codec's reads are checked
    #: against a checksum of the stored (compressed) bytes instead of the state's.
    #: whether decoding gives back the very bytes encoded
    lossless: bool = True
    #: State buffers of memory that the calls of ``encode`` and ``decode`` allocate on a
    #: thread, which its C heap keeps between calls: the memory account charges them to every
    #: thread that runs the codec. Default 3: a destination to compress into, the bytes object
    #: returned, and the heap's fragments between calls (measured on 2 MiB states: Blosc2 up
    #: to 3.3 states a thread, zfp 2.2; 2 on 16 MiB states).
    work_buffers: ClassVar[int] = 3

    @abc.abstractmethod
    def encode(self, data: np.ndarray) -> Any:
        """The compressed form of ``data`` (a 1-d uint8 array), as a bytes-like object; or None
        where this codec cannot take it (the state is then stored as it is)."""

    @abc.abstractmethod
    def decode(self, packed: np.ndarray, out: np.ndarray) -> None:
        """Fill ``out`` (a writable 1-d uint8 array of the state's size) from ``packed``.

        Raises
        ------
        Exception
            Anything, where ``packed`` is not what ``encode`` made (the caller reports it as
            a :class:`~asyncckpt.CorruptionError`).
        """

    def get_config(self) -> dict[str, Any]:
        """The codec as a plain dict that :func:`make_codec` rebuilds it from."""
        return {"codec": self.name}

    def __repr__(self) -> str:
        params = ", ".join(f"{k}={v!r}" for k, v in self.get_config().items() if k != "codec")
        return f"{type(self).__name__}({params})"


def _fill(out: np.ndarray, values: Any) -> None:
    """Copy a decoded array into ``out`` (uint8), which it must fill exactly."""
    values = np.ascontiguousarray(values)
    if values.nbytes != out.nbytes:
        raise ValueError(f"decoded {values.nbytes} bytes, expected {out.nbytes}")
    np.copyto(out, values.reshape(-1).view(np.uint8))


def _float_dtype(dtype: Any, codec: str) -> np.dtype:
    if dtype is None:
        raise InvalidValueError(f"compression codec {codec!r} compresses floating-point "
                                "states; this checkpoint has no single dtype")
    found = np.dtype(dtype)
    if found not in (np.dtype(np.float32), np.dtype(np.float64)):
        raise InvalidValueError(f"compression codec {codec!r} compresses float32 or float64 "
                                f"states; this checkpoint's dtype is {found}")
    return found


class BloscCodec(Codec):
    """Lossless: Blosc2 with LZ4 or Zstd after a shuffle of the state's element bytes.

    Parameters
    ----------
    cname : {"lz4", "zstd", "lz4hc", "blosclz", "zlib"}
        The compressor (default "lz4": the fastest to decompress).
    clevel : int
        0 to 9 (default 1: the fastest).
    shuffle : {"byte", "bit", None}
        Regroup the bytes (or bits) of the elements before compressing (default "byte").
    typesize : int
        Element size in bytes for the shuffle (default: the checkpoint's dtype's).
    """

    name = "blosc"
    lossless = True
    #: compress2 takes less than 2 GB; larger states are stored as they are
    LIMIT = (1 << 31) - 64
    _CNAMES = ("lz4", "zstd", "lz4hc", "blosclz", "zlib")
    _SHUFFLES = ("byte", "bit", None)

    def __init__(self, cname: str = "lz4", clevel: int = 1, shuffle: str | None = "byte",
                 typesize: int = 4) -> None:
        if cname not in self._CNAMES:
            raise InvalidValueError(f"blosc cname must be one of {', '.join(self._CNAMES)}, "
                                    f"got {cname!r}")
        if isinstance(clevel, bool) or not isinstance(clevel, int) or not 0 <= clevel <= 9:
            raise InvalidValueError(f"blosc clevel must be an int in [0, 9], got {clevel!r}")
        if shuffle not in self._SHUFFLES:
            raise InvalidValueError(f"blosc shuffle must be 'byte', 'bit' or None, got "
                                    f"{shuffle!r}")
        if isinstance(typesize, bool) or not isinstance(typesize, int) or not 1 <= typesize <= 255:
            raise InvalidValueError(f"blosc typesize must be an int in [1, 255], got "
                                    f"{typesize!r}")
        blosc2 = _require("blosc2", "blosc")
        blosc2.set_releasegil(True)  # else every call holds the GIL against the computation
        self.cname, self.clevel, self.shuffle, self.typesize = cname, clevel, shuffle, typesize
        filters = {"byte": blosc2.Filter.SHUFFLE, "bit": blosc2.Filter.BITSHUFFLE,
                   None: blosc2.Filter.NOFILTER}
        self._blosc2 = blosc2
        # One thread a call, never Blosc's own pool: a context of more threads starts its pool
        # on each call and joins it in blosc2_free_ctx with the GIL held, where nothing (a
        # test's timeout, Ctrl-C) can interrupt a join that never returns. The I/O threads
        # run the codec beside the computation already.
        self._cparams = {"codec": blosc2.Codec[cname.upper()], "clevel": clevel,
                         "filters": [filters[shuffle]], "typesize": typesize, "nthreads": 1}

    def encode(self, data: np.ndarray) -> Any:
        if data.nbytes > self.LIMIT or data.nbytes % self.typesize:
            return None
        return self._blosc2.compress2(data, **self._cparams)

    def decode(self, packed: np.ndarray, out: np.ndarray) -> None:
        written = self._blosc2.decompress2(packed, dst=out, nthreads=1)
        if written not in (None, out.nbytes):
            raise ValueError(f"decompressed {written} bytes, expected {out.nbytes}")

    def get_config(self) -> dict[str, Any]:
        return {"codec": self.name, "cname": self.cname, "clevel": self.clevel,
                "shuffle": self.shuffle, "typesize": self.typesize}


class ZfpCodec(Codec):
    """Lossy, error-bounded: zfp on the state as a 1-d float array. Give exactly one of

    Parameters
    ----------
    tolerance : float
        Absolute error bound: every element comes back within ``tolerance`` of what was stored.
    rate : float
        Bits per element (fixed size).
    precision : int
        Bit planes kept (relative precision).
    dtype : numpy dtype
        float32 or float64: the checkpoint's.
    """

    name = "zfp"
    lossless = False

    def __init__(self, *, tolerance: float | None = None, rate: float | None = None,
                 precision: int | None = None, dtype: Any = np.float32) -> None:
        given = {k: v for k, v in (("tolerance", tolerance), ("rate", rate),
                                   ("precision", precision)) if v is not None}
        if len(given) != 1:
            raise InvalidValueError("zfp compression needs exactly one of tolerance, rate or "
                                    f"precision; got {given or 'none'}")
        (mode, value), = given.items()
        if mode == "precision":
            if isinstance(value, bool) or not isinstance(value, int) or not 1 <= value <= 64:
                raise InvalidValueError(f"zfp precision must be an int in [1, 64], got {value!r}")
        elif (isinstance(value, bool) or not isinstance(value, (int, float))
              or not math.isfinite(value) or value <= 0):
            raise InvalidValueError(f"zfp {mode} must be a positive number, got {value!r}")
        self.dtype = _float_dtype(dtype, "zfp")
        self._zfpy = _require("zfpy", "zfp")
        self.mode, self.value = mode, value

    def encode(self, data: np.ndarray) -> Any:
        if data.nbytes % self.dtype.itemsize:
            return None
        return self._zfpy.compress_numpy(data.view(self.dtype), **{self.mode: self.value})

    def decode(self, packed: np.ndarray, out: np.ndarray) -> None:
        _fill(out, self._zfpy.decompress_numpy(packed.tobytes()))

    def get_config(self) -> dict[str, Any]:
        return {"codec": self.name, self.mode: self.value, "dtype": self.dtype.name}


class CustomCodec(Codec):
    """A user's pair: ``compressor(array) -> bytes-like`` and ``decompressor(bytes) -> array``,
    as pyrevolve's ``{'scheme': 'custom', ...}``. The array is the state viewed as ``dtype``;
    taken as lossy (reads are checked against the stored bytes), unless ``lossless``."""

    name = "custom"

    def __init__(self, compressor: Any, decompressor: Any, *, dtype: Any = np.uint8,
                 lossless: bool = False) -> None:
        if not callable(compressor) or not callable(decompressor):
            raise InvalidTypeError("custom compression needs a callable compressor and "
                                   f"decompressor, got {compressor!r} and {decompressor!r}")
        self.compressor, self.decompressor = compressor, decompressor
        self.dtype = np.dtype(np.uint8 if dtype is None else dtype)
        self.lossless = lossless

    def encode(self, data: np.ndarray) -> Any:
        if data.nbytes % self.dtype.itemsize:
            return None
        return self._compress(data.view(self.dtype))

    def decode(self, packed: np.ndarray, out: np.ndarray) -> None:
        _fill(out, self._decompress(packed, out.nbytes // self.dtype.itemsize))

    def _compress(self, values: np.ndarray) -> Any:
        """The user's compressor on the state's ``values``: a bytes-like result."""
        return self.compressor(values)

    def _decompress(self, packed: np.ndarray, count: int) -> Any:
        """The user's decompressor on ``packed``: an array of ``count`` values."""
        return self.decompressor(packed.tobytes())

    def get_config(self) -> dict[str, Any]:
        return {"codec": self.name, "compressor": self.compressor,
                "decompressor": self.decompressor, "lossless": self.lossless}


_SHORTHANDS = {"blosc": {}, "lz4": {"cname": "lz4"}, "zstd": {"cname": "zstd"}}


def make_codec(spec: Any, dtype: Any = None) -> Codec | None:
    """The codec ``spec`` names, for states of ``dtype`` (the checkpoint's).

    Parameters
    ----------
    spec : None, str, dict or Codec
        None: no compression. "blosc", "lz4" or "zstd": lossless Blosc2 with that compressor.
        A dict ``{"codec": "blosc" | "zfp" | "custom", ...}`` with the codec's parameters
        (``{"codec": "zfp", "tolerance": 1e-6}``). A :class:`Codec` instance as it is.

    Raises
    ------
    InvalidValueError
        An unknown codec or a bad parameter, named.
    MissingCodecError
        The codec's package is not installed.
    """
    if spec is None or isinstance(spec, Codec):
        return spec
    if isinstance(spec, str):
        if spec not in _SHORTHANDS and spec != "zfp":
            raise InvalidValueError(f"compression must be None, 'auto', 'blosc', 'lz4', 'zstd', "
                                    f"a dict such as {{'codec': 'zfp', 'tolerance': 1e-6}}, or "
                                    f"a Codec; got {spec!r}")
        if spec == "zfp":
            raise InvalidValueError("compression 'zfp' is lossy and needs its bound: give "
                                    "{'codec': 'zfp', 'tolerance': ...} (or rate or precision)")
        spec = {"codec": "blosc", **_SHORTHANDS[spec]}
    if not isinstance(spec, dict):
        raise InvalidTypeError(f"compression must be None, a str, a dict or a Codec, got "
                               f"{type(spec).__name__}")
    params = dict(spec)
    name = params.pop("codec", None)
    try:
        if name == "blosc":
            if dtype is not None:
                params.setdefault("typesize", np.dtype(dtype).itemsize)
            return BloscCodec(**params)
        if name == "zfp":
            params.setdefault("dtype", dtype)
            return ZfpCodec(**params)
        if name == "custom":
            params.setdefault("dtype", dtype)
            return CustomCodec(**params)
    except InvalidTypeError:
        raise
    except TypeError as exc:  # an unknown parameter
        raise InvalidValueError(f"compression {spec!r}: {exc}") from exc
    raise InvalidValueError(f"compression codec must be 'blosc', 'zfp' or 'custom', got "
                            f"{name!r} in {spec!r}")


def parse_compression(name: str, text: str) -> dict[str, Any] | str:
    """A compression spec written as text (``$ASYNCCKPT_COMPRESSION``, the command line):
    "lz4", "zstd", "blosc", or a codec with parameters, "zfp:tolerance=1e-6",
    "blosc:cname=zstd,clevel=3"."""
    codec, _, rest = text.strip().partition(":")
    if not rest:
        return codec
    params: dict[str, Any] = {"codec": codec}
    for item in rest.split(","):
        key, sep, value = item.partition("=")
        if not sep or not key.strip():
            raise InvalidValueError(f"{name} must be a codec, or codec:key=value,...; got "
                                    f"{text!r}")
        params[key.strip()] = _number(value.strip())
    return params


def _number(text: str) -> Any:
    for kind in (int, float):
        try:
            return kind(text)
        except ValueError:
            pass
    return None if text.lower() == "none" else text
