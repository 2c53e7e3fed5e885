"""Checks of what a caller hands :func:`~asyncckpt.jax.checkpoint_scan`, each failure naming
the leaf or the value and what was expected."""
from __future__ import annotations

import inspect
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

from ..checkpointer import AsyncCheckpointer
from ..compression import Codec, make_codec
from ..errors import InvalidTypeError, InvalidValueError
from ..planning import (DEFAULT_STAGING_BUFFERS, check_int, check_node, codec_threads,
                        engine_buffers, state_bytes)
from ..storage import open_storage, tiers_of
from .wire import shared_dtype

__all__ = ["check_carry", "check_compression", "check_interval", "check_leaves", "check_options",
           "check_returned", "check_storage", "engine_states", "least_budget"]

#: AsyncCheckpointer's arguments that the scan sets itself
_SET_BY_THE_SCAN = ("self", "checkpoint", "fwd_operator", "rev_operator", "n_timesteps",
                    "interval", "taping", "l1_slots")


def _name(path: Any) -> str:
    return jax.tree_util.keystr(path) or "(root)"


def check_leaves(tree: Any, what: str) -> list[Any]:
    """``tree``'s leaves, each an array (``what`` names the tree in the error)."""
    leaves = jax.tree_util.tree_leaves_with_path(tree)
    for path, leaf in leaves:
        if not hasattr(leaf, "shape") or not hasattr(leaf, "dtype"):
            raise InvalidTypeError(f"{what} leaf {_name(path)} is a {type(leaf).__name__}, "
                                   "expected an array")
    return [leaf for _, leaf in leaves]


def check_carry(carry: Any) -> None:
    """The initial carry: at least one array, every leaf floating (it is differentiated)."""
    if not check_leaves(carry, "carry"):
        raise InvalidValueError("carry must hold at least one array")
    for path, leaf in jax.tree_util.tree_leaves_with_path(carry):
        if not jnp.issubdtype(leaf.dtype, jnp.inexact):
            raise InvalidTypeError(f"carry leaf {_name(path)} has dtype {leaf.dtype}; "
                                   "checkpoint_scan differentiates the carry, so its leaves "
                                   "must be floating")


def check_interval(interval: Any) -> None:
    if not (interval == "auto" or (isinstance(interval, int) and not isinstance(interval, bool)
                                   and interval >= 1)):
        raise InvalidValueError(f"interval must be 'auto' or an int >= 1, got {interval!r}")


def check_returned(given: Any, returned: Any) -> None:
    """The carry ``step`` returns must be the one it was given: structure, shapes, dtypes."""
    given_tree: Any = jax.tree_util.tree_structure(given)
    returned_tree: Any = jax.tree_util.tree_structure(returned)
    if given_tree != returned_tree:
        raise InvalidValueError(f"step returned a carry of structure {returned_tree}, it was "
                                f"given {given_tree}")
    pairs = zip(jax.tree_util.tree_leaves_with_path(given), jax.tree_util.tree_leaves(returned))
    for (path, a), b in pairs:
        if a.shape != b.shape or a.dtype != b.dtype:
            raise InvalidValueError(
                f"step returned carry leaf {_name(path)} of shape {tuple(b.shape)} and dtype "
                f"{b.dtype}; it was given {tuple(a.shape)}, {a.dtype}")


def check_options(options: dict[str, Any]) -> None:
    """Options for the scan's checkpointer: :class:`~asyncckpt.AsyncCheckpointer`'s, less those
    the scan sets itself, refused at trace time (not in the callback that would make it)."""
    accepted = sorted(set(inspect.signature(AsyncCheckpointer.__init__).parameters)
                      - set(_SET_BY_THE_SCAN))
    unknown = sorted(set(options) - set(accepted))
    if unknown:
        hint = (" (lax.scan's unroll: segments and chunks are scans of the scan's own)"
                if "unroll" in unknown else "")
        raise InvalidValueError(f"checkpoint_scan got unknown option(s) {unknown}{hint}; it takes "
                                f"lax.scan's step, carry, xs, length and reverse, and "
                                f"AsyncCheckpointer's {accepted}")
    if options.get("l1_node") is not None:
        check_node(options["l1_node"], f"l1_node={options['l1_node']!r}")


