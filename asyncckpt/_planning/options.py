"""The one place where the runtime's options are checked and parsed: from arguments, from the
command line and from the environment, with errors that name the option, the value and what is
accepted."""
from __future__ import annotations

import inspect
import logging
import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from schedules._args import check_bool, check_int

from .._memory.numa import check_node
from ..checkpoint import check_descriptor
from ..compression import Codec, MissingCodecError, make_codec
from ..errors import InvalidTypeError, InvalidValueError, UsageError
from .environment import Environment
from .reverse_protocol import Protocol
from .values import check_choice, parse_bytes, parse_flag, parse_interval

log = logging.getLogger(__name__)

__all__ = ["MAX_STEPS", "Options", "RunDirOptions", "check_bool", "check_choice", "check_int",
           "check_operator", "check_stop", "parse_bytes", "parse_flag",
           "parse_interval"]

#: The longest run: steps are keys of 64-bit tables (and no run comes near it)
MAX_STEPS = 2**62


def _auto_codec(interval: int | str, dtype: object) -> Codec | None:
    """The codec ``compression="auto"`` weighs (lossless LZ4: the fastest here), or None where
    its package is missing; the model decides per run, so the interval must be the model's."""
    if not isinstance(interval, str):
        raise InvalidValueError(f"compression='auto' lets the model decide per run whether to "
                                f"compress, so it needs interval='auto' or 'adaptive', got "
                                f"interval={interval!r}")
    try:
        return make_codec("lz4", dtype)
    except MissingCodecError:
        log.info("compression='auto': blosc2 is not installed (pip install "
                 "'asyncckpt[compression]'), so states are stored uncompressed")
        return None


def check_seconds(name: str, value: object) -> float:
    """``value`` as a positive, finite number of seconds, or raise naming ``name``."""
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise InvalidTypeError(f"{name} must be a number of seconds, got {value!r}")
    if not 0 < value < float("inf"):
        raise InvalidValueError(f"{name} must be a positive, finite number of seconds, "
                                f"got {value!r}")
    return float(value)


def check_operator(**operators: object) -> None:
    """Raise unless every operator (by its argument's name) has a callable ``apply`` that takes
    the keywords ``t_start`` and ``t_end`` (pyrevolve's operator protocol), so that a wrong
    signature fails here, not at the first call of a run."""
    for name, operator in operators.items():
        apply = getattr(operator, "apply", None)
        if not callable(apply):
            raise InvalidTypeError(f"{name} must have an apply(*, t_start, t_end) method; "
                                   f"got {type(operator).__name__}")
        try:
            signature = inspect.signature(apply)
        except (TypeError, ValueError):  # a builtin or an extension's: nothing to check
            continue
        try:
            signature.bind(t_start=0, t_end=1)
        except TypeError:
            raise InvalidTypeError(
                f"{name}.apply{signature} cannot be called as apply(t_start=..., t_end=...): "
                "the runtime always passes these two keywords") from None


def check_stop(n_timesteps: int | None, stop: object) -> None:
    """Raise unless ``stop`` (of ``apply_forward``) is a callable exactly where n is unknown."""
    if n_timesteps is None and stop is None:
        raise UsageError("n_timesteps=None: apply_forward(stop=callable) must say where the "
                         "forward sweep ends")
    if n_timesteps is not None and stop is not None:
        raise UsageError(f"stop= is for runs of unknown length (n_timesteps=None); this "
                         f"checkpointer runs n_timesteps={n_timesteps} steps")
    if stop is not None and not callable(stop):
        raise InvalidTypeError(f"stop must be callable, got {stop!r}")


def _check_keep_forward(keep_forward: object, run_dir: object) -> bool:
    """``keep_forward`` as a bool; not yet with a run directory."""
    if check_bool("keep_forward", keep_forward) and run_dir is not None:
        raise UsageError("keep_forward=True with run_dir= is not supported yet: a run directory "
                         "commits each reverse sweep's progress as the run's")
    return bool(keep_forward)


