"""What one run measured: every part that counts something (the transfer engine, the Level-1
slots, the interpreter, Level-2, the link, the process's memory pool) reset in one call when a
run begins and gathered into its :class:`~asyncckpt.Stats` as each sweep ends."""
from __future__ import annotations

from .engine import TransferEngine
from .interpreter import Interpreter
from .level1 import Level1
from .link import Link
from .._memory.pool import POOL
from .timing import CallFit
from ..stats import Stats
from ..storage import Storage

__all__ = ["RunMeter"]


class RunMeter:
    """The measurements of a checkpointer's runs, one run at a time."""

    def __init__(self, engine: TransferEngine, level1: Level1, interpreter: Interpreter,
                 storage: Storage, link: Link) -> None:
        self.engine, self.level1, self.interpreter = engine, level1, interpreter
        self.storage, self.link = storage, link
        #: the run's forward calls, for the fit of a call's fixed and per-step costs
        self.fit = CallFit()
        self._fresh_base = 0.0
        self._faults_base = (0, 0.0)
        self._codec_base = storage.compression

    def start(self, n_timesteps: int | None = None) -> None:
        """A run begins: zero every count (a run of known n times its halves apart)."""
        self.fit = CallFit(midpoint=None if n_timesteps is None else n_timesteps // 2)
        self.level1.copies, self.level1.copy_s = 0, 0.0
        self.interpreter.descriptor_s = 0.0
        self._fresh_base = self.storage.fresh_s
        self._faults_base = POOL.faults()
        self.engine.counters.reset()
        self._codec_base = self.storage.compression
        if self.storage.tiers is not None:
            self.storage.reset_counters()

    def collect(self, stats: Stats) -> None:
        """Write what the run measured so far into ``stats``."""
        engine = self.engine.counters
        stats.l2_writes, stats.l2_reads = engine.writes, engine.reads
        stats.bytes_written, stats.bytes_read = engine.bytes_written, engine.bytes_read
        stats.write_stall_s, stats.read_stall_s = engine.write_stall_s, engine.read_stall_s
        stats.write_busy_s, stats.read_busy_s = engine.write_busy_s, engine.read_busy_s
        stats.l2_peak_states = engine.peak_held
        stats.l2_failures = engine.failures
        stats.write_fresh_s = self.storage.fresh_s - self._fresh_base
        made, made_s = POOL.faults()
        stats.fresh_buffers = made - self._faults_base[0]
        stats.fresh_s = made_s - self._faults_base[1]
        if self.storage.tiers is not None:
            stats.l2_tiers = self.storage.counters() or []
        codec = self.storage.compression
        if codec is None:
            stats.l2_stored_bytes = engine.bytes_written
        else:
            done = codec - self._codec_base
            stats.l2_stored_bytes = done.stored_bytes
            stats.compress_s, stats.decompress_s = done.compress_s, done.decompress_s
            stats.encoded_states, stats.decoded_states = done.encoded, done.decoded
            stats.encoded_bytes = done.encoded_raw_bytes
            stats.encoded_stored_bytes = done.encoded_stored_bytes
        stats.device_bytes = self.link.device_bytes
        stats.copies = self.level1.copies + engine.copies
        stats.copy_s = self.level1.copy_s + engine.copy_s
        stats.descriptor_s = self.interpreter.descriptor_s
        stats.forward_calls = int(self.fit.calls)
