"""What a new user meets first: a stats line that reads at any n, errors shown under the
module that exports them, and annotations their type checker sees."""
from __future__ import annotations

import traceback
from pathlib import Path

import pytest

import asyncckpt
import schedules
from asyncckpt import AsyncCheckpointer, InvalidValueError

from workloads import Forward, RecurrentCell, Reverse, forward_reverse


def test_the_stats_repr_is_one_short_line_at_any_n():
    model = RecurrentCell(5000)
    with AsyncCheckpointer(model, Forward(model), Reverse(model), 5000, l1_slots=4,
                           interval=3) as ckp:
        forward_reverse(model, ckp)
    text = repr(ckp.stats)
    assert len(ckp.stats.interval_starts) > 1000
    assert len(text) < 600 and "\n" not in text
    assert "interval=3" in text and "n_timesteps=5000" in text


def test_errors_are_shown_as_asyncckpts():
    with pytest.raises(InvalidValueError) as caught:
        model = RecurrentCell(4)
        AsyncCheckpointer(model, Forward(model), Reverse(model), -1)
    shown = "".join(traceback.format_exception_only(caught.type, caught.value))
    assert shown.startswith("asyncckpt.errors.InvalidValueError:"), shown
    assert schedules.InvalidValueError is asyncckpt.InvalidValueError


@pytest.mark.parametrize("package", [asyncckpt, schedules])
def test_the_packages_carry_py_typed(package):
    assert (Path(package.__file__).parent / "py.typed").is_file()