@dataclass(frozen=True)
class RunDirOptions:
    """``run_dir=``, ``outputs=``, ``adjoint=`` and ``keep_run_dir=`` (docs/resume.md)."""

    path: Path
    outputs: Any
    adjoint: Any
    keep: bool

    @classmethod
    def parse(cls, run_dir: object, outputs: object, adjoint: object, keep: object, *,
              n: int | None, interval: object, verify: object, codec: object
              ) -> "RunDirOptions | None":
        """The run directory's options (None without ``run_dir``), checked against the
        others: a run that resumes needs a schedule fixed by n, and checksums."""
        if run_dir is None:
            for name, value in (("outputs", outputs), ("adjoint", adjoint)):
                if value is not None:
                    raise UsageError(f"{name}= is committed to a run directory: give run_dir= "
                                     "too")
            return None
        if not isinstance(run_dir, (str, os.PathLike)):
            raise InvalidTypeError(f"run_dir must be a str or os.PathLike, got "
                                   f"{type(run_dir).__name__}")
        if n is None or interval == "adaptive":
            raise UsageError("run_dir= resumes a schedule fixed in advance: it needs "
                             f"n_timesteps and an int or 'auto' interval, got n_timesteps={n}, "
                             f"interval={interval!r}")
        if verify is False or codec is not None:
            raise UsageError("run_dir= commits every state with its checksum: it needs "
                             "verify=True and no compression")
        for name, value in (("outputs", outputs), ("adjoint", adjoint)):
            if value is not None:
                check_descriptor(value)
        return cls(run_dir_path(run_dir), outputs, adjoint, check_bool("keep_run_dir", keep))


def run_dir_path(run_dir: str | os.PathLike[str]) -> Path:
    """``run_dir`` as an absolute path, fixed now: a later ``os.chdir`` of the program moves
    nothing. A ``$`` or a leading ``~`` is refused: Python expands neither in a path, so the
    directory would be named literally so (``/scratch/$JOB_NAME/run``: one directory for every
    job); the caller expands them (``os.path.expandvars``, ``os.path.expanduser``)."""
    text = os.fspath(run_dir)
    if not isinstance(text, str):
        raise InvalidTypeError(f"run_dir must be a str or os.PathLike of str, got {text!r}")
    if "$" in text or text.startswith("~"):
        which = "an environment variable ($)" if "$" in text else "a home directory (~)"
        raise InvalidValueError(
            f"run_dir {text!r} names {which} that Python does not expand in a path: it would "
            "be a directory of that literal name, shared by every job that gives it; expand "
            "it first (os.path.expandvars, os.path.expanduser, or os.environ[...])")
    return Path(os.path.abspath(text))


