"""The costs ``interval="auto"`` and ``"adaptive"`` price plans with, as a checkpointer shows
them (:attr:`AsyncCheckpointer.costs <asyncckpt.AsyncCheckpointer.costs>`), and the costs the
process remembers between checkpointers (docs/model.md)."""
from __future__ import annotations

from ._tuning.cost_memory import COSTS
from ._tuning.measured import MeasuredCosts

__all__ = ["MeasuredCosts", "forget"]


def forget() -> None:
    """Forget every cost measured in this process: the next "auto" checkpointer probes anew
    instead of starting from what earlier ones of the same operators and state size learned."""
    COSTS.forget()
