"""Which states the live arrays still hold: a field kept in a ring of time levels (Devito's
buffered ``TimeFunction``: ``time_order + 1`` rows, row ``L mod R`` holding level L) keeps the
levels of a state after a forward call of a few steps, and a load of that state would copy
into each row the bytes it already holds. The runtime follows a run's actions with it, and
:func:`~schedules.timeline.simulate_times` a schedule's.

The runtime's ring is proven from the operators (:mod:`asyncckpt._planning.devito_ring`),
never assumed; this module only follows the actions. A load is skipped where every row of the state
holds the level a copy would put there, as the schedule's own stores and loads left it, and the
descriptor still hands out those rows for it (:meth:`LiveRing.rows_of`); the rows a forward
call writes vouch for nothing; anything else that touches the arrays (a state recomputed after
a lost read, a sweep's start, where the caller may have written into them) forgets all.
"""
from __future__ import annotations

from dataclasses import dataclass

__all__ = ["RingField", "LiveRing"]


@dataclass(frozen=True)
class RingField:
    """One field of the state as a ring of ``rows`` time levels.

    Attributes
    ----------
    rows : int
        R: level L lives in row ``L mod R``.
    held : tuple of int
        The levels of u_t, as offsets from t: u_t's arrays are the rows ``(t + h) mod R``.
    written : int
        The level a forward step from u_t writes, as an offset from t (the one level of
        u_{t+1} that u_t does not hold).
    base, row_bytes : int
        The address of row 0 and the bytes of a row.
    """

    name: str
    rows: int
    held: tuple[int, ...]
    written: int
    base: int = 0
    row_bytes: int = 0

    @property
    def slack(self) -> int:
        """Forward steps from u_t after which its rows all still hold it."""
        return self.rows - len(self.held)


class LiveRing:
    """The level each row of each field holds, as the run's actions leave them.

    Parameters
    ----------
    fields : sequence of RingField
        Every field of the state.
    """

    def __init__(self, fields: tuple[RingField, ...]) -> None:
        self.fields = fields
        self._levels: list[dict[int, int]] = [{} for _ in fields]

    def __repr__(self) -> str:
        return "LiveRing(" + ", ".join(
            f"{f.name}: {f.rows} rows, u_t = levels {list(f.held)}" for f in self.fields) + ")"

    @property
    def slack(self) -> int:
        """Forward steps from a state after which every field still holds it."""
        return min(f.slack for f in self.fields)

    def holds(self, step: int) -> bool:
        """Whether the live arrays hold u_step in every row a load of it would write."""
        return all(levels.get((step + h) % f.rows) == step + h
                   for f, levels in zip(self.fields, self._levels) for h in f.held)

    def rows_of(self, step: int) -> list[tuple[int, int]]:
        """(address, bytes) of every row u_step's arrays must be, sorted."""
        return sorted((f.base + (step + h) % f.rows * f.row_bytes, f.row_bytes)
                      for f in self.fields for h in f.held)

    def hold(self, step: int) -> None:
        """The arrays hold u_step (it was just loaded or stored, or a call starts from it)."""
        for f, levels in zip(self.fields, self._levels):
            for h in f.held:
                levels[(step + h) % f.rows] = step + h

    def advanced(self, begin: int, end: int) -> None:
        """A forward call took the arrays from u_begin to u_end: the rows it wrote hold levels
        that no copy vouches for (a load only ever finds held what a load or store put)."""
        self.hold(begin)
        for f, levels in zip(self.fields, self._levels):
            for t in range(max(begin, end - f.rows), end):  # earlier writes are overwritten
                levels.pop((t + f.written) % f.rows, None)

    def forget(self) -> None:
        """The arrays were written by something not followed here."""
        for levels in self._levels:
            levels.clear()
