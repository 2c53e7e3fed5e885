"""The scan's host callbacks, and their errors told in asyncckpt's words.

JAX reports a host callback's exception as a ``JaxRuntimeError`` whose message is the whole
Python traceback, asyncckpt's sentence on its last line, and refuses ``jax.vmap`` of an ordered
callback in words that name neither asyncckpt nor the way that works. Every callback of the scan
goes through :func:`ordered`, and the sweeps that run them through :func:`told`, so that both
reach the user as asyncckpt's own errors wherever JAX runs the callbacks within the sweep's call
(outside ``jax.jit``; under it, JAX raises its runtime error when the compiled function runs).
"""
from __future__ import annotations

import functools
import threading
import traceback
from collections.abc import Callable
from typing import Any, TypeVar, cast

from jax.experimental import io_callback

from ..errors import UsageError

__all__ = ["VMAP", "ordered", "told"]

F = TypeVar("F", bound=Callable[..., Any])

VMAP = ("checkpoint_scan cannot run under jax.vmap: its carries go to the host's storage "
        "through ordered callbacks, one run at a time, and JAX cannot batch those. Put the "
        "batch in the carry (and xs) as a leading axis, and map over it inside step, such as "
        "step = jax.vmap(one_step); the whole batch is then checkpointed as one state")

#: The exceptions host callbacks raised and no sweep has claimed yet; a callback runs on a
#: thread of JAX's, so they are matched to a sweep's error by their message, not by thread
_failures: list[BaseException] = []
_lock = threading.Lock()


def _recording(fn: Callable[..., Any]) -> Callable[..., Any]:
    @functools.wraps(fn)
    def host(*args: Any) -> Any:
        try:
            return fn(*args)
        except BaseException as failure:
            # the lines stay for the user's traceback; the frames' arrays are let go
            traceback.clear_frames(failure.__traceback__)
            with _lock:
                del _failures[:-7]  # a few, not every failure of a long-lived process
                _failures.append(failure)
            raise
    return host


def _claimed(error: BaseException) -> BaseException | None:
    """The host failure that ``error`` (JAX's runtime error) reports, taken off the list."""
    text = str(error)
    with _lock:
        for failure in reversed(_failures):
            if failure is not error and str(failure) and str(failure) in text:
                _failures.remove(failure)
                return failure
    return None


def ordered(fn: Callable[..., Any], result: Any, *args: Any) -> Any:
    """``io_callback(fn, result, *args, ordered=True)``, refusing ``jax.vmap`` in asyncckpt's
    words.

    Raises
    ------
    UsageError
        Under ``jax.vmap``, saying how to batch instead.
    """
    try:
        return io_callback(_recording(fn), result, *args, ordered=True)
    except ValueError as error:
        if "vmap" not in str(error):
            raise
        raise UsageError(VMAP) from None


def told(sweep: F) -> F:
    """``sweep``, raising a host callback's own exception where JAX's error reports one."""
    @functools.wraps(sweep)
    def run(*args: Any, **kwargs: Any) -> Any:
        try:
            return sweep(*args, **kwargs)
        except Exception as error:
            failure = _claimed(error)
            if failure is None:
                raise
            raise failure.with_traceback(failure.__traceback__) from None
    return cast(F, run)
