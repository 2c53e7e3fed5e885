"""What a Devito reverse operator reads of the fields a checkpoint holds, from its compiled
expressions: the taping-free protocol is exact where every read of a checkpointed field falls on
a time level the restored state holds, and the reverse writes none of them.

Fields are matched by the memory the operators are bound to (a wavesolver's adjoint may name a
field of its own as the forward names a checkpointed one), time levels by the buffer rows the
checkpoint's own ``get_data`` hands out. Imports devito (only called for Devito's operators).
"""
from __future__ import annotations

import ctypes
from collections import defaultdict
from typing import Any

from .reverse_protocol import Protocol

__all__ = ["devito_protocol"]


def devito_protocol(checkpoint: Any, fwd_operator: Any, rev_operator: Any) -> Protocol:
    """Taping-free where the reverse provably reads only what the restored state holds; taped,
    with the reason, otherwise (and where anything cannot be read)."""
    try:
        return _decide(checkpoint, fwd_operator, rev_operator)
    except Exception as exc:  # an operator this reading does not understand stays taped
        return Protocol(True, f"the Devito operators could not be read ({exc!r:.120})")


def _decide(checkpoint: Any, fwd_operator: Any, rev_operator: Any) -> Protocol:
    held = {pointer(f): f for f in checkpoint.objects}
    fwd_bound = bound(fwd_operator)
    fwd_writes = [e for e in expressions(fwd_operator.op) if e.write is not None]
    written = {fwd_bound.get(e.write.name) for e in fwd_writes}
    rev_bound = bound(rev_operator)
    rev_aliases = aliases(rev_operator, checkpoint.objects)
    reads: dict[str, set[int]] = defaultdict(set)
    for expression in expressions(rev_operator.op):
        target = expression.write
        if target is not None and rev_bound.get(target.name) in held:
            return Protocol(True, f"the reverse writes {target.name}, which the checkpoint holds")
        for name in {target.name if target is not None else None,
                     *(a.function.name for a in retrieve(expression.expr.rhs))} & rev_aliases:
            return Protocol(True, f"the reverse reaches {name}, whose memory is part of a field "
                                  "the checkpoint holds")
        for access in _accesses(expression.expr.rhs):
            address = rev_bound.get(access.function.name)
            if address in held:
                reads[held[address].name].add(time_offset(access))
            elif address in written and address is not None:
                return Protocol(True, f"the reverse reads {access.function.name}, which the "
                                      "forward writes and the checkpoint does not hold")
    step = rev_operator.start_offset
    described, missing = [], []
    for field in checkpoint.objects:
        address = pointer(field)
        writes = [fwd_operator.start_offset + time_offset(e.expr.lhs) - step
                  for e in fwd_writes if fwd_bound.get(e.write.name) == address]
        levels = _held_levels(checkpoint, field, step, min(writes) if writes else None)
        offsets = sorted(reads.get(field.name, ()))
        missing += [f"{field.name}{_at(k)}" for k in offsets if k not in levels]
        described.append((field.name, offsets, levels))
    read = ", ".join(f"{name}{_at(k)}" for name, offsets, _ in described for k in offsets)
    holds = ", ".join(f"{name}{_at(k)}" for name, _, levels in described for k in sorted(levels))
    if missing:
        return Protocol(True, f"the reverse reads {', '.join(missing)}, which the checkpoint of "
                              f"u_t does not hold (it holds {holds}): taped")
    return Protocol(False, f"the reverse reads {read or 'none of its fields'}; the checkpoint "
                           f"holds {holds}")


def expressions(op: Any) -> list[Any]:
    """Every expression of ``op`` and of the functions it calls."""
    from devito.ir.iet import Expression, FindNodes

    roots = [op, *(getattr(f, "root", f) for f in getattr(op, "_func_table", {}).values())]
    return [e for root in roots for e in FindNodes(Expression).visit(root)]


def retrieve(expr: Any) -> list[Any]:
    """Every indexed access of ``expr``."""
    from devito.symbolics import retrieve_indexed

    return list(retrieve_indexed(expr))


def _accesses(expr: Any) -> list[Any]:
    return [a for a in retrieve(expr) if getattr(a.function, "is_TimeFunction", False)]


def aliases(operator: Any, fields: Any) -> set[str]:
    """The names of the operator's arguments bound to memory that overlaps one of ``fields``
    without being it (a ``Function`` made on a row of a ``TimeFunction``'s buffer)."""
    spans = {pointer(f): pointer(f) + f._data_allocated.nbytes for f in fields}
    starts = bound(operator)
    out = set()
    for parameter in operator.op.parameters:
        start = starts.get(parameter.name)
        if start is None or start in spans:
            continue
        data = getattr(parameter, "_data_allocated", None)
        end = start + max(int(getattr(data, "nbytes", 0)), 1)
        if any(start < held_end and held_start < end for held_start, held_end in spans.items()):
            out.add(parameter.name)
    return out


def bound(operator: Any) -> dict[str, int]:
    """The data address each of the operator's fields is bound to in its cached arguments."""
    out: dict[str, int] = {}
    for name, value in operator.args.items():
        struct = getattr(value, "_obj", None)  # a field's dataobj; scalars and others have none
        if struct is not None and "data" in dict(getattr(type(struct), "_fields_", ())):
            address = ctypes.cast(struct.data, ctypes.c_void_p).value
            if address is not None:  # a field with no data yet is bound to nothing
                out[name] = address
    return out


def pointer(field: Any) -> int:
    return int(field._data.ctypes.data)


def time_offset(access: Any) -> int:
    """k of a read of f[time + k] (a buffered field's modulo dimension, or time itself)."""
    index = access.indices[0]
    origin = getattr(index, "origin", index)
    parent = getattr(index, "parent", None)
    symbols = list(origin.free_symbols)
    base = parent if parent is not None and parent in symbols else symbols[0]
    k = origin - base
    if not k.is_Integer:
        raise ValueError(f"time index {index} of {access.function.name}")
    return int(k)


def _held_levels(checkpoint: Any, field: Any, step: int, fresh: int | None) -> set[int]:
    """The time levels of ``field``, relative to the reverse's time index, that the
    checkpoint's ``get_data(t)`` holds (the same for every t).

    ``fresh``: the first level, relative to the same index, that the forward's next step
    writes. When u_t is stored every row holds the latest level below it that maps to the
    row, so a row handed out as level ``fresh`` or above (Devito's checkpoint of a field of
    time order 3 hands out the row its next step writes) holds the level ``rows`` below.
    """
    data = field._data
    rows = data.shape[0]
    found: set[int] | None = None
    for t in range(min(rows, 8)):  # every residue of a buffer; a few steps of a full history
        rows_held = {(int(a.ctypes.data) - int(data.ctypes.data)) // data.strides[0]
                     for a in checkpoint.get_data(t)
                     if 0 <= int(a.ctypes.data) - int(data.ctypes.data) < data.nbytes}
        relative = {nearest((row - (t + step)) % rows, rows) if fresh is None
                    else fresh - rows + (row - (t + step) - fresh) % rows
                    for row in rows_held}
        found = relative if found is None else found & relative
    return found or set()


def nearest(residue: int, rows: int) -> int:
    """The offset in (-rows/2, rows/2] with that residue: -1 rather than 2 in a buffer of 3."""
    return residue - rows if residue > rows // 2 else residue


def _at(k: int) -> str:
    return "[t]" if k == 0 else f"[t{k:+d}]"
