"""What a Level-2 transfer costs the caller's thread: the runtime's own work for it, measured
from every run (:class:`CallerShare`), and the prior of what it takes from the compute beside
it (:data:`PRIOR_TX_COPIES`; docs/model.md)."""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from .costs import RunMean, blend

__all__ = ["CallerShare", "PRIOR_TX_COPIES", "runtime_s"]

#: Until a run with Level-2 transfers has measured what each takes from the compute beside it
#: (``tx``), it is priced as this many in-memory copies of the state: the transfer's own pass
#: over it and its checksum's, on memory bandwidth the compute shares (docs/model.md)
PRIOR_TX_COPIES = 2


def runtime_s(stats: Any) -> float:
    """Seconds of a run's sweeps the caller spent in the runtime's own work: the wall time less
    the operators' calls, the copies, the descriptor's calls, the waits on Level-2 and the
    first touch of fresh memory (never below nothing: fresh pages may fault in on the I/O
    thread)."""
    spent = (stats.forward_compute_s + stats.reverse_compute_s + stats.copy_s
             + stats.descriptor_s + stats.write_stall_s + stats.read_stall_s + stats.fresh_s)
    return max(stats.total_s - spent, 0.0)


@dataclass
class CallerShare:
    """The runtime's own seconds on the caller's thread per operator call, as runs without
    Level-2 transfers measured them (``per_call``, a mean over runs), and per Level-2 transfer
    beyond that (``per_transfer``: handing a write or a prefetch to the I/O thread, its
    bookkeeping, taking the read back; None until a run with transfers is measured), a mean
    over transfers as their other costs are (:func:`~asyncckpt._tuning.costs.blend`).

    No other cost holds it: a run's forward steps, copies and stalls are timed apart from
    it, and a state of 32 KiB (the LSTM experiment's) costs the caller 30 to 40 us a transfer
    beyond its copies, more than its write to DRAM; priced at nothing, interval 1 wrote every
    state where Revolve in the budget's slots recomputed a sweep in less time.
    Until a run without transfers has measured what a call costs, all of a run's own work is
    charged to its transfers: a plan priced too dear runs once (``EXPLORE``) and is corrected,
    one priced too cheap runs on.
    """

    per_call: RunMean = field(default_factory=RunMean)
    per_transfer: float | None = None

    def learn(self, stats: Any, busy: bool) -> None:
        """Take in a run's own work (:func:`runtime_s`); ``busy``: its compute ran beside
        Level-2 transfers on the I/O thread."""
        calls = stats.forward_calls + stats.reverse_steps
        own = runtime_s(stats)
        if not busy:
            if calls:
                self.per_call.add(own / calls)
            return
        transfers = stats.l2_writes + stats.l2_reads
        if transfers:
            beyond = max(own - self.per_call.value * calls, 0.0)
            self.per_transfer = blend(self.per_transfer or 0.0, beyond, transfers)