def check_storage(storage: Any) -> bool:
    """Level-2 opened once at trace time: a path that cannot be one is refused from the call
    that traces the scan, in asyncckpt's words (the callback that opens a run would have JAX
    wrap the error in its runtime error, under ``jax.jit`` when the compiled function runs).
    Whether every tier keeps its states in RAM (``"dram"``, ``"numa:N"``, a tmpfs directory, a
    backend in process memory): then the budget holds every carry on Level-2, none spills."""
    level2, owned = open_storage(storage)
    try:
        return storage is not None and all(tier.holds_process_memory
                                           for tier in tiers_of(level2))
    finally:
        if owned:
            level2.close()


def check_compression(compression: Any, dtypes: list[Any]) -> Codec | None:
    """``compression=`` checked while tracing, for the carry as the checkpointer keeps it: of
    the leaves' dtype where they share one, else as bytes; the codec it names (None: none)."""
    if compression is None:
        return None
    if isinstance(compression, str) and compression == "auto":
        raise InvalidValueError("compression='auto' lets the model decide per run whether to "
                                "compress; checkpoint_scan sends every segment's first carry to "
                                "Level-2, so name a codec: 'lz4', 'zstd', 'blosc' or a dict such "
                                "as {'codec': 'zfp', 'tolerance': 1e-6}")
    shared = shared_dtype(dtypes)
    if shared is not None:
        return make_codec(compression, shared)
    try:
        return make_codec(compression, np.uint8)
    except (InvalidTypeError, InvalidValueError) as error:
        found = {np.dtype(dtype) for dtype in dtypes}
        make_codec(compression, max(found, key=lambda dtype: dtype.itemsize))
        # a codec the leaves' own dtype would take: refused for the bytes
        raise type(error)(f"the carry's leaves have dtypes {sorted(map(str, found))}, kept as "
                          f"bytes by the checkpointer: {error}") from error


def engine_states(options: dict[str, Any], codec: Codec | None) -> int:
    """The state buffers the scan's checkpointer holds for its transfers under these options:
    its staging and prefetch buffers and, with a ``codec``, what each thread that runs it
    holds (as the checkpointer's own account, :func:`~asyncckpt.planning.engine_buffers`)."""
    staging = check_int("staging_buffers",
                        options.get("staging_buffers", DEFAULT_STAGING_BUFFERS), 1)
    io_threads = check_int("io_threads", options.get("io_threads", 1), 1)
    threads = codec_threads(io_threads, options.get("transfers", "auto"),
                            options.get("on_level2_error", "raise"))
    return engine_buffers(staging, io_threads, codec, threads)


def least_budget(budget: int, carry_bytes: int, engine: int, held: int = 0) -> int:
    """The least of ``budget`` bytes the scan's checkpointer needs: a carry of ``carry_bytes``
    beside its ``engine`` transfer buffers (with fewer it would run Revolve in Level-1, which
    XLA, running the segments, cannot serve), beside the ``held`` bytes the scan itself holds
    (XLA's segment backward and the host's carries in flight); a budget below both is
    refused, as numpy's checkpointer refuses one below a state, so nothing runs beyond it."""
    least = (engine + 1) * state_bytes(carry_bytes)
    if budget < least + held:
        raise InvalidValueError(
            f"memory_budget of {budget} bytes is too small for one carry of {carry_bytes} "
            f"bytes ({state_bytes(carry_bytes)} with its page padding) and the checkpointer's "
            f"{engine} transfer buffers (staging, prefetch and a codec's), beside the {held} "
            "bytes the scan holds for one segment's backward (its residuals, the carries and "
            f"cotangents XLA keeps and the host's carries in flight): it needs {least + held} "
            "bytes at the least")
    return least
