"""The host side of a checkpointed JAX scan: an :class:`~asyncckpt.AsyncCheckpointer` whose
steps are the scan's segments, driven by the compiled program's host callbacks.

XLA runs the segments; the checkpointer runs on a thread of its own, one sweep at a time. Each
segment's first carry reaches it through ``put`` (copied into the live arrays, then staged and
written on the I/O threads while XLA runs the next segment), and goes back through ``get`` in
reverse order (prefetched while XLA reverses the segment after it). The two sides meet at a
one-carry handoff; a failure on either side is raised on the other at its next wait, so an
error reaches the caller (through the callback that waits) and no thread is left waiting.
"""
from __future__ import annotations

import atexit
import ctypes
import ctypes.util
import itertools
import threading
from collections.abc import Callable, Sequence
from typing import Any

import numpy as np

from ..checkpoint import ArrayCheckpoint
from ..checkpointer import AsyncCheckpointer
from ..errors import CheckpointError
from ..stats import Stats
from .wire import leaf_bytes, shared_dtype

__all__ = ["HostRun", "RUNS", "end_open_runs", "last_plan", "last_stats"]

#: Seconds between two looks at the other side's failure while a handoff waits.
POLL_S = 0.05


#: glibc's ``mallopt`` parameter for the size from which ``malloc`` maps memory of its own.
M_MMAP_THRESHOLD = -3
#: glibc's initial threshold, kept fixed: by default glibc raises it to the size of each mapped
#: block freed, after which carry-sized blocks (the callbacks' arguments, copied by JAX on a
#: thread of its own) come from heaps that keep their pages when freed: scans of 0.5 and 1 MiB
#: carries grew 13.9 and 23.6 MiB under budgets of 8 and 16 MiB, 6.8 and 12.8 with it fixed.
MMAP_THRESHOLD_BYTES = 128 << 10


def _fix_mmap_threshold() -> None:
    try:
        libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6")
        libc.mallopt(M_MMAP_THRESHOLD, MMAP_THRESHOLD_BYTES)
    except (OSError, AttributeError):
        pass  # another C library: its own policy


def stopped(failure: BaseException) -> CheckpointError:
    """The error a side of the scan raises where the other failed with ``failure``."""
    return CheckpointError(f"the checkpointed scan stopped: {failure!r}")


class Handoff:
    """One carry at a time from one thread to another, either side able to fail the other."""

    def __init__(self) -> None:
        self._ready = threading.Condition()
        self._item: Any = None
        self._full = False
        self.failure: BaseException | None = None

    def give(self, item: Any, *, until_taken: bool = False) -> None:
        """Hand ``item`` over; with ``until_taken``, return once the taker is done with it
        (the giver may then reuse what it lent)."""
        with self._ready:
            while self._full and self.failure is None:
                self._ready.wait(POLL_S)
            self._raise_failure()
            self._item, self._full = item, True
            self._ready.notify_all()
            while until_taken and self._full and self.failure is None:
                self._ready.wait(POLL_S)
            if self._full:
                self._raise_failure()

    def take(self, use: Callable[[Any], Any] = lambda item: item) -> Any:
        """``use(item)`` of the item handed over, run before the giver is let go."""
        with self._ready:
            while not self._full and self.failure is None:
                self._ready.wait(POLL_S)
            self._raise_failure()
            result = use(self._item)
            self._item, self._full = None, False
            self._ready.notify_all()
            return result

    def fail(self, failure: BaseException) -> None:
        with self._ready:
            if self.failure is None:
                self.failure = failure
            self._ready.notify_all()

    def _raise_failure(self) -> None:
        if self.failure is not None:
            raise stopped(self.failure) from self.failure


