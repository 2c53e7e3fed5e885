"""The costs a checkpointer prices plans with, as one frozen value: what
:attr:`AsyncCheckpointer.costs <asyncckpt.AsyncCheckpointer.costs>` shows and a user may set
changed (public as :class:`asyncckpt.MeasuredCosts`; docs/model.md)."""
from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Any

from schedules.model import CodecCosts

__all__ = ["MeasuredCosts"]


@dataclass(frozen=True, slots=True)
class MeasuredCosts:
    """What a checkpointer knows of its costs, in seconds (None: not measured yet).

    ``tf`` is one forward step, ``tcall`` a forward call beyond its steps, ``tb`` a reverse
    step with its taping step, ``tc`` a copy within Level-1, each as runs without Level-2
    transfers beside the compute measured them; the ``_busy`` ones as runs with transfers did
    (None: priced as the quiet ones). ``tw`` and ``tr`` write and read one uncompressed state
    through Level-2, ``tier_costs`` each tier's (tw, tr), fastest first; ``tx`` what each
    transfer takes from the compute beside it; ``fault_s`` the first touch of a fresh state
    buffer; ``codec`` the codec's costs; ``tq`` the runtime's own work on the caller's thread
    per transfer (handing it to the I/O thread and taking it back). ``n_steps`` is the run
    length priced, ``runs`` the runs learned from.

    A frozen value: to ask the model what it would choose with other costs, set a changed copy
    (``ckp.costs = ckp.costs.replace(tw=1e-3)``); the next run is planned with them.
    """

    n_steps: int
    runs: int
    tf: float | None
    tb: float | None
    tcall: float | None
    tc: float | None
    tw: float
    tr: float
    tf_busy: float | None = None
    tb_busy: float | None = None
    tcall_busy: float | None = None
    tc_busy: float | None = None
    tier_costs: tuple[tuple[float, float], ...] | None = None
    tx: float | None = None
    fault_s: float | None = None
    codec: CodecCosts | None = None
    tq: float | None = None

    def replace(self, **changes: Any) -> MeasuredCosts:
        """A copy with ``changes`` (field names and values)."""
        return dataclasses.replace(self, **changes)

    def __repr__(self) -> str:
        def ms(value: float | None) -> str:
            return "-" if value is None else f"{value * 1e3:.3g} ms"
        return (f"MeasuredCosts(n_steps={self.n_steps}, tf={ms(self.tf)}, tb={ms(self.tb)}, "
                f"tw={ms(self.tw)}, tr={ms(self.tr)}, runs={self.runs})")
