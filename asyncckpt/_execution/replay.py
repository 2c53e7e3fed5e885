"""Whether the forward steps replay: a state the reverse sweep recomputes is compared with the
checksum the forward sweep took of the same state when it staged it for Level-2.

A forward operator that rebinds an array of the state (``self.b = self.b + x``) instead of
writing into it, keeps state outside the checkpoint, or is not deterministic gives a wrong
adjoint with no other sign: the states the reverse sweep rebuilds are not the ones the forward
sweep went through. Every Level-2 state but the last interval's end is recomputed by the
reverse sweep (the taping call into it, or a lost state's recomputation), and its checksum was
taken where it was staged: comparing the two costs one pass over a state per interval.

Where no stored state is recomputed (a run of one interval, each run's last interval,
Revolve in Level-1 alone) the reverse sweep with taping still recomputes u_{n-1}: the taping
call of step n-2 ends there. So the forward sweep makes its last advance, from u_s to u_n,
two calls, s to n-1 and n-1 to n (the second the taping call of step n-1, as the last call
was), and checksums u_{n-1} between them; the reverse sweep compares its recomputation of
u_{n-1} with it. It costs one more forward call and two passes over one state per run.
"""
from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import xxhash

from ..errors import UsageError

__all__ = ["ReplayCheck"]


class ReplayCheck:
    """Compares states recomputed in the reverse sweep with the forward sweep's checksums.

    Parameters
    ----------
    enabled : bool
        Whether the checksums are of the exact states, taken as :func:`digest` takes them (host
        memory, checked and uncompressed Level-2).
    """

    def __init__(self, enabled: bool) -> None:
        self.enabled = enabled
        #: the digest of the Level-2 state freed last (the reverse sweep recomputes it next)
        self._freed: tuple[int, int] | None = None
        #: states compared so far (all runs)
        self.compared = 0
        #: the step the forward sweep checksums between two calls (None: none) ...
        self.witness_at: int | None = None
        #: ... and its checksum, once taken: (step, digest)
        self._witness: tuple[int, int] | None = None

    def begin(self) -> None:
        """A sweep starts: what an earlier run freed is no longer expected."""
        self._freed = None

    def witnessing(self, step: int | None) -> None:
        """A run begins whose reverse sweep recomputes u_step (None: no state the forward
        sweep passes through between its calls): the forward sweep checksums it."""
        self.witness_at, self._witness = (step if self.enabled else None), None

    def splits(self, begin: int, end: int) -> int | None:
        """The step at which a forward call from ``begin`` to ``end`` is made two, for the
        checksum of the state between them (None: it is not)."""
        at = self.witness_at
        return at if at is not None and begin < at < end else None

    def witness(self, step: int, arrays: Sequence[np.ndarray]) -> None:
        """The forward sweep's u_step (see :meth:`splits`), to compare its recomputation
        with."""
        self._witness = step, digest(arrays)

    def freeing(self, step: int, digest: int | None) -> None:
        """u_step leaves Level-2 with the checksum ``digest`` it was staged with (None: none)."""
        self._freed = None if digest is None or not self.enabled else (step, digest)

    def expected(self, step: int, held: int | None) -> int | None:
        """The forward sweep's checksum of u_step: of the state freed last, else ``held``,
        else the one :meth:`witness` took."""
        if self._freed is not None and self._freed[0] == step:
            return self._freed[1]
        if held is None and self._witness is not None and self._witness[0] == step:
            return self._witness[1]
        return held

    def check(self, arrays: Sequence[np.ndarray], begin: int, end: int,
              expected: int | None) -> None:
        """Compare ``arrays`` (u_end, recomputed from u_begin) with the forward sweep's checksum.

        Raises
        ------
        UsageError
            If they differ: the forward steps do not replay.
        """
        if not self.enabled or expected is None:
            return
        self.compared += 1
        if digest(arrays) == expected:
            return
        steps = f"step {begin}" if end == begin + 1 else f"steps {begin} to {end - 1}"
        raise UsageError(
            f"the forward operator's {steps}, run again in the reverse sweep from the stored "
            f"u_{begin}, gave a u_{end} that differs from the one the forward sweep stored: the "
            "forward steps do not replay, and the adjoint would be wrong. Update every array of "
            "the checkpoint in place (u[:] = ..., np.add(a, b, out=u)), never by binding a name "
            "to a new array; keep every value the steps read and change in the checkpoint; "
            "make the steps deterministic")


def digest(arrays: Sequence[np.ndarray]) -> int:
    """The checksum of a state's arrays, one after another: that of the staging buffer they
    are copied into (xxh3, as the host link's)."""
    if len(arrays) == 1:
        array = arrays[0]
        if isinstance(array, np.ndarray) and array.flags.c_contiguous:
            return xxhash.xxh3_64_intdigest(array.data)  # its bytes as they are: no view made
    hasher = xxhash.xxh3_64()
    for array in arrays:
        hasher.update(np.ascontiguousarray(array).view(np.uint8).reshape(-1).data)
    return hasher.intdigest()