class _Forward:
    """The checkpointer's forward operator: segment s's end carry, as XLA hands it over."""

    #: it copies every carry into the live arrays, and a step may leave a carry as it was (a
    #: fixed point), which the checkpointer's check for rebound arrays would refuse
    updates_in_place = True

    def __init__(self, run: "HostRun") -> None:
        self.run = run

    def apply(self, *, t_start: int, t_end: int) -> None:
        if t_end - t_start != 1:
            # XLA runs the segments, one carry each: a plan that advances several at once (or
            # again, to recompute) would wait for carries that never come
            raise CheckpointError(
                f"the scan's checkpointer planned to advance segments {t_start} to {t_end} in "
                f"one call (Revolve in {self.run.checkpointer.l1_slots} Level-1 slots: its "
                "memory_budget leaves no room for Level-2 beside its transfer buffers); "
                "checkpoint_scan needs every segment's carry stored")
        if t_end < self.run.segments:  # nobody reads the final carry from the live arrays
            self.run.carries.take(self.run.receive)


class _Reverse:
    """The checkpointer's reverse operator: segment s's first carry (restored in the live
    arrays) handed to XLA, which reverses the segment from it."""

    def __init__(self, run: "HostRun") -> None:
        self.run = run

    def apply(self, *, t_start: int, t_end: int) -> None:
        self.run.restored.give([leaf.copy() for leaf in self.run.leaves])


def _live_arrays(shapes: Sequence[tuple[int, ...]],
                 dtypes: Sequence[Any]) -> tuple[list[np.ndarray], list[np.ndarray]]:
    """The checkpointer's live arrays for a carry of these leaves, and the leaves as views of
    them: the leaves themselves where they share a dtype (a codec sees it), else views of one
    byte buffer (a checkpoint's arrays share one dtype)."""
    if shared_dtype(dtypes) is not None:
        live = [np.empty(shape, dtype) for shape, dtype in zip(shapes, dtypes)]
        return live, live
    sizes = [leaf_bytes(shape, dtype) for shape, dtype in zip(shapes, dtypes)]
    buffer = np.empty(sum(sizes), np.uint8)
    ends = np.cumsum(sizes)
    return [buffer], [buffer[end - size:end].view(dtype).reshape(shape)
                      for shape, dtype, size, end in zip(shapes, dtypes, sizes, ends)]


class HostRun:
    """One differentiated call of the scan: its checkpointer, its sweeps' thread and the
    handoffs the callbacks use.

    Parameters
    ----------
    shapes, dtypes
        The carry's leaves.
    segments
        The checkpointer's steps: segment s starts at the carry ``put(s, ...)`` hands over.
    options
        :class:`~asyncckpt.AsyncCheckpointer`'s (``memory_budget``, ``storage``,
        ``compression``, ...).
    """

    def __init__(self, shapes: Sequence[tuple[int, ...]], dtypes: Sequence[Any], segments: int,
                 options: dict[str, Any]) -> None:
        _fix_mmap_threshold()
        self.segments = segments
        #: the checkpointer's arrays, of one dtype: the leaves, or one buffer of their bytes
        #: where their dtypes differ
        self.live, self.leaves = _live_arrays(shapes, dtypes)
        self.carries, self.restored = Handoff(), Handoff()
        self.checkpointer = AsyncCheckpointer(
            ArrayCheckpoint(self.live), _Forward(self), _Reverse(self), segments, interval=1,
            taping=False, **options)
        self._thread: threading.Thread | None = None
        self.failure: BaseException | None = None
        self.stats: Stats | None = None

    def receive(self, carry: Sequence[np.ndarray]) -> None:
        for target, leaf in zip(self.leaves, carry):
            np.copyto(target, leaf)

    def put(self, segment: int, carry: Sequence[np.ndarray]) -> None:
        """Segment ``segment``'s first carry, from the forward sweep's callback (views of the
        callback's argument): copied into the live arrays, the callback returns while the
        checkpointer stages and writes it. No copy of its own: the callback waits for the
        checkpointer to take it, which it does as soon as it has staged the carry before."""
        if segment == 0:
            self.receive(carry)
            self._start(self.checkpointer.apply_forward)
        else:
            self.carries.give(carry, until_taken=True)

    def get(self, segment: int) -> list[np.ndarray]:
        """Segment ``segment``'s first carry, for the reverse sweep's callback (the last
        segment's first: the reverse sweep begins)."""
        if segment == self.segments - 1:
            self._join()
            self._start(self._reverse)
        carry: list[np.ndarray] = self.restored.take()
        if segment == 0:
            self._join()
        return carry

    def _reverse(self) -> None:
        try:
            self.checkpointer.apply_reverse()
            self.stats = self.checkpointer.stats
        finally:
            self.checkpointer.close()

    def _start(self, sweep: Callable[[], None]) -> None:
        def run() -> None:
            try:
                sweep()
            except BaseException as failure:  # noqa: BLE001 - raised on the callbacks' side
                self.failure = failure
                self.carries.fail(failure)
                self.restored.fail(failure)
                self.checkpointer.close()
        self._thread = threading.Thread(target=run, name="asyncckpt-jax-sweep", daemon=True)
        self._thread.start()

    def _join(self) -> None:
        if self._thread is not None:
            self._thread.join()
            self._thread = None
        if self.failure is not None:
            raise stopped(self.failure) from self.failure

    def abort(self, failure: BaseException) -> None:
        """The compiled program failed or was dropped: end the sweep and let go of Level-2."""
        self.carries.fail(failure)
        self.restored.fail(failure)
        if self._thread is not None:
            self._thread.join()
        self.checkpointer.close()


