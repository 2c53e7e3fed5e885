"""The reverse protocol a checkpointer's runs use, as a value: taped or taping-free, and why.
Decided in :mod:`~asyncckpt._planning.taping` (from a Devito operator's reads in
:mod:`~asyncckpt._planning.devito_reads`) and carried by the options."""
from __future__ import annotations

from dataclasses import dataclass

__all__ = ["Protocol"]


@dataclass(frozen=True)
class Protocol:
    """The reverse protocol of a checkpointer's runs, and why (``Stats.taping_reason``)."""

    taping: bool
    reason: str