@dataclass(frozen=True)
class Options:
    """The options of an :class:`~asyncckpt.AsyncCheckpointer`, checked and parsed once (see its
    docstring for each). ``interval`` is an int, "auto" or "adaptive" ("auto" with unknown n
    becomes "adaptive": the model needs n, the adaptive rule does not)."""

    n_timesteps: int | None
    l1_slots: int | None
    interval: int | str
    memory_budget: int | None
    host_memory_budget: int | None
    staging_buffers: int
    io_threads: int
    transfers: str
    verify: bool
    #: the codec of ``compression=`` (None: states are stored as they are)
    codec: Codec | None
    #: whether the model decides per run whether ``codec`` runs (``compression="auto"``)
    compress_auto: bool
    on_level2_error: str
    blas_threads: int | None
    taping: bool
    keep_trace: bool
    #: why the run is taped or taping-free (``Stats.taping_reason``)
    taping_reason: str = ""
    #: seconds past which a transfer the caller waits for is a stall (None: derived)
    transfer_timeout: float | None = None
    #: the NUMA node Level-1's host buffers are bound to (None: unbound; docs/numa.md)
    l1_node: int | None = None
    #: the run directory (``run_dir=``; None: nothing outlives the process), what it commits
    #: besides the states, and whether a finished run's is kept
    run_dir: RunDirOptions | None = None
    #: whether apply_reverse() may run again over one forward sweep (states kept on Level-2)
    keep_forward: bool = False
    #: the ``ASYNCCKPT_*`` variables as the construction read them, which its runs use
    environment: Environment = field(default_factory=Environment.read)

    @property
    def adaptive(self) -> bool:
        return self.interval == "adaptive"

    @property
    def tuned(self) -> bool:
        """Whether the model chooses the plan ("auto" or "adaptive")."""
        return isinstance(self.interval, str)

    @classmethod
    def parse(cls, n_timesteps: object, *, l1_slots: object, interval: object,
              memory_budget: object, host_memory_budget: object, staging_buffers: object,
              io_threads: object, transfers: object, verify: object, compression: object,
              dtype: object, on_level2_error: object, blas_threads: object,
              taping: Protocol, keep_trace: object,
              transfer_timeout: object = None, l1_node: object = None, run_dir: object = None,
              outputs: object = None, adjoint: object = None, keep_run_dir: object = False,
              keep_forward: object = False, environment: Environment | None = None
              ) -> "Options":
        """Check every option, raising an error that names the first bad one; ``dtype`` is the
        states' (for the codec of ``compression``), ``taping`` the protocol decided,
        ``environment`` the variables read for this construction (None: read now)."""
        n = None if n_timesteps is None else check_int("n_timesteps", n_timesteps, 1, MAX_STEPS)
        if l1_slots is None and memory_budget is None:
            raise InvalidValueError("give l1_slots (Level-1 slots), memory_budget (bytes), "
                                    "or both; got neither")
        parsed = parse_interval(interval, n, adaptive=True)
        compress_auto = isinstance(compression, str) and compression == "auto"
        if compress_auto:
            codec = _auto_codec(parsed, dtype)
        else:
            codec = make_codec(compression, dtype)
        return cls(
            n_timesteps=n,
            l1_slots=None if l1_slots is None else check_int("l1_slots", l1_slots, 1),
            interval="adaptive" if n is None and parsed == "auto" else parsed,
            memory_budget=(None if memory_budget is None
                           else parse_bytes("memory_budget", memory_budget)),
            host_memory_budget=(None if host_memory_budget is None
                                else parse_bytes("host_memory_budget", host_memory_budget)),
            staging_buffers=check_int("staging_buffers", staging_buffers, 1),
            io_threads=check_int("io_threads", io_threads, 1),
            transfers=check_choice("transfers", transfers, ("auto", "background", "inline")),
            # a codec's checksum of the bytes it stores guards the states instead: a lossy
            # codec's reads differ from the states written, and a lossless one would have
            # every state hashed twice
            verify=check_bool("verify", verify) and codec is None,
            codec=codec,
            compress_auto=compress_auto and codec is not None,
            on_level2_error=check_choice("on_level2_error", on_level2_error,
                                         ("raise", "recompute")),
            blas_threads=(None if blas_threads is None
                          else check_int("blas_threads", blas_threads, 1, 2**31 - 1)),
            taping=taping.taping, taping_reason=taping.reason,
            keep_trace=check_bool("keep_trace", keep_trace),
            transfer_timeout=None if transfer_timeout is None else check_seconds(
                "transfer_timeout", transfer_timeout),
            l1_node=None if l1_node is None else check_node(l1_node, f"l1_node={l1_node!r}"),
            run_dir=RunDirOptions.parse(run_dir, outputs, adjoint, keep_run_dir, n=n,
                                        interval=parsed, verify=verify, codec=codec),
            keep_forward=_check_keep_forward(keep_forward, run_dir),
            environment=Environment.read() if environment is None else environment,
        )