class Runs:
    """The host runs under way, by the id the compiled program carries between callbacks."""

    def __init__(self) -> None:
        self._runs: dict[int, HostRun] = {}
        self._ids = itertools.count(1)
        self._lock = threading.Lock()
        self.last_stats: Stats | None = None
        #: the plan of the last scan traced (a :class:`~asyncckpt.jax.Plan`)
        self.last_plan: Any = None
        #: Level-2's write rate, bytes a second, as the last run that wrote measured it (None:
        #: none has): what the next scan's plan prices a carry's write with
        self.write_bps: float | None = None

    def open(self, make: Callable[[], HostRun]) -> int:
        run = make()
        with self._lock:
            key = next(self._ids)
            self._runs[key] = run
        return key

    def __getitem__(self, key: int) -> HostRun:
        with self._lock:
            run = self._runs.get(int(key))
        if run is None:
            raise CheckpointError(f"checkpoint_scan run {int(key)} is not under way (its "
                                  "backward came twice, or after a failure)")
        return run

    def close(self, key: int) -> None:
        with self._lock:
            run = self._runs.pop(int(key), None)
        if run is not None and run.stats is not None:
            self.last_stats = stats = run.stats
            if stats.l2_writes and stats.write_busy_s > 0:
                self.write_bps = stats.bytes_written / stats.write_busy_s

    def fail(self, key: int, failure: BaseException) -> None:
        with self._lock:
            run = self._runs.pop(int(key), None)
        if run is not None:
            run.abort(failure)

    def abort_all(self) -> None:
        """Every run still under way ends (at exit, or when the caller drops a backward)."""
        with self._lock:
            runs, self._runs = list(self._runs.values()), {}
        for run in runs:
            run.abort(CheckpointError("checkpoint_scan runs were ended"))


#: The process's runs; any still open at exit (a ``jax.vjp`` whose backward never came) end
#: then, their Level-2 files removed.
RUNS = Runs()
atexit.register(RUNS.abort_all)


def last_stats() -> Stats | None:
    """The :class:`~asyncckpt.Stats` of the checkpointer of the last completed backward."""
    return RUNS.last_stats


def last_plan() -> Any:
    """The :class:`~asyncckpt.jax.Plan` of the last ``checkpoint_scan`` traced (None: none
    yet): its interval, segments and the chunks its steps' residuals are recomputed in."""
    return RUNS.last_plan


def end_open_runs() -> None:
    """End every scan's run still open: its thread, its Level-2 files. A run is left open where
    its compiled program stopped between two callbacks without a failure in one of them (a
    Ctrl-C that JAX's callback machinery takes), or its backward never came; they end at exit
    anyway."""
    RUNS.abort_all()
