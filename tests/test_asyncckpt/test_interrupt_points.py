"""Ctrl-C between any two lines of a Level-2 write, of a state's free and of the abandoning of
a run: a KeyboardInterrupt raised at each line in turn (where a real SIGINT can land), on a real
disk Level-2 with its I/O threads, and the next run must give the store-all gradient bit for
bit and leave no key behind. The random SIGINTs of ``test_faults`` found these windows one in
hundreds of interrupts; here each line is one case."""
from __future__ import annotations

import dis
import inspect
import sys
import threading
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from types import CodeType, FrameType
from typing import Any

import numpy as np
import pytest

from asyncckpt import AsyncCheckpointer, FileStorage
from asyncckpt._execution.engine import TransferEngine
from asyncckpt._execution.engine_core import EngineCore
from asyncckpt._execution.engine_reads import EngineReads
from asyncckpt._execution.engine_writes import EngineWrites
from workloads import Forward, RecurrentCell, Reverse, store_all_reference

pytestmark = pytest.mark.timeout(60)

N, INTERVAL, SLOTS = 40, 4, 2
KEY = 8  # a state of the forward sweep's third Level-2 write (u_0, u_4, u_8)
#: how long the write of KEY held back waits for a delete of its key (the abandon's)
HOLD_S = 0.25


class HeldPut(FileStorage):
    """A disk Level-2 whose next put of a key it is told to :meth:`hold` waits until a delete
    of the key was tried, at most HOLD_S: an I/O thread's write landing after the abandon's
    delete, as it may on a loaded machine. A later put of the key waits for that one to land."""

    def __init__(self, path: Path) -> None:
        super().__init__(path)
        self.held: int | None = None
        self.deleted, self.landed = threading.Event(), threading.Event()
        self.landed.set()  # no put held back

    def hold(self, key: int) -> None:
        self.held = key
        self.deleted.clear()
        self.landed.clear()

    def put(self, key: int, buf: np.ndarray) -> None:
        if key == self.held:
            self.held = None
            self.deleted.wait(HOLD_S)
            try:
                super().put(key, buf)
            finally:
                self.landed.set()
            return
        if key == KEY:
            self.landed.wait(HOLD_S)
        super().put(key, buf)

    def delete(self, key: int) -> None:
        try:
            super().delete(key)
        finally:
            if key == KEY:
                self.deleted.set()


def lines(function: Callable[..., Any]) -> list[tuple[CodeType, int]]:
    """Every line of ``function`` with code of its own: where an interrupt can land."""
    code = function.__code__
    return [(code, line) for line in sorted({line for _, line in dis.findlinestarts(code)
                                             if line is not None and line > code.co_firstlineno})]


def case_id(case: tuple[CodeType, int]) -> str:
    code, line = case
    return f"{code.co_qualname}+{line - code.co_firstlineno}"


@contextmanager
def interrupt_at(code: CodeType, line: int, key: int | None = None) -> Iterator[list[bool]]:
    """Raise KeyboardInterrupt on this thread the first time ``line`` of ``code`` is about to
    run (in a call whose ``key`` is ``key``, where given); yields [whether it was]."""
    reached = [False]

    def local(frame: FrameType, event: str, arg: object) -> Any:
        if event == "line" and frame.f_lineno == line and not reached[0]:
            reached[0] = True
            sys.settrace(None)
            raise KeyboardInterrupt(f"at {case_id((code, line))}")
        return local

    def calls(frame: FrameType, event: str, arg: object) -> Any:
        if frame.f_code is code and (key is None or frame.f_locals.get("key") == key):
            return local
        return None

    before = sys.gettrace()
    sys.settrace(calls)
    try:
        yield reached
    finally:
        sys.settrace(before)


def run(ckp: AsyncCheckpointer, model: RecurrentCell) -> None:
    model.reset()
    ckp.apply_forward()
    model.reset_adjoint()
    ckp.apply_reverse()


def interrupted(ckp: AsyncCheckpointer, model: RecurrentCell, case: tuple[CodeType, int],
                key: int | None = None) -> bool:
    """One run with an interrupt at ``case``; whether the interrupt came."""
    with interrupt_at(*case, key=key) as reached:
        try:
            run(ckp, model)
        except KeyboardInterrupt:
            assert reached[0]
    return reached[0]


def assert_next_run_exact(ckp: AsyncCheckpointer, model: RecurrentCell,
                          storage: FileStorage) -> None:
    run(ckp, model)
    reference = store_all_reference(RecurrentCell(N))
    assert all(a.tobytes() == b.tobytes() for a, b in zip(model.gradients(), reference))
    ckp.drain()
    assert [key for key in range(N + 1) if key in storage] == []


def checkpointer(model: RecurrentCell, storage: FileStorage) -> AsyncCheckpointer:
    return AsyncCheckpointer(model, Forward(model), Reverse(model), N, l1_slots=SLOTS,
                             interval=INTERVAL, storage=storage)


def interrupt_at_u_key(case, disk_dir: Path, *, held: bool) -> None:
    """After a run, interrupt the next at ``case`` for u_KEY (``held``: its write held back
    until the abandon has tried to delete it), then check the run after it."""
    model, storage = RecurrentCell(N), HeldPut(disk_dir)
    with checkpointer(model, storage) as ckp:
        run(ckp, model)
        if held:
            storage.hold(KEY)
        if not interrupted(ckp, model, case, key=KEY):
            pytest.skip("a line this configuration never runs")
        assert_next_run_exact(ckp, model, storage)


@pytest.mark.parametrize("case", lines(EngineWrites.store) + lines(EngineCore._start),
                         ids=case_id)
def test_ctrl_c_at_each_line_of_a_write_leaves_the_next_run_exact(case, disk_dir: Path):
    interrupt_at_u_key(case, disk_dir, held=True)


@pytest.mark.parametrize("case", lines(EngineReads.free), ids=case_id)
def test_ctrl_c_at_each_line_of_a_free_leaves_the_next_run_exact(case, disk_dir: Path):
    interrupt_at_u_key(case, disk_dir, held=False)


@pytest.mark.parametrize("case", lines(TransferEngine.discard), ids=case_id)
def test_ctrl_c_at_each_line_of_an_abandon_leaves_the_next_run_exact(case, disk_dir: Path):
    model, storage = RecurrentCell(N), HeldPut(disk_dir)
    store = lines(EngineWrites.store)[0]
    with checkpointer(model, storage) as ckp:
        run(ckp, model)
        assert interrupted(ckp, model, store, key=KEY + INTERVAL)  # writes under way
        if not interrupted(ckp, model, case):
            pytest.skip("a line this configuration never runs")
        assert_next_run_exact(ckp, model, storage)


def line_of(function: Callable[..., Any], text: str) -> tuple[CodeType, int]:
    """The line of ``function`` that holds ``text``."""
    source, first = inspect.getsourcelines(function)
    return function.__code__, first + next(i for i, line in enumerate(source) if text in line)


def test_the_cases_reach_the_hand_over_the_delete_and_the_abandon(disk_dir: Path):
    """The cases above skip lines a run never reaches: here the lines each must reach."""
    model, storage = RecurrentCell(N), HeldPut(disk_dir)
    with checkpointer(model, storage) as ckp:
        run(ckp, model)
        assert interrupted(ckp, model, line_of(EngineWrites.store, "self._start("), key=KEY)
        assert interrupted(ckp, model, line_of(TransferEngine.discard, "self._transfers.sweep("))
        assert interrupted(ckp, model, line_of(EngineReads.free, "self._delete(key)"), key=KEY)
        assert_next_run_exact(ckp, model, storage)
