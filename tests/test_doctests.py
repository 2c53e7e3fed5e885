"""The examples in the packages' docstrings run, and print what they say they print."""
from __future__ import annotations

import doctest
import importlib
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]


def modules_with_examples() -> list[str]:
    """Every module of the two packages whose source holds a doctest prompt, found without
    importing them (``__main__`` modules run a program when imported, and hold none)."""
    found = []
    for package in ("asyncckpt", "schedules"):
        for path in sorted((ROOT / package).rglob("*.py")):
            if path.name != "__main__.py" and ">>> " in path.read_text():
                parts = path.relative_to(ROOT).with_suffix("").parts
                found.append(".".join(parts[:-1] if parts[-1] == "__init__" else parts))
    return found


def test_the_examples_are_found():
    # a finder that found nothing would pass every module it did not look at
    assert {"asyncckpt", "schedules.validate"} <= set(modules_with_examples())


@pytest.mark.parametrize("name", modules_with_examples())
def test_the_examples_run(name):
    module = importlib.import_module(name)
    tests = [t for t in doctest.DocTestFinder().find(module, name) if t.examples]
    assert tests, f"{name} has a '>>> ' in its source but no docstring example"
    runner = doctest.DocTestRunner(optionflags=doctest.ELLIPSIS | doctest.NORMALIZE_WHITESPACE)
    report: list[str] = []
    for test in tests:
        runner.run(test, out=report.append)
    assert runner.failures == 0, "".join(report)
