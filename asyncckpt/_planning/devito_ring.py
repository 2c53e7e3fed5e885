"""The ring of time levels each field of a Devito checkpoint lives in, proven from the operators'
compiled expressions and the rows the checkpoint's ``get_data`` hands out: which levels u_t's
arrays are, and which one level a forward step writes. With it the runtime skips a load whose
rows still hold the state (:class:`~schedules.live.LiveRing`).

Proven or nothing: a field whose arrays are not whole rows of its buffer, a forward that
writes a held field at any other level, a reverse that writes one, a write to a field whose
memory cannot be told, a run over MPI ranks (halo exchanges write into the rows) or anything
this reading does not understand gives no ring, and every load copies. Imports devito (only
called for Devito's operators).
"""
from __future__ import annotations

from typing import Any

from schedules.live import LiveRing, RingField

from .devito_reads import aliases, bound, expressions, nearest, pointer, retrieve, time_offset
from .taping import is_devito

__all__ = ["live_ring", "devito_ring"]


def live_ring(checkpoint: Any, fwd_operator: Any, rev_operator: Any) -> LiveRing | None:
    """The ring a run follows: a Devito checkpoint's; None for any other descriptor.

    Proven on the objects the run calls: the operators as given, the descriptor through
    wrappers that hand out the very arrays of the one they wrap (``passes_arrays_through``,
    as compat's does), never through one that casts them or an operator that does more."""
    while getattr(type(checkpoint), "passes_arrays_through", False):
        checkpoint = checkpoint.__wrapped__
    if not is_devito(checkpoint, fwd_operator, rev_operator):
        return None
    return devito_ring(checkpoint, fwd_operator, rev_operator)


def devito_ring(checkpoint: Any, fwd_operator: Any, rev_operator: Any) -> LiveRing | None:
    """The ring of every field of ``checkpoint``, where the operators prove it and it leaves
    a state's rows held after a forward step (else None)."""
    try:
        _check_wrappers(fwd_operator, rev_operator)
        _check_arrays(checkpoint)
        read = [_read(op, checkpoint.objects) for op in (fwd_operator, rev_operator)]
        fields = tuple(_field(checkpoint, f, *read) for f in checkpoint.objects)
    except Exception:  # _Unproven, or an operator this reading does not understand
        return None  # every load copies
    ring = LiveRing(fields)
    return ring if fields and ring.slack > 0 else None


class _Unproven(Exception):
    """The ring of a field cannot be proven."""


def _check_wrappers(*operators: Any) -> None:
    """Devito's own ``CheckpointOperator.apply`` and ``_prepare_args``, which call the compiled
    operator alone with the arguments it bound (a subclass's or an instance's could write
    anything)."""
    from devito import CheckpointOperator

    for op in operators:
        if (type(op).apply is not CheckpointOperator.apply
                or type(op)._prepare_args is not CheckpointOperator._prepare_args
                or {"apply", "_prepare_args"} & set(vars(op))):
            raise _Unproven("an operator's apply is not Devito's CheckpointOperator's")


def _check_arrays(checkpoint: Any) -> None:
    """Every array a load writes into is one ``get_data`` hands out, within a field's buffer."""
    buffers = [(int(f._data.ctypes.data), f._data.nbytes) for f in checkpoint.objects]
    for t in range(10):
        stored, restored = checkpoint.get_data(t), checkpoint.get_data_location(t)
        if [int(a.ctypes.data) for a in stored] != [int(a.ctypes.data) for a in restored]:
            raise _Unproven("get_data_location(t) is not get_data(t)")
        for array in stored:
            start = int(array.ctypes.data)
            if not any(base <= start < base + size for base, size in buffers):
                raise _Unproven("an array of the state lies outside the checkpoint's fields")


def _read(operator: Any, fields: Any) -> tuple[Any, dict[str, int], list[Any]]:
    """``operator``, the memory its fields are bound to and its expressions, once none of them
    reaches the checkpoint's ``fields`` under another name."""
    aliased = aliases(operator, fields)
    found = expressions(operator.op)
    for expression in found:
        reached = {a.function.name for a in retrieve(expression.expr.rhs)}
        if expression.write is not None:
            reached.add(expression.write.name)
        if reached & aliased:  # a row written or read under another name
            raise _Unproven(f"{operator} reaches a field's memory under another name")
    return operator, bound(operator), found


def _field(checkpoint: Any, field: Any, *read: tuple[Any, dict[str, int], list[Any]]
           ) -> RingField:
    """The ring of ``field``, from the forward's and then the reverse's :func:`_read`."""
    from devito import configuration

    if configuration["mpi"] or field.grid.distributor.nprocs != 1:
        raise _Unproven("halo exchanges write into the rows")
    data = field._data
    rows, row_bytes = data.shape[0], data.strides[0]
    held = _held(checkpoint, data, rows, row_bytes)
    newer = {h + 1 for h in held} - set(held)
    if len(newer) != 1:
        raise _Unproven(f"u_t+1 adds {len(newer)} levels to u_t")
    written = newer.pop()
    address = pointer(field)
    writes = 0
    for (operator, fields, found), writes_allowed in zip(read, (True, False)):
        for expression in found:
            target = expression.write
            if target is None:
                continue
            if target.name not in fields:  # an operator's own temporary, else unknown memory
                if getattr(target, "is_TimeFunction", False):
                    raise _Unproven(f"{target.name}'s memory is not in the operator's arguments")
                continue
            if fields[target.name] != address:  # another field, of any type
                continue
            if not writes_allowed:
                raise _Unproven(f"the reverse writes {target.name}")
            # the forward's step from u_t runs at time index t + start_offset
            level = operator.start_offset + time_offset(expression.expr.lhs)
            if (level - written) % rows:
                raise _Unproven(f"the forward writes {target.name} at another level")
            writes += 1
    if not writes:  # its rows would keep whatever they had, no level a step adds
        raise _Unproven(f"the forward does not write {field.name}")
    return RingField(field.name, rows, held, written, int(data.ctypes.data), row_bytes)


def _held(checkpoint: Any, data: Any, rows: int, row_bytes: int) -> tuple[int, ...]:
    """The levels of u_t in ``data``'s rows, as offsets from t, the same for every residue of
    t: each array of the field a whole row."""
    base = int(data.ctypes.data)
    found: tuple[int, ...] | None = None
    for t in range(min(rows, 8) + 2):  # every residue, and the first ones again
        offsets = []
        for array in checkpoint.get_data(t):
            start = int(array.ctypes.data) - base
            if not 0 <= start < data.nbytes:
                continue
            if (start % row_bytes or array.nbytes != row_bytes
                    or not array.flags.c_contiguous):
                raise _Unproven("an array of the state is not a whole row of its buffer")
            offsets.append(nearest((start // row_bytes - t) % rows, rows))
        levels = tuple(sorted(offsets))
        if found is None:
            found = levels
        elif levels != found or len(set(levels)) != len(levels):
            raise _Unproven("the state's rows move unlike its step")
    if not found:
        raise _Unproven("the state holds no row of the field")
    return found
