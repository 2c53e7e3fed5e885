"""What a run did and what it cost."""
from __future__ import annotations

from dataclasses import asdict, dataclass, field
from typing import Any

__all__ = ["Stats"]


@dataclass
class Stats:
    """Counts and timings of the last forward+reverse run of a checkpointer.

    The fields are what the run counted and measured, each with an entry of its own below
    (``asyncckpt.Stats.forward_steps``); the properties are figures derived from them.
    """

    #: n (where the run stopped, for a run with ``n_timesteps=None``).
    n_timesteps: int = 0
    #: I: every I-th state went to Level-2; 0 when the run kept its states in Level-1 alone.
    #: With ``interval="adaptive"``, the least interval (the model's choice), which a Level-2
    #: write still running stretches.
    interval: int = 0
    #: The states that began an interval (those sent to Level-2), in order: the intervals an
    #: adaptive or online run took.
    interval_starts: list[int] = field(default_factory=list)
    #: Level-1 slots for Revolve inside an interval.
    l1_slots: int = 0
    #: The protocol of the reverse calls: with a taping forward step each, or without.
    taping: bool = True
    #: Why: the argument or variable that forced it, the reverse operator's declaration, or what
    #: a Devito reverse operator reads against what the checkpoint holds.
    taping_reason: str = ""
    #: Steps advanced by the forward operator (taping steps and probe steps included).
    forward_steps: int = 0
    #: Steps reversed.
    reverse_steps: int = 0
    #: Calls of the forward operator by the schedule (the probe's not included).
    forward_calls: int = 0
    #: Steps the probe of ``interval="auto"`` ran from u_0 before the schedule began (first run
    #: only).
    probe_steps: int = 0
    #: In-memory copies of a state on the caller's thread (stores and loads of Level-1 slots,
    #: staging copies, loads of prefetched states).
    copies: int = 0
    #: Loads of a state the live arrays already held, which copied nothing: a Devito field is a
    #: ring of time levels, and a forward step from u_t leaves u_t's rows as they were (proven
    #: from the operators; docs/migration.md).
    loads_kept: int = 0
    #: Seconds those ``copies`` took.
    copy_s: float = 0.0
    #: Seconds inside the checkpoint's ``get_data`` and ``get_data_location``, called once per
    #: copy (Devito's descriptor slices its time buffer in Python: tens of microseconds).
    descriptor_s: float = 0.0
    #: Level-2 writes (states sent to Level-2).
    l2_writes: int = 0
    #: Level-2 reads (states read back).
    l2_reads: int = 0
    #: Bytes moved to Level-2.
    bytes_written: int = 0
    #: Bytes moved from Level-2.
    bytes_read: int = 0
    #: Bytes Level-2 stored for the run's writes: ``bytes_written`` after compression.
    l2_stored_bytes: int = 0
    #: Seconds the codec spent compressing on the I/O threads (0 without ``compression``),
    #: checking the stored bytes included.
    compress_s: float = 0.0
    #: Seconds the codec spent decompressing on the I/O threads (0 without ``compression``),
    #: checking the stored bytes included.
    decompress_s: float = 0.0
    #: States the codec compressed (with ``compression="auto"``, a sample of the writes in runs
    #: it does not compress).
    encoded_states: int = 0
    #: States the codec decompressed.
    decoded_states: int = 0
    #: Of ``encoded_states``, the bytes before compression.
    encoded_bytes: int = 0
    #: Of ``encoded_states``, the bytes after compression.
    encoded_stored_bytes: int = 0
    #: Why ``compression="auto"`` runs no codec at all: its buffers leave Level-2 no room in
    #: the memory budget beside the slots and the engine's buffers ("" where it may run).
    compression_declined: str = ""
    #: Seconds the forward sweep waited for a free staging buffer (Level-2 not keeping up).
    write_stall_s: float = 0.0
    #: Seconds the reverse sweep waited for a prefetch to arrive.
    read_stall_s: float = 0.0
    #: Seconds the Level-2 path spent writing (on the I/O thread, or inline): over
    #: ``l2_writes``, the real per-state write time of the run.
    write_busy_s: float = 0.0
    #: Seconds the Level-2 path spent reading (on the I/O thread, or inline): over ``l2_reads``,
    #: the real per-state read time of the run.
    read_busy_s: float = 0.0
    #: Of ``write_busy_s``, the seconds a DRAM Level-2 spent getting buffers (faulting fresh
    #: pages in, where the process's pool had none kept): a cost of the first run, not of a
    #: write.
    write_fresh_s: float = 0.0
    #: State-sized host buffers this run faulted in fresh, where the process's pool had none
    #: kept: Level-1 slots, staging and prefetch buffers, and states of a DRAM Level-2.
    fresh_buffers: int = 0
    #: Seconds those first touches took (on whichever thread made them): what ``"auto"`` learns
    #: the price of fresh memory from.
    fresh_s: float = 0.0
    #: Wall time of ``apply_forward()``.
    forward_s: float = 0.0
    #: Wall time of ``apply_reverse()``.
    reverse_s: float = 0.0
    #: Time spent inside the user's forward operator.
    forward_compute_s: float = 0.0
    #: Time spent inside the user's reverse operator.
    reverse_compute_s: float = 0.0
    #: Most Level-1 slots used at once.
    l1_peak_slots: int = 0
    #: Level-1 bytes the checkpointer allocated (slots, staging and prefetch buffers); fixed
    #: before the run, independent of n. On a device, device memory.
    l1_bytes: int = 0
    #: Where Level-1 is: "host", or the device ("cuda:0", "stand-in").
    device: str = "host"
    #: Device memory the run's buffers held at the end of the sweep (0 on the host).
    device_bytes: int = 0
    #: Most states held on Level-2 at once.
    l2_peak_states: int = 0
    #: Level-2 transfers that failed and were survived (``on_level2_error="recompute"``).
    l2_failures: int = 0
    #: Forward steps spent recomputing lost states (included in ``forward_steps``).
    recovery_steps: int = 0
    #: With a tiered Level-2, per tier (fastest first): ``writes``, ``reads`` and the seconds
    #: spent in them, ``write_s`` and ``read_s`` (less first-touch time), this run.
    l2_tiers: list[dict[str, float]] = field(default_factory=list)
    #: Under MPI, the collective calls this run made (the plan's agreement, agreement points, an
    #: online run's decisions, the end of each sweep); 0 in one process.
    collectives: int = 0
    #: With ``interval="auto"``: the measured costs and the model's prediction; after the
    #: reverse sweep also ``measured_over_predicted`` and ``step_drift``, a forward step's cost
    #: in the run's second half over its first (beyond 1.5 or below 1/1.5 the run taught its
    #: mean step and no contention; None for a run of unknown n), and ``doubted``, whether the
    #: run took more than 1.3 times its prediction and waits for the next to confirm what it
    #: measured (docs/model.md).
    calibration: dict[str, Any] = field(default_factory=dict)

    @property
    def recompute_factor(self) -> float:
        """(forward_steps - n) / n: 1.0 when each step runs once forward and once as a taping step."""
        return (self.forward_steps - self.n_timesteps) / self.n_timesteps if self.n_timesteps else 0.0

    @property
    def mean_interval(self) -> float:
        """n over the number of intervals (0.0 for a run in Level-1 alone)."""
        return self.n_timesteps / len(self.interval_starts) if self.interval_starts else 0.0

    @property
    def compression_ratio(self) -> float:
        """bytes_written / l2_stored_bytes: 1.0 without compression or Level-2 writes."""
        return self.bytes_written / self.l2_stored_bytes if self.l2_stored_bytes else 1.0

    @property
    def total_s(self) -> float:
        """forward_s + reverse_s."""
        return self.forward_s + self.reverse_s

    def __repr__(self) -> str:
        """The run in one line: what ran, its time and its traffic; the per-interval starts, the
        tiers and the calibration are in the fields (and :meth:`as_dict`), whose size grows
        with n."""
        parts = [f"n_timesteps={self.n_timesteps}", f"interval={self.interval}",
                 f"l1_slots={self.l1_slots}", f"taping={self.taping}",
                 f"forward_steps={self.forward_steps}", f"reverse_steps={self.reverse_steps}",
                 f"recompute_factor={self.recompute_factor:.3g}",
                 f"forward_s={self.forward_s:.3g}", f"reverse_s={self.reverse_s:.3g}",
                 f"l2_writes={self.l2_writes}", f"l2_reads={self.l2_reads}",
                 f"bytes_written={self.bytes_written}", f"write_stall_s={self.write_stall_s:.3g}",
                 f"read_stall_s={self.read_stall_s:.3g}", f"l1_peak_slots={self.l1_peak_slots}"]
        if self.device != "host":
            parts.append(f"device={self.device!r}")
        if self.l2_failures:
            parts.append(f"l2_failures={self.l2_failures}")
        return f"Stats({', '.join(parts)})"

    def as_dict(self) -> dict[str, Any]:
        """Every field and derived figure, JSON-ready."""
        out = asdict(self)
        out["recompute_factor"] = self.recompute_factor
        out["total_s"] = self.total_s
        out["mean_interval"] = self.mean_interval
        out["compression_ratio"] = self.compression_ratio
        return out
