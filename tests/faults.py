"""Level-2 backends that inject faults, for the fault and stress tests."""
from __future__ import annotations

import errno
import random
import threading
import time

import numpy as np

from asyncckpt import FileStorage, HostMemoryStorage


class FaultyMixin:
    """Counts puts and gets and injects the fault it was built with.

    fail_put_at / fail_get_at : int or None
        Raise ``error`` on that (1-based) put or get.
    flip_get_at : int or None
        Flip one byte of that get's result.
    short_get_at : int or None
        Leave the second half of that get's buffer unwritten (a short read gone unnoticed).
    bad_keys : set of int
        Every put of these keys fails (a persistent fault, where ``fail_put_at`` is transient).
    delay : (float, float)
        Sleep a random time in that range before every put and get.
    """

    def __init__(self, *args, fail_put_at=None, fail_get_at=None, flip_get_at=None,
                 short_get_at=None, bad_keys=(), delay=(0.0, 0.0), error=None, seed=0,
                 **kwargs) -> None:
        super().__init__(*args, **kwargs)
        self.fail_put_at, self.fail_get_at = fail_put_at, fail_get_at
        self.bad_keys = set(bad_keys)
        self.flip_get_at, self.short_get_at = flip_get_at, short_get_at
        self.delay = delay
        self.error = error or OSError(errno.ENOSPC, "No space left on device")
        self.puts = self.gets = 0
        self.counter_lock = threading.Lock()
        self.rng = random.Random(seed)

    def _pause(self) -> None:
        low, high = self.delay
        if high > 0:
            with self.counter_lock:
                pause = self.rng.uniform(low, high)
            time.sleep(pause)

    def put(self, key: int, buf: np.ndarray) -> None:
        with self.counter_lock:
            self.puts += 1
            count = self.puts
        self._pause()
        if count == self.fail_put_at or key in self.bad_keys:
            raise self.error
        super().put(key, buf)

    def get(self, key: int, out: np.ndarray) -> None:
        with self.counter_lock:
            self.gets += 1
            count = self.gets
        self._pause()
        if count == self.fail_get_at:
            raise OSError(errno.EIO, "Input/output error")
        if count == self.short_get_at:
            half = out.nbytes // 2
            scratch = np.empty_like(out)
            super().get(key, scratch)
            out[:half] = scratch[:half]
            # what the rest holds is undefined: poison it, as pooled buffers may hold this very
            # state from an earlier run
            out[half:] = ~scratch[half:]
            return
        super().get(key, out)
        if count == self.flip_get_at:
            out[out.nbytes // 3] ^= 0x10


class FaultyMemory(FaultyMixin, HostMemoryStorage):
    """DRAM Level-2 with injected faults."""


class FaultyFile(FaultyMixin, FileStorage):
    """File Level-2 with injected faults."""
